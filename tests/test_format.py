"""The checkpoint format, guarded: a run written by an earlier tinygpt still samples, evaluates and
resumes as it did when it was written.

Users upgrade tinygpt with runs on disk. tests/fixtures/format_v1/ is such a run, kept as it was
written (its README says by which commit and command): a 2-layer character model trained for 1,500
iterations on tiny Shakespeare with dropout, in fp32 on the CPU, its folder as train.py leaves it
(last/, best/, metrics.jsonl). The values below were recorded from it by the code that wrote it.
Dropout makes a resumed run's losses depend on the random generators it restores, so a state.pt read
back wrongly shows (resumed with another torch generator state, the val loss at 2,000 ends 0.0016
away). Token counts, iterations and the greedy text compare exactly; losses to 1e-4, since another
CPU's kernels round differently. A format that must change gets a version field and a one-line
message for what it no longer reads, and this test says which.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from conftest import ROOT, script, train_here

FIXTURE = ROOT / "tests" / "fixtures" / "format_v1"
# the command line that trained it (its README), less data.dir, train.out_dir and train.max_iters
ARGS = [
    "shakespeare_char",
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=16",
    "model.block_size=16",
    "model.dropout=0.1",
    "train.batch_size=8",
    "train.eval_iters=2",
    "train.eval_interval=500",
    "train.device=cpu",
    "train.precision=fp32",
    "train.final_eval=false",
    "optim.warmup_iters=5",
    "log.plot=false",
    "optim.lr=5e-3",
]
LOSS_TOLERANCE = 1e-4


def close(a: float, b: float) -> bool:
    return abs(a - b) <= LOSS_TOLERANCE


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_fixture_is_small_and_whole():
    files = {str(p.relative_to(FIXTURE)) for p in FIXTURE.rglob("*") if p.is_file()}
    for name in ("last", "best"):
        assert {f"{name}/{f}" for f in ("config.yaml", "model.safetensors", "state.pt")} <= files
        assert f"{name}/tinygpt_tokenizer.json" in files
    assert sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file()) < 400_000


def test_the_fixture_samples_as_it_did(capsys):
    import sample

    argv = [str(FIXTURE), "--prompt", "ROMEO:", "--max-new-tokens", "40", "--temperature", "0"]
    text = script(capsys, sample.main, *argv)
    assert text == "ROMEO:\nThe the the the the the the the the the\n"


def test_the_fixture_evaluates_as_it_did(capsys, data_dir: Path):
    import eval as eval_script

    result = json.loads(
        script(capsys, eval_script.main, str(FIXTURE), "--data-dir", str(data_dir), "--json")
    )
    assert result["checkpoint"] == str(FIXTURE / "best") and result["tokenizer"] == "char"
    assert (result["tokens"], result["bytes"]) == (111_539, 111_539)
    assert close(result["loss"], 2.43219) and close(result["bpb"], 3.50891)


def test_the_fixture_resumes_as_it_did(data_dir: Path, tmp_path: Path):
    out = tmp_path / "run"
    shutil.copytree(FIXTURE, out)
    # recorded when a longer budget stretched the schedule over it from iteration 0; now a resumed
    # run goes on from where its schedule was (docs/training.md), so the copy says 2,000: the same
    # schedule, no change
    config = out / "last" / "config.yaml"
    config.write_text(config.read_text().replace("max_iters: 1500", "max_iters: 2000"))
    before = metrics(out)
    resumed = [
        f"data.dir={data_dir}",
        f"train.out_dir={out}",
        "train.max_iters=2000",
        "train.resume=true",
    ]
    train_here(*ARGS, *resumed)
    rows = metrics(out)
    assert rows[:4] == before and [r["iter"] for r in rows] == [0, 500, 1000, 1500, 2000]
    assert rows[-1]["tokens"] == 2000 * 8 * 16 and rows[-1]["lr"] == 0.0005
    expected = {"train_loss": 2.30432, "val_loss": 2.51025, "val_bpb": 3.62153}  # recorded
    assert all(close(rows[-1][k], v) for k, v in expected.items()), rows[-1]
    state = torch.load(out / "last" / "state.pt", weights_only=True)
    assert state["iter"] == 2000 and state["evaluated_at"] == 2000 and state["skipped_steps"] == 0
    assert state["elapsed_s"] > before[-1]["elapsed_s"]
    assert close(state["best_val_loss"], min(r["val_loss"] for r in rows))
