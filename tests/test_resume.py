"""Resuming with changed values, as a learner does it: train, tweak the command line, resume, look.

The rule (docs/training.md, "Stopping and resuming"; training/resume.py's KEPT_ON_RESUME): what may
change is applied and named in the resume line, the checkpoint's config.yaml records what ran, a
longer budget continues the schedule from where it was; what may not change stops in one line saying
where to go instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import one_line_error, run_script, train

from common.errors import UserError
from runs.checkpoint import Progress, find_last
from runs.config import TrainConfig, load_config
from training.optim import schedule_progress

# cosine to 2e-4 (min_lr_ratio 0.1)
RUN = ("optim.lr=2e-3", "train.eval_interval=20", "log.interval=20")


def evals(out: Path) -> dict[int, float]:
    """iteration -> the learning rate of each eval in metrics.jsonl."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["iter"]: r["lr"] for r in rows}


def recorded(out: Path) -> dict:
    return yaml.safe_load((out / "last" / "config.yaml").read_text())


def resume_line(result) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("resuming at"))


@pytest.mark.slow
def test_a_learner_lowers_the_lr_and_trains_longer(data_dir: Path, tmp_path: Path):
    out = tmp_path / "out"
    train(data_dir, out, *RUN, "train.max_iters=40")
    assert evals(out)[40] == pytest.approx(2e-4, rel=1e-12)  # decayed to its floor

    # more iterations (and evals): the schedule goes on from where it was, at its floor; it does not
    # climb
    longer = train(
        data_dir, out, *RUN, "train.max_iters=60", "train.eval_interval=10", "train.resume=true"
    )
    assert resume_line(longer).endswith(
        "; changed: train.max_iters 40 -> 60, train.eval_interval 20 -> 10 (learning rate 0.0002; "
        "the schedule goes on from 100% done to its end at the new budget)"
    )
    # stretched: 7.3e-4 at 40, 3.4e-4 at 50
    assert evals(out)[50] == evals(out)[60] == pytest.approx(2e-4, rel=1e-12)

    # a lower learning rate: applied (state.pt's 2e-3 no longer wins), named, and recorded
    lower = train(data_dir, out, *RUN, "train.max_iters=80", "optim.lr=1e-5", "train.resume=true")
    line = resume_line(lower)
    assert (
        "changed: train.max_iters 60 -> 80, train.eval_interval 10 -> 20, optim.lr 0.002 -> 1e-05"
        in line
    )
    assert "(learning rate 0.0002 -> 1e-06; the schedule goes on from 100% done" in line
    assert evals(out)[80] == pytest.approx(1e-6, rel=1e-12)
    assert recorded(out)["optim"]["lr"] == 1e-5 and recorded(out)["train"]["max_iters"] == 80

    # unchanged: nothing named
    same = train(data_dir, out, *RUN, "train.max_iters=80", "optim.lr=1e-5", "train.resume=true")
    assert "changed" not in resume_line(same)


@pytest.mark.slow
def test_what_a_resumed_run_cannot_change_stops_in_one_line(data_dir: Path, tmp_path: Path):
    out = tmp_path / "out"
    train(data_dir, out, *RUN, "train.max_iters=20")
    before = (out / "metrics.jsonl").read_text()

    fewer = train(data_dir, out, *RUN, "train.max_iters=10", "train.resume=true", check=False)
    one_line_error(
        fewer, "at iteration 20, past train.max_iters=10: nothing to train; raise train.max_iters"
    )
    timed = train(
        data_dir,
        out,
        *RUN,
        "train.max_iters=30",
        "train.max_time=0.01",
        "train.resume=true",
        check=False,
    )
    one_line_error(
        timed, "s, past train.max_time=0.01: nothing to train; raise train.max_time above"
    )
    args = (*RUN, "optim.name=muon", "train.max_iters=30", "train.resume=true")
    muon = train(data_dir, out, *args, check=False)
    how = f"from its weights: train.init_from={out / 'last'} train.out_dir=NEW optim.name=muon"
    one_line_error(
        muon,
        "has optim.name=adamw but the command line asks for muon; a resumed run keeps its "
        "optimizer (state.pt holds "
        f"its state): resume without optim.name=muon, or start a new run {how}",
    )
    assert (out / "metrics.jsonl").read_text() == before and recorded(out)["train"][
        "max_iters"
    ] == 20

    # the way the line gives: a new run from the checkpoint's weights, with the other optimizer
    new = tmp_path / "new"
    args = (*RUN, f"train.init_from={out / 'last'}", "optim.name=muon", "train.max_iters=2")
    assert f"starting from the weights of {out / 'last'}" in train(data_dir, new, *args).stdout
    assert recorded(new)["optim"]["name"] == "muon"


def test_a_new_budget_spreads_what_was_left_of_the_schedule():
    """Resumed at iteration 50 of 100 (half done), now 150: half is left, over 100 iterations."""
    longer, anchor = TrainConfig(max_iters=150), {"schedule_iter": 50, "schedule_done": 0.5}
    done = [schedule_progress(Progress(iter=i, **anchor), 0.0, longer) for i in (50, 100, 150, 200)]
    assert done == [0.5, 0.75, 1.0, 1.0]
    timed = TrainConfig(max_iters=10**6, max_time=300.0)  # half the time spent at 100 s: 200 s left
    assert (
        schedule_progress(Progress(schedule_elapsed=100.0, schedule_done=0.5), 200.0, timed) == 0.75
    )
    # no anchor: exactly the plain schedule
    for it, elapsed in ((7, 0.0), (333, 12.5), (5000, 299.0)):
        assert schedule_progress(Progress(iter=it), elapsed, timed) == min(
            1.0, max(it / 10**6, elapsed / 300.0)
        )


@pytest.mark.slow
def test_a_run_made_with_overrides_resumes_without_typing_them_again(
    data_dir: Path, tmp_path: Path
):
    """A resume starts from the checkpoint's config (issue 48: the default config's block_size,
    then its n_layer, were refused one at a time, and every override had to be typed again): the
    command line's overrides alone are applied, those a resume must keep named all at once; its
    dry run describes the checkpoint's model and checks the same."""
    from dry_run import estimate

    out = tmp_path / "out"
    shape = ("model.n_layer=1", "model.pos_emb=rope", "model.norm=rmsnorm")
    train(data_dir, out, *RUN, *shape, "train.threads=1", "train.max_iters=20")
    again = (f"data.dir={data_dir}", f"train.out_dir={out}", "train.resume=true")
    longer = run_script("train.py", *again, "train.max_iters=30", check=True)
    assert resume_line(longer).endswith(
        "; changed: train.max_iters 20 -> 30 (learning rate 0.0002; the schedule goes on from "
        "100% done to its end at the new budget)"
    )
    assert recorded(out)["model"]["n_layer"] == 1 and recorded(out)["optim"]["lr"] == 2e-3
    assert ", 1 threads;" in longer.stdout  # the run is set up as its checkpoint's config says

    report = estimate.dry_run(load_config(None, [*again, "train.max_iters=40"]))
    assert report.startswith(f"dry run of resuming {out / 'last'} with ")  # not "the default"
    described = next(line for line in report.splitlines() if line.startswith("model "))
    assert "1,0" not in described  # not the default's 10.7M parameters
    model = find_last(out).config().model
    assert model.describe() in " ".join(line.strip() for line in report.splitlines())
    assert model.describe().startswith("1 layer, ") and "RMSNorm" in model.describe()

    kept = ("model.n_layer=4", "model.block_size=64", "optim.name=muon", "train.max_iters=40")
    refused = run_script("train.py", *again, *kept, check=False)
    one_line_error(
        refused,
        f"checkpoint {out / 'last'} has model.block_size=32, model.n_layer=1, optim.name=adamw but "
        "the command line asks for 64, 4, muon; a resumed run keeps its model's shape (its weights "
        "have it) and optimizer (state.pt holds its state): resume without model.block_size=64 "
        "model.n_layer=4 optim.name=muon, or train a new model in another train.out_dir; or "
        f"start a new run from its weights: train.init_from={out / 'last'} train.out_dir=NEW "
        "optim.name=muon",
    )
    with pytest.raises(
        UserError, match=re.escape("has model.block_size=32, model.n_layer=1, optim")
    ):
        estimate.dry_run(load_config(None, [*again, *kept]))
