"""Issue 52: what the pictures of a circuit draw agrees with what is printed. The faithfulness
curve is drawn on the axis its area is taken over (the share of the edges kept, 0 to 1, linear),
and an area above 1 is explained where it is printed and drawn."""

from __future__ import annotations

import numpy as np
import pytest

from interp import circuit_picture
from interp.discovery import area, format_discovery


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
