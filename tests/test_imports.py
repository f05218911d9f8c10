"""What each command loads of ours, measured with `python -X importtime`: a plain run reads only
what it uses (Hugging Face, LoRA, the dry run's estimators, Muon, the repeats generator and head
scores are imported where they are used). The limits are issue 38's: a learner reads what a command
loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, train

pytestmark = pytest.mark.slow  # each starts a script or two: 5-20 s

OURS = (
    *("common", "model", "sampling", "data", "runs", "training"),
    *("dry_run", "interp", "hf", "gguf_export"),
)


def loaded(*argv: str, env: dict | None = None) -> tuple[list[str], int, set[str]]:
    """Our modules (package __init__ files count) that `python -X importtime ARGV` imports (in
    `env`, else the tests'); their lines; every module it imports, ours or not."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    every = set()
    for line in result.stderr.splitlines():
        found = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", line)
        if found:
            every.add(found.group(1))
    names = {name for name in every if name.split(".")[0] in OURS}
    lines = 0
    for name in names:
        path = ROOT.joinpath(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        lines += len(path.read_text(encoding="utf-8").splitlines())
    return sorted(names), lines, every


@pytest.fixture(scope="module")
def default_run(data_dir: Path, tmp_path_factory) -> Path:
    """The default config as a user runs it (evals, samples, the exact eval, loss.png), only
    shorter."""
    out = tmp_path_factory.mktemp("imports") / "out"
    config = [
        "train.max_iters=4",
        "train.eval_interval=2",
        "train.eval_iters=1",
        "log.sample_every=2",
    ]
    train(data_dir, out, *config, "log.plot=true", "train.final_eval=true", "log.sample_tokens=4")
    return out


def test_the_default_run_loads_no_extra_and_at_most_29_of_our_modules(
    data_dir: Path, tmp_path: Path
):
    """The core (issue 51): a default run loads no extra (interp, hf, gguf_export: the scripts plug
    them in where a run asks), nor what only some runs need."""
    names, lines, _ = loaded(
        "train.py",
        f"data.dir={data_dir}",
        f"train.out_dir={tmp_path / 'out'}",
        "train.max_iters=2",
        "train.eval_interval=2",
        "train.eval_iters=1",
        # as the default config runs: evals, checkpoints, loss.png, the exact eval at the end; no
        # samples
    )
    # 5,692 lines after issue 51; issue 53 added relu2's two-pass backward (model/gpt.py) and the
    # emulated CPU's own kernel cache; the schema's reader took OmegaConf's conversions (5e3 as an
    # int), whether a run compiles moved from runs/runtime.py to training/plan.py, and a CPU step
    # keeps the memory it frees (runs/runtime.py's keep_freed_memory: a tenth of a bf16 step)
    assert len(names) <= 29 and lines <= 5765, (len(names), lines, names)
    for unused in (
        "interp",
        "hf",
        "gguf_export",
        "model.lora",
        "model.local_attention",
        "training.muon",
        "dry_run.estimate",
        "training.torchrun",
        "data.repeats",
        "data.prepare",
    ):
        assert not any(n == unused or n.startswith(unused + ".") for n in names), unused


def test_plot_loads_at_most_12_of_our_modules(default_run: Path, tmp_path: Path):
    names, _, _ = loaded("plot.py", str(default_run), "--out", str(tmp_path / "loss.png"))
    assert len(names) <= 12, (len(names), names)


def test_sample_loads_at_most_24_of_our_modules_and_4160_lines(default_run: Path, tmp_path: Path):
    """Sampling as a user runs it (no TINYGPT_COMPILE, the automatic step on a fresh disk cache)
    reads a checkpoint, runs the model and the decoding loop: not the training code, the datasets,
    the extras (hf: only for a Hugging Face folder), the compiler's code (only where a compiled step
    is built or loaded), nor the BPEs for a character-level model (issues 46, 51). The build the
    automatic step would start is marked failed first (its key from a process like the measured
    one), so that none runs behind the tests' backs: the same modules load, and no build starts."""
    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_COMPILE"}
    env["TINYGPT_CACHE_DIR"] = str(tmp_path / "cache")
    key = subprocess.run(
        [sys.executable, "-c", KEY, str(default_run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=True,
    ).stdout.strip()
    decode = tmp_path / "cache" / "decode"
    decode.mkdir(parents=True)
    (decode / f"{key}.failed").write_text("not built: tests/test_imports.py\n")
    names, lines, every = loaded(
        "sample.py", str(default_run), "--max-new-tokens", "3", "--seed", "1", env=env
    )
    # nor torch's compiler, a second to import (BENCHMARKS.md, "The core that stands alone")
    compiler = every & {"torch._dynamo", "torch._inductor"}
    assert not compiler, compiler
    assert not list(decode.glob("*.log")), "a background build started: the key did not match"
    # 4,150 until runs/runtime.py took keep_freed_memory (training's, beside the runtime it sets up)
    assert len(names) <= 24 and lines <= 4160, (len(names), lines, names)
    unused = ("training", "data.dataset", "data.bpe", "runs.config", "hf", "interp", "gguf_export")
    only_some = ("sampling.compiled", "sampling.background", "model.lora", "model.local_attention")
    for name in (*unused, "dry_run", *only_some):
        assert not any(n == name or n.startswith(name + ".") for n in names), name


# the automatic step's key for sample.py's model in ARGV[1], as sample.py computes it
KEY = (
    "import sys; from runs.pretrained import load_model; from sampling.kv_cache import KVCache; "
    "from sampling.steps import step_keys; model = load_model(sys.argv[1], 'cpu').model; "
    "print(step_keys(model, KVCache.for_model(model, 1))[-1])"
)
