"""What each command loads of ours, measured with `python -X importtime`: a plain run reads only
what it uses (Hugging Face, LoRA, the dry run's estimators, Muon, the repeats generator and head
scores are imported where they are used). The limits are issue 38's: a learner reads what a command
loads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, train

pytestmark = pytest.mark.slow  # each starts a script or two: 5-20 s

OURS = ("common", "model", "sampling", "data", "interp", "hf", "gguf_export", "runs", "training")


def loaded(*argv: str) -> tuple[list[str], int]:
    """Our modules (package __init__ files count) that `python -X importtime ARGV` imports; their
    lines."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names = set()
    for line in result.stderr.splitlines():
        found = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", line)
        if found and found.group(1).split(".")[0] in OURS:
            names.add(found.group(1))
    lines = 0
    for name in names:
        path = ROOT.joinpath(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        lines += len(path.read_text(encoding="utf-8").splitlines())
    return sorted(names), lines


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


def test_the_default_run_loads_at_most_40_of_our_modules(data_dir: Path, tmp_path: Path):
    names, lines = loaded(
        "train.py",
        f"data.dir={data_dir}",
        f"train.out_dir={tmp_path / 'out'}",
        "train.max_iters=2",
        "train.eval_interval=2",
        "train.eval_iters=1",
        # as the default config runs: evals, checkpoints, loss.png, the exact eval at the end; no
        # samples
    )
    assert len(names) <= 40 and lines <= 6000, (len(names), lines, names)
    for unused in (
        "hf",
        "model.lora",
        "training.muon",
        "training.estimate",
        "data.repeats",
        "interp.scores",
    ):
        assert unused not in names, unused


def test_plot_loads_at_most_12_of_our_modules(default_run: Path, tmp_path: Path):
    names, _ = loaded("plot.py", str(default_run), "--out", str(tmp_path / "loss.png"))
    assert len(names) <= 12, (len(names), names)


def test_sample_loads_at_most_25_of_our_modules_and_4000_lines(default_run: Path):
    """Sampling reads a checkpoint, runs the model and the decoding loop: not the training code, the
    datasets, the compiler's code where nothing compiles (the tests' TINYGPT_COMPILE=never), nor
    the BPEs for a character-level model (issue 46)."""
    names, lines = loaded("sample.py", str(default_run), "--max-new-tokens", "3", "--seed", "1")
    assert len(names) <= 25 and lines <= 4000, (len(names), lines, names)
    for unused in ("training", "data.dataset", "data.bpe", "runs.config", "sampling.compiled"):
        assert unused not in names, unused
