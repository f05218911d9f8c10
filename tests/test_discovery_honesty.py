"""Issue 52: every interval and error --discover and --circuit give is honest. A row with no gap is
refused (a task file's by file:line); one row gives no interval and no standard error, and says
why; every printed figure is finite and discovered.json holds no null for a number; the "no
effect" refusal states its rule; the task line names --metric kl; a held-out f below the target
gets a remark; discovered.json says what its fields mean. The quick tests use hand-made inputs;
the last ones run the induction model that conftest trains."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import script, script_error

from common.errors import UserError
from data.tokenizers import CharTokenizer
from interp import task_inputs
from interp.discovery import FIELDS, format_discovery, rank_agreement
from interp.faithfulness import BOOTSTRAP, interval, interval_or_reason, noise
from interp.task_file import read_task_file


def gaps(full: list[float], none: list[float]) -> SimpleNamespace:
    """What the interval and the noise read of a TaskGraph: the metric per row, all edges / none."""
    return SimpleNamespace(full=torch.tensor(full), none=torch.tensor(none))


def test_one_row_gives_no_interval_and_no_standard_error_and_says_why():
    setup = gaps([-0.35], [-4.57])
    found = interval_or_reason(setup, torch.tensor([-0.7]))
    assert "interval" not in found and "one row" in found["missing"]["interval"]
    assert noise(setup) is None


def test_resamples_with_no_gap_are_left_out_or_the_interval_is_refused():
    # two rows with a gap, one without: f is finite on every resample that has a gap
    setup = gaps([-0.3, -0.4, -1.0], [-4.3, -4.4, -1.0])
    low, high = interval(setup, torch.tensor([-0.5, -0.6, -1.0]))
    assert math.isfinite(low) and math.isfinite(high) and low <= high
    # most rows without a gap: too many resamples of nothing to give an interval
    setup = gaps([-0.3, *[-1.0] * 9], [-4.3, *[-1.0] * 9])
    found = interval_or_reason(setup, torch.tensor([-0.5, *[-1.0] * 9]))
    assert "interval" not in found and f"of {BOOTSTRAP} resamples" in found["missing"]["interval"]


def test_rank_agreement_without_a_circuit_gives_no_auc_and_says_why():
    found = rank_agreement(np.array([0.3, 0.1, 0.2]), np.array([0.9, 0.1, 0.2]), np.zeros(3, bool))
    assert "roc_auc" not in found and "nothing to tell apart" in found["missing"]["roc_auc"]
    assert json.dumps(found).count("NaN") == 0


def discovered(**changes) -> dict:
    """A discovered circuit as discover() writes it: one row, --metric kl, a held-out f below the
    target."""
    found = {
        "task": "mean log-probability of the second copy's tokens in [R, R]",
        "ablation": "resample",
        "metric": "kl",
        "metric_model": 0.0,
        "metric_none": -4.2,
        "gap": 4.2,
        "rows": 1,
        "method": "exact",
        "seconds": {"exact": 0.1},
        "target": 0.9,
        "reached": True,
        "prefix": 33,
        "curve": {"0": 0.0, "33": 0.92, "81": 1.0},
        "area": 0.8,
        "size": 33,
        "faithfulness": 0.917,
        "incompleteness": {"value": 0.19, "removed": []},
        "minimality": {"share": 0.94, "edges": 33, "weakest": []},
        "left_out": [],
        "missing": {"interval": "one row, which ...", "noise": "one row, whose ..."},
        "held_out": {"seed": 1, "rows": 64, "gap": 1.0, "faithfulness": 0.846},
        "edges": [{"from": "embeddings", "to": "L0H0", "kind": "v", "score": 0.9, "kept": True}],
    }
    found["held_out"]["interval"] = [0.756, 0.925]
    return found | changes


def test_the_report_says_what_it_lacks_names_kl_and_remarks_on_a_held_out_f_below_target():
    text = format_discovery(discovered())
    assert not re.search(r"\b(nan|inf)\b", text, re.IGNORECASE), text
    assert "no standard error: one row" in text and "f = 0.917 (no interval: one row" in text
    task_line = text.splitlines()[0]
    assert "measured instead by --metric kl" in task_line
    assert "f = 0.846 [0.756, 0.925]" in text and "below the target 0.9 there" in text
    above = discovered(held_out={"seed": 1, "rows": 64, "gap": 1.0, "faithfulness": 0.95})
    above["held_out"]["interval"] = [0.9, 0.99]
    assert "below the target" not in format_discovery(above)
    no_gap = {"seed": 1, "rows": 64, "gap": 0.01, "missing": {"faithfulness": "the gap is 0.010"}}
    assert "no f (the gap is 0.010)" in format_discovery(discovered(held_out=no_gap))


def test_every_field_of_discovered_json_is_explained():
    for key in discovered():
        assert key in FIELDS, key
    assert "share of the gap" in FIELDS["edges"] and "held_out" in FIELDS


def test_the_no_effect_refusal_states_its_rule(monkeypatch):
    # the numbers: clean is better, by less than the rule asks
    monkeypatch.setattr(task_inputs, "metric_ends", lambda model, task: (-0.156, -0.208))
    task = SimpleNamespace(noised=lambda: None)
    with pytest.raises(UserError) as e:
        task_inputs.check_effect(None, task, "--discover", "give a task the model does")
    message = str(e.value)
    assert "-0.156 on the clean input and -0.208 on the corrupted one, +0.052" in message
    assert "the clean must beat the corrupted by at least 0.1" in message
    assert "no better" not in message


def test_a_row_with_the_same_clean_and_corrupted_input_is_refused():
    clean = torch.tensor([[1, 2, 3], [4, 5, 6]])
    task = SimpleNamespace(clean=clean, corrupted=torch.tensor([[1, 9, 3], [4, 5, 6]]))
    with pytest.raises(UserError, match=r"--discover previous-token: row 2 of 2 has the same"):
        task_inputs.check_rows(task, "--discover previous-token", "give more --sequences")


@pytest.mark.parametrize(
    "line, message",
    [
        (
            {"clean": "ab", "corrupted": "ab", "answer": "c", "wrong": "d"},
            ":2: the clean and the corrupted prompt are the same tokens",
        ),
        (
            {"clean": "ab", "corrupted": "ad", "answer": "c", "wrong": "c"},
            ":2: answer and wrong are the same token",
        ),
    ],
)
def test_a_task_file_line_with_no_gap_is_refused_by_file_and_line(tmp_path: Path, line, message):
    path = tmp_path / "task.jsonl"
    good = {"clean": "ab", "corrupted": "ad", "answer": "c", "wrong": "d"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(UserError) as e:
        read_task_file(str(path), CharTokenizer("abcd"), None)
    assert str(e.value).startswith(f"{path}{message}"), str(e.value)


def numbers_are_numbers(value, where: str = "") -> None:
    """No null, NaN or infinity anywhere in a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            numbers_are_numbers(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            numbers_are_numbers(v, f"{where}[{i}]")
    else:
        assert value is not None, where
        assert not (isinstance(value, float) and not math.isfinite(value)), where


@pytest.mark.slow  # the induction model, trained once per session
def test_one_sequence_runs_with_no_interval_and_no_null(induction_run, capsys, tmp_path: Path):
    import heads

    out, _ = induction_run
    argv = [str(out), "--discover", "--sequences", "1", "--out", str(tmp_path)]
    printed = script(capsys, heads.main, *argv)
    assert not re.search(r"\b(nan|inf)\b", printed, re.IGNORECASE), printed
    assert "no interval: one row" in printed and "no standard error: one row" in printed
    found = json.loads((tmp_path / "discovered.json").read_text())
    numbers_are_numbers(found)
    assert "interval" not in found and "noise" not in found and found["fields"] == FIELDS
    assert set(found["missing"]) == {"interval", "noise"}


@pytest.mark.slow
def test_a_task_file_with_a_line_of_no_gap_is_refused(induction_run, capsys, tmp_path: Path):
    import heads

    out, _ = induction_run
    path = tmp_path / "task.jsonl"
    prompt = "KLxiQEFBWOmACVzYafwcKLxiQEFBWOmACVzYafw"
    line = {"clean": prompt, "corrupted": prompt.replace("c", "q"), "answer": "c", "wrong": "q"}
    same = line | {"corrupted": prompt}
    path.write_text(json.dumps(line) + "\n" + json.dumps(same) + "\n")
    message = f"{path}:2: the clean and the corrupted prompt are the same tokens"
    script_error(capsys, heads.main, [str(out), "--discover", str(path)], message)
