"""plot.py on any metrics.jsonl a run (of this version or an older one) may hold: it draws what can
be drawn, and says in one line what cannot, never a traceback."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from conftest import run_script, script, script_error, train
from matplotlib.image import imread

import plot as command
from training.curves import numbers, plot_run, points

HEADS = {
    "induction": [[0.1, 0.9]],
    "icl_score": -0.4,
    "repeat_loss_first_half": 3.9,
    "repeat_length": 10,
}


def write_run(folder: Path, rows: list[dict]) -> str:
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def rows_of_two_versions() -> list[dict]:
    """Evals with head scores (log.head_scores) and, first, rows an older version wrote without
    `tokens`."""
    old = [dict(iter=i, train_loss=3.0 - i / 10, val_loss=3.1 - i / 10, lr=1e-3) for i in (0, 10)]
    new = [
        dict(
            iter=i,
            train_loss=3.0 - i / 10,
            val_loss=3.1 - i / 10,
            lr=1e-3,
            tokens=i * 64,
            elapsed_s=i / 5,
        )
        for i in (20, 30)
    ]
    new[-1]["heads"] = HEADS
    new[0]["val_loss"] = None  # a diverged eval's loss is written as null
    return old + new


def test_nested_records_give_dotted_numbers_and_rows_without_a_key_are_left_out():
    rows = rows_of_two_versions()
    assert numbers(rows[-1])["heads.icl_score"] == -0.4 and "heads.induction" not in numbers(
        rows[-1]
    )
    assert points(rows, "val_loss", "tokens") == ([30 * 64], [3.1 - 3.0])
    assert points(rows, "train_loss", "iter") == ([0, 10, 20, 30], [3.0, 2.0, 1.0, 0.0])
    assert points(rows, "heads.icl_score", "iter") == ([30], [-0.4])


def test_plot_draws_what_it_can_and_refuses_the_rest_in_one_line(tmp_path: Path, capsys):
    run, png = write_run(tmp_path / "run", rows_of_two_versions()), tmp_path / "runs.png"
    assert f"wrote {png}" in script(
        capsys, command.main, run, "--metric", "train_loss", "--out", str(png)
    )
    assert imread(png).shape[0] >= 400
    script(
        capsys, command.main, run, "--metric", "heads.icl_score", "--x", "iter", "--out", str(png)
    )
    nested = (
        "--metric heads holds several numbers; plot one of: heads.icl_score, heads.repeat_length"
    )
    script_error(capsys, command.main, [run, "--metric", "heads", "--out", str(png)], nested)
    have = "metrics.jsonl has elapsed_s, iter, lr, tokens, train_loss, val_loss"
    script_error(capsys, command.main, [run, "--metric", "nothing", "--out", str(png)], have)
    old = write_run(tmp_path / "old", rows_of_two_versions()[:2])
    message = (
        "--metric val_loss: no record has it together with tokens, the --x tokens axis; try --x "
        "iter"
    )
    script_error(capsys, command.main, [old, "--out", str(png)], message)
    # the run's own curves, from the same rows
    plot_run(rows_of_two_versions(), tmp_path / "loss.png")
    assert imread(tmp_path / "loss.png").shape[1] >= 800
    (tmp_path / "folder" / "metrics.jsonl").mkdir(parents=True)
    script_error(
        capsys,
        command.main,
        [str(tmp_path / "folder")],
        "metrics.jsonl cannot be read (Is a directory)",
    )
    (tmp_path / "file").write_text("")
    script_error(
        capsys, command.main, [run, "--out", str(tmp_path / "file" / "x.png")], "cannot create"
    )


OURS = (
    *("common", "model", "sampling", "data", "runs", "training"),
    *("dry_run", "interp", "hf", "gguf_export"),
)
COUNT = f"""
import sys
import plot
print(sorted(m for m in sys.modules if m.split(".")[0] in {OURS}))
"""


def test_plot_loads_a_few_of_our_modules():
    # it draws metrics.jsonl: no model, no training code but the curves (it once loaded 50 of our
    # modules through training/)
    loaded = ast.literal_eval(run_script("-c", COUNT, check=True).stdout)
    heavy = [m for m in loaded if m.split(".")[0] in ("training", "runs", "model")]
    assert len(loaded) <= 12 and heavy == ["training", "training.curves"], loaded


def test_a_label_is_what_the_run_last_ran(tmp_path: Path):
    for name, iters in (("a", None), ("b", 200)):
        run = Path(write_run(tmp_path / name, rows_of_two_versions()))
        # a resumed to 320 iterations, best at 300
        for folder, n in (("best", 300), ("last", iters or 320)):
            (run / folder).mkdir()
            (run / folder / "config.yaml").write_text(
                f"train:\n  max_iters: {n}\n  out_dir: {name}\nlora: null\n"
            )
    a, b = command.labels([str(tmp_path / "a"), str(tmp_path / "b")])
    assert a == f"{tmp_path / 'a'}\ntrain.max_iters=320" and b.endswith("train.max_iters=200")
    # one run: nothing to tell apart
    assert command.labels([str(tmp_path / "a")]) == [str(tmp_path / "a")]


@pytest.mark.slow
def test_runs_that_differ_in_many_keys_are_told_apart(data_dir: Path, tmp_path: Path, capsys):
    # a learner's session: a run, the same resumed for longer, and one that changes seven keys, Muon
    # last
    first, other = tmp_path / "out" / "first", tmp_path / "out" / "other"
    train(data_dir, first, "train.max_iters=10", "train.eval_interval=10")
    train(data_dir, first, "train.max_iters=20", "train.eval_interval=10", "train.resume=true")
    changes = [
        "model.n_layer=1",
        "train.batch_size=4",
        "train.seed=7",
        "optim.lr=3e-3",
        "optim.beta2=0.9",
    ]
    train(
        data_dir, other, "train.max_iters=10", "train.eval_interval=5", *changes, "optim.name=muon"
    )
    a, b = command.labels([str(first), str(other)])
    assert "train.max_iters=20" in a and "train.max_iters=10" in b  # as resumed
    for key in (
        "model.n_layer=1",
        "train.batch_size=4",
        "train.eval_interval=5",
        "optim.name=muon",
    ):
        assert key in b  # every key that differs, none hidden behind "+3 more"
    assert all(len(line) <= command.WRAP for line in b.splitlines()[1:])
    shown = script(capsys, command.main, str(first), str(other))
    # beside the runs, not in the current folder
    assert shown == f"wrote {tmp_path / 'out' / 'runs.png'}\n"
    # taller for the labels below the axes
    assert imread(tmp_path / "out" / "runs.png").shape[0] >= 500
