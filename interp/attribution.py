"""Attribution patching (Nanda, 2023): every patch of activation patching estimated at once, from
one forward pass on each input and one backward pass.

Patching a from the source run into the base run changes the metric m by about (a_source - a_base) .
dm/da, the gradient taken on the base run; divided by m(source) - m(base), that gives every table of
interp/patching.py at once (heads, head_positions, the residual stream, attention and MLP outputs
per position). It is exact where m is linear in the patched activation and drifts where a patch
moves an attention pattern or a softmax far: `compare` runs the real patching beside it and gives
their correlation per table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from interp.patching import (
    POSITION_POINTS,
    TABLES,
    cached_points,
    metric_ends,
    patch_task,
    tables_of,
)
from interp.scores import evaluating
from interp.tasks import Task
from model import GPT
from model.hooks import hooked, run_with_cache


def _gradients(model: GPT, task: Task, names: list[str]) -> tuple[dict, dict]:
    """The metric's gradient with respect to the base run's activation at each of `names`, and those
    activations. The embeddings are made a leaf that needs a gradient, so frozen weights change
    nothing."""
    acts: dict[str, torch.Tensor] = {}

    def leaf(x: torch.Tensor, name: str) -> torch.Tensor:
        return x.detach().requires_grad_(True)

    def keep(x: torch.Tensor, name: str) -> None:
        acts[name] = x

    with torch.enable_grad(), hooked(model, {"blocks.0.resid_pre": leaf}):
        with hooked(model, dict.fromkeys(names, keep)):
            logits, _ = model(task.base)
        metric = task.value(logits)
        grads = torch.autograd.grad(metric, [acts[name] for name in names])
    return {name: g.detach() for name, g in zip(names, grads)}, {
        n: a.detach() for n, a in acts.items()
    }


def attribute(model: GPT, task: Task, tables: Sequence[str] = TABLES) -> dict:
    """The estimated effect of every patch of `tables` (interp/patching.py's TABLES and shapes),
    source into base, with the metric on both runs ("metric_clean", "metric_corrupted")."""
    cfg = model.config
    names = cached_points(model, tables)
    with evaluating(model):
        with torch.no_grad():
            _, source = run_with_cache(model, task.source, names)
        grads, base = _gradients(model, task, names)
        ends = metric_ends(model, task)
    scale = ends[1] - ends[0]
    out = task.ends(*ends)
    for table in tables_of(model, tables):
        per_layer = []
        for layer in range(cfg.n_layer):
            name = f"blocks.{layer}.{'attn.z' if table.startswith('head') else table}"
            # (T, H) or (T,)
            terms = ((source[name] - base[name]) * grads[name]).double().sum(dim=(0, -1))
            if table == "heads":
                terms = terms.sum(dim=0)  # (H,): the head at every position at once
            elif table == "head_positions":
                terms = terms.T  # (H, T)
            per_layer.append(terms)
        values = torch.stack(per_layer) / scale
        out[table] = values.round(decimals=4).tolist()
    return out


def agreement(estimated, real) -> dict[str, float]:
    """How two tables' values agree: Pearson's correlation (nan when either is constant), the slope
    of the estimates against the real values (least squares through 0: 1 when they agree in size)
    and the mean error (estimate - real)."""
    x = np.ravel(np.asarray(real, dtype=float))
    y = np.ravel(np.asarray(estimated, dtype=float))
    slope = float((x * y).sum() / (x * x).sum()) if (x * x).sum() > 0 else float("nan")
    constant = x.std() == 0 or y.std() == 0
    return {
        "correlation": round(float("nan") if constant else float(np.corrcoef(x, y)[0, 1]), 4),
        "slope": round(slope, 4),
        "mean_error": round(float((y - x).mean()), 4),
    }


def compare(
    model: GPT, task: Task, tables: Sequence[str] = ("heads", "head_positions", *POSITION_POINTS)
):
    """Attribution patching beside activation patching on the same task: {"attribution": ...,
    "patching": ..., "correlation": {table: r}}."""
    start = time.perf_counter()
    estimated = attribute(model, task, tables)
    middle = time.perf_counter()
    real = patch_task(model, task, tables)
    return {
        "attribution": estimated,
        "patching": real,
        "agreement": {t: agreement(estimated[t], real[t]) for t in tables_of(model, tables)},
        "seconds": {
            "attribution": round(middle - start, 3),
            "patching": round(time.perf_counter() - middle, 3),
        },
    }


def format_attribution(result: dict, labels: list[str], top: int = 8) -> str:
    """The heads' table, the strongest head-position estimates, and (from `compare`) the
    agreement."""
    estimated = result.get("attribution", result)
    heads = np.array(estimated["heads"])
    lines = [
        f"attribution patching: metric {estimated['metric_clean']:+.3f} on the clean run, "
        f"{estimated['metric_corrupted']:+.3f} on the corrupted run; estimated fraction of the "
        "way each patch of the clean run into the corrupted one moves it:"
    ]
    real = np.array(result["patching"]["heads"]) if "patching" in result else None
    beside = "" if real is None else " (with --compare, the real patch's beside each)"
    width = 7 if real is None else 15
    lines += [
        f"  each head at every position at once{beside}:",
        "        " + "".join(f"{'H' + str(h):>{width}}" for h in range(heads.shape[1])),
    ]
    for layer, row in enumerate(heads):  # with --compare, each beside its real value
        cells = [
            f"{v:+7.2f}" + ("" if real is None else f" ({real[layer, h]:+.2f})")
            for h, v in enumerate(row)
        ]
        lines.append(f"  L{layer:<5}" + "".join(cells))
    cells = np.array(estimated["head_positions"]) if "head_positions" in estimated else None
    if cells is not None:
        order = np.argsort(-np.abs(cells), axis=None)[:top]
        named = [np.unravel_index(i, cells.shape) for i in order]
        lines.append(
            "  strongest heads at one position: "
            + ", ".join(f"L{l}H{h} at {p} “{labels[p]}” {cells[l, h, p]:+.2f}" for l, h, p in named)  # noqa: E741
        )
    if "agreement" in result:
        seconds = result["seconds"]
        lines.append(
            "against activation patching, per table: correlation, slope of the estimates against "
            "the real values (1: the same size), mean error (estimate - real):"
        )
        for t, a in result["agreement"].items():
            lines.append(
                f"  {t:<15} {a['correlation']:.3f}, slope {a['slope']:.2f}, mean error "
                f"{a['mean_error']:+.3f}"
            )
        lines.append(
            f"  {seconds['attribution']:.2f} s against {seconds['patching']:.2f} s "
            f"({seconds['patching'] / max(seconds['attribution'], 1e-9):.0f}x)"
        )
    return "\n".join(lines)
