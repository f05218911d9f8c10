"""The CUDA code paths: bf16 and fp16 (GradScaler) training, torch.compile with and without CUDA
graphs, pinned non-blocking batches, training steps that never wait for the host, attention
(windowed and document-masked too) and the KV caches on the GPU. Skipped without a CUDA GPU (CI has
none); run on a GPU machine by tools/gpu_check.sh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY, train

from model import GPT, GPTConfig
from runs.config import load_config
from sampling.generate import generate
from training.plan import plan_run, run_dataset
from training.run import start_run, train_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _run(data_dir: Path, *overrides: str):
    args = [f"data.dir={data_dir}", *TINY, "train.device=cuda", *overrides]
    request = load_config("shakespeare_char", args)
    return start_run(plan_run(request, run_dataset(request)))


@pytest.mark.parametrize(
    "overrides, precision, scaled",
    [
        ((), "bf16", False),
        (("train.precision=fp16",), "fp16", True),
        (("train.compile=true",), "bf16", False),
        (("train.compile=true", "train.compile_mode=reduce-overhead"), "bf16", False),
    ],
)
def test_training_steps_on_cuda_lower_the_loss(data_dir: Path, overrides, precision, scaled):
    run = _run(data_dir, "optim.lr=3e-3", *overrides)
    assert run.rt.precision == precision and run.scaler.is_enabled() == scaled
    x, y = run.splits["train"].batch(0, 8)
    assert x.is_cuda and y.is_cuda
    losses = []
    for it in range(40):
        loss, _, finite = train_step(run, it)
        assert finite
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.5, losses


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_training_step_never_waits_for_the_host(data_dir: Path, precision):
    """No read-back in a step (the non-finite flag stays on the device, fp16's scaler too): CUDA's
    sync debug mode turns any synchronising call into an error."""
    run = _run(
        data_dir, f"train.precision={precision}", "train.grad_accum=2", "train.compile=false"
    )
    train_step(run, 0)  # first use: allocations, lazy initialisation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [train_step(run, it) for it in range(1, 4)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(bool(finite) for _, _, finite in results)


def test_attention_paths_and_kv_cache_agree_on_cuda():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=64)).cuda().eval()
    idx = torch.randint(0, 50, (2, 16), device="cuda")
    fast, _ = m(idx)  # flash / memory-efficient SDPA kernels
    explicit, weights = m.attention_weights(idx)  # softmax of the masked scores
    torch.testing.assert_close(fast, explicit, rtol=1e-4, atol=1e-4)
    assert all(torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1))) for w in weights)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half, _ = m(idx)
    assert (half.float() - fast).abs().max() < 0.1
    prompt = idx[:1, :5]
    n = 3 * m.config.block_size  # past block_size: the cache slides
    cached = [int(t) for t in generate(m, prompt, n, temperature=0)]
    uncached = [int(t) for t in generate(m, prompt, n, temperature=0, use_cache=False)]
    assert cached == uncached


def test_windowed_and_document_attention_and_the_rolling_cache_on_cuda():
    """model/local_attention.py's blocks through CUDA's SDPA kernels (a mask: the memory-efficient
    one)."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=50,
        block_size=64,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=64,
        window=20,
        pos_emb="rope",
        doc_mask=True,
        doc_token=0,
    )
    m = GPT(cfg).cuda()
    idx = torch.randint(0, 50, (2, 64), device="cuda")
    _, loss = m(idx, idx)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    m.eval()
    explicit, _ = m.attention_weights(idx)
    torch.testing.assert_close(m(idx)[0], explicit, rtol=1e-4, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half, _ = m(idx)
    assert (half.float() - explicit).abs().max() < 0.1
    prompt = idx[:1, :5]
    n = 3 * cfg.block_size  # past block_size: positions go on, 20 cache slots
    cached = [int(t) for t in generate(m, prompt, n, temperature=0)]
    assert cached == [int(t) for t in generate(m, prompt, n, temperature=0, use_cache=False)]


def test_train_py_on_cuda_end_to_end(data_dir: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = train(
        data_dir, out, "train.device=cuda", "train.max_iters=30", "train.eval_interval=30"
    )
    assert "device cuda" in result.stdout + result.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["iter"] == 30 and rows[-1]["val_loss"] < rows[0]["val_loss"]
