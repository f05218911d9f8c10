"""Issue 52: what the pictures of a circuit draw agrees with what is printed. The faithfulness
curve is drawn on the axis its area is taken over (the share of the edges kept, 0 to 1, linear),
and an area above 1 is explained where it is printed and drawn; a control without a phase change
(configs/induction_1layer.yaml) is drawn on fixed scales with nothing shaded, and a circuit that is
the model on every row says why its f has no interval."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from interp import circuit_picture
from interp.circuit_picture import MIN_NATS
from interp.circuit_training import format_phase_change, phase_change
from interp.discovery import area, format_discovery
from interp.faithfulness import interval_or_reason


def discovered(**changes) -> dict:
    """A discovered circuit of 4 edges, as discover() writes it, whose curve overshoots 1."""
    edges = [
        {"from": "embeddings", "to": "L0H0", "kind": "v", "score": 0.9, "kept": True},
        {"from": "L0H0", "to": "L1H0", "kind": "k", "score": 0.5, "kept": True},
        {"from": "L1H0", "to": "logits", "kind": "logits", "score": 0.4, "kept": True},
        {"from": "embeddings", "to": "L1H1", "kind": "q", "score": -0.1, "kept": False},
    ]
    curve = {"0": 0.0, "1": 0.6, "2": 0.9, "3": 1.2, "4": 1.0}
    found = {
        "task": "a task",
        "ablation": "resample",
        "metric": "task",
        "metric_model": 0.0,
        "metric_none": -4.2,
        "gap": 4.2,
        "noise": 0.1,
        "rows": 8,
        "method": "exact",
        "seconds": {"exact": 0.1},
        "target": 0.9,
        "reached": True,
        "prefix": 2,
        "curve": curve,
        "area": area({int(k): f for k, f in curve.items()}),
        "size": 3,
        "faithfulness": 1.2,
        "interval": [1.1, 1.3],
        "incompleteness": {"value": 0.19, "removed": []},
        "minimality": {"share": 1.0, "edges": 3, "weakest": []},
        "left_out": [],
        "edges": edges,
    }
    return found | changes


@pytest.fixture
def drawn(monkeypatch):
    """The figures the module would save, kept instead of written."""
    figures = []
    monkeypatch.setattr(circuit_picture, "save_figure", lambda fig, path, **kw: figures.append(fig))
    return figures


def test_the_curve_is_drawn_on_the_axis_its_area_is_taken_over(drawn, tmp_path):
    found = discovered()
    circuit_picture.plot_discovered(found, 2, 2, False, tmp_path / "d.png")
    curve = drawn[0].axes[1]
    assert curve.get_xscale() == "linear" and curve.get_xlim() == (0, 1)
    x, f = curve.lines[0].get_data()
    assert list(x) == [0, 0.25, 0.5, 0.75, 1.0]
    # the area of the line drawn is the area printed
    assert round(float(np.trapezoid(f, x)), 4) == found["area"] == 0.8


def test_an_area_above_1_is_explained_in_the_report_and_the_picture(drawn, tmp_path):
    found = discovered(curve={"0": 0.5, "1": 1.1, "2": 1.2, "3": 1.2, "4": 1.0})
    found["area"] = area({int(k): f for k, f in found["curve"].items()})
    assert found["area"] > 1
    text = format_discovery(found)
    assert "0 to 1 on a linear axis" in text
    assert "rises above 1 (f = 1.200 with the strongest 2)" in text, text
    assert "can exceed 1" in text
    circuit_picture.plot_discovered(found, 2, 2, False, tmp_path / "d.png")
    assert "above f = 1" in drawn[0].axes[1].get_title()
    below = discovered(curve={"0": 0.0, "2": 0.9, "4": 1.0})
    assert "rises above 1" not in format_discovery(below)


def test_a_circuit_that_is_the_model_on_every_row_says_why_it_has_no_interval():
    # the one-layer control: the 5 edges left out score exactly 0, so every resample gives f = 1
    setup = SimpleNamespace(full=torch.tensor([-0.3, -0.4, -0.5]), none=torch.tensor([-4.0] * 3))
    found = interval_or_reason(setup, setup.full.clone())
    assert "interval" not in found, found
    assert "each edge left out changes nothing" in found["missing"]["interval"]
    same = SimpleNamespace(full=torch.tensor([-0.3, -0.4]), none=torch.tensor([-4.3, -4.4]))
    found = interval_or_reason(same, torch.tensor([-2.3, -2.4]))  # f = 0.5 on each row
    assert "every resample of the rows gives the same f, 0.500" in found["missing"]["interval"]


def evals(icl: list[float], carried: list[float]) -> list[dict]:
    """circuits.json's evals, one layer: no K-composition."""
    return [
        {"iter": 50 * i, "val_loss": 3.9 - 0.02 * i, "previous_token": 0.05, "induction": 0.03,
         "icl_score": c, "carried": k, "faithfulness": 1.0}
        for i, (c, k) in enumerate(zip(icl, carried))
    ]  # fmt: skip


def test_a_control_without_a_phase_change_is_drawn_without_one(drawn, tmp_path):
    control = evals([0.02, -0.01, -0.1, -0.2, -0.33], [0.0, 0.1, 0.3, 0.5, 0.7])
    found = {"evals": control, "phase_change": phase_change(control), "circuit": [[1]] * 12,
             "ablation": "resample", "task": "a task"}  # fmt: skip
    assert not any(c["steep"] for c in found["phase_change"].values() if c)
    line = format_phase_change(found)
    assert "(+0.13 nats, under 0.5: no phase change)" in line, line
    circuit_picture.plot_circuits_training(found, tmp_path / "c.png")
    scores, icl = drawn[0].axes[1:3]
    assert not any(ax.patches for ax in drawn[0].axes)  # nothing shaded
    assert scores.get_ylim()[0] == 0 and scores.get_ylim()[1] >= 1
    low, high = icl.get_ylim()
    assert high - low >= MIN_NATS  # 0.35 nats fill a third of the panel, not all of it
    label = icl.get_legend().get_texts()[0].get_text()
    assert "-0.33 to +0.02, no steep change" in label, label
    # the two-layer model's phase change: steep, shaded
    steep = evals([0.0, -0.05, -0.7, -2.4, -2.6], [0.0, 0.1, 0.5, 3.4, 4.3])
    found |= {"evals": steep, "phase_change": phase_change(steep)}
    assert found["phase_change"]["icl_score"] == {"from": 100, "to": 150, "by": 1.7, "steep": True}
    circuit_picture.plot_circuits_training(found, tmp_path / "c.png")
    assert drawn[1].axes[2].patches and "steepest 100-150 (shaded)" in (
        drawn[1].axes[2].get_legend().get_texts()[0].get_text()
    )


def test_a_discovered_circuit_of_one_row_is_drawn_with_no_interval_and_why(drawn, tmp_path):
    found = discovered(missing={"interval": "one row, which every resample of the rows repeats"})
    del found["interval"]
    circuit_picture.plot_discovered(found, 2, 2, False, tmp_path / "d.png")
    title = drawn[0].get_suptitle()
    assert "f = 1.20 (no interval: one row) under resample" in title, title
    assert "[1.20, 1.20]" not in title and "f twice" not in title
    circuit = {"faithfulness": {"size": 3, "faithfulness": 0.86, "ablation": "resample",
               "missing": {"interval": "one row, which ..."}}}  # fmt: skip
    assert circuit_picture.bounds(circuit["faithfulness"]) == "(no interval: one row)"


def test_circuits_through_training_record_no_interval_of_no_width():
    from conftest import OPTIONS, model_with

    from interp.circuit_training import carried
    from interp.graph import model_graph
    from interp.tasks import repeat_task

    model = model_with(OPTIONS["gpt2"])
    keep = torch.ones(len(model_graph(model)))  # every edge: the model on every row
    found = carried(model, repeat_task(model, 4), keep)
    assert "interval" not in found and "changes nothing" in found["missing"]["interval"], found
