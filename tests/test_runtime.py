"""Device and precision choices, and bf16 autocast on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from common.errors import UserError
from model import GPT, GPTConfig
from runs import runtime
from training import plan


def test_cpu_precision_auto_follows_the_measured_crossover(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "cpu_has_bf16_matmul", lambda: True)
    assert runtime.pick_precision("auto", cpu, 64) == "fp32"
    assert runtime.pick_precision("auto", cpu, runtime.CPU_BF16_MIN_WIDTH) == "bf16"
    monkeypatch.setattr(runtime, "cpu_has_bf16_matmul", lambda: False)
    assert runtime.pick_precision("auto", cpu, 768) == "fp32"
    assert runtime.pick_precision("bf16", cpu, 64) == "bf16"  # an explicit choice is kept
    with pytest.raises(UserError, match="fp16 is for GPUs"):
        runtime.pick_precision("fp16", cpu, 64)


def test_an_emulated_avx2_cpu_has_no_bf16_and_its_own_kernel_cache(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 (BENCHMARKS.md's AVX2-only emulation): precision auto is fp32 as on
    a real AVX2 CPU, and Inductor's kernels for it go to a cache of their own (reused natively, they
    crashed: free(): invalid pointer); a cache the user names is kept."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    runtime.cpu_has_bf16_matmul.cache_clear()
    try:
        assert not runtime.cpu_has_bf16_matmul()
    finally:
        runtime.cpu_has_bf16_matmul.cache_clear()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    plan.inductor_cache_per_cpu_kind()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("_avx2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/mine")
    plan.inductor_cache_per_cpu_kind()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/mine"
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    plan.inductor_cache_per_cpu_kind()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_explicit_devices_that_are_missing_are_reported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"train.device=cuda but no CUDA GPU is visible"):
        runtime.pick_device("cuda")
    assert runtime.pick_device("cpu").type == "cpu"


@pytest.mark.parametrize("options", [{}, {"window": 6, "n_kv_head": 2, "pos_emb": "rope"}])
def test_bf16_autocast_on_cpu_matches_fp32_and_keeps_gradients(options):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=64, **options))
    x = torch.randint(0, 50, (4, 32))
    ref, ref_loss = m(x, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, loss = m(x, x)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 0.1 and abs(loss.item() - ref_loss.item()) < 0.02
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


# the default config's training steps in a process of their own: their page faults
FAULTS = """
import os, resource, sys
from runs.config import load_config
from training.plan import plan_run, run_dataset
from training.run import start_run, train_step
request = load_config(None, [f"data.dir={sys.argv[1]}", f"train.out_dir={sys.argv[2]}"])
run = start_run(plan_run(request, run_dataset(request)))
for it in range(5):
    train_step(run, it)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for it in range(5, 25):
    train_step(run, it)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


@pytest.mark.slow  # starts a process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_cpu_step_reuses_the_memory_the_last_one_freed(data_dir: Path, tmp_path: Path):
    """A training step frees and takes again the same large buffers: with glibc's defaults each
    comes back from the system zeroed page by page, 2,400-3,500 faults a step at the default config
    (a tenth of its time on a CPU with bf16; BENCHMARKS.md, which also gives the command that
    compares); runs/runtime.py's keep_freed_memory keeps them."""
    argv = [sys.executable, "-c", FAULTS, str(data_dir), str(tmp_path / "out")]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    assert float(done.stdout.split()[-1]) < 100, done.stdout
