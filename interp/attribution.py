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
    source into base, with the metric on both runs ("metric_base", "metric_source")."""
    cfg = model.config
    names = cached_points(model, tables)
    with evaluating(model):
        with torch.no_grad():
            _, source = run_with_cache(model, task.source, names)
        grads, base = _gradients(model, task, names)
        ends = metric_ends(model, task)
    scale = ends[1] - ends[0]
    out = {"metric_base": ends[0], "metric_source": ends[1]}
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


def correlation(a, b) -> float:
    """Pearson's correlation of two tables' values (nan when either is constant)."""
    x, y = np.ravel(np.asarray(a, dtype=float)), np.ravel(np.asarray(b, dtype=float))
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


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
        "correlation": {
            t: round(correlation(estimated[t], real[t]), 4) for t in tables_of(model, tables)
        },
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
        f"attribution patching: metric {estimated['metric_base']:+.3f} on the base run, "
        f"{estimated['metric_source']:+.3f} on the source run; estimated fraction of it each patch "
        "moves:",
        "  each head at every position at once:",
        "        " + "".join(f"{'H' + str(h):>7}" for h in range(heads.shape[1])),
    ]
    lines += [
        f"  L{layer:<5}" + "".join(f"{v:+7.2f}" for v in row) for layer, row in enumerate(heads)
    ]
    cells = np.array(estimated["head_positions"]) if "head_positions" in estimated else None
    if cells is not None:
        order = np.argsort(-np.abs(cells), axis=None)[:top]
        named = [np.unravel_index(i, cells.shape) for i in order]
        lines.append(
            "  strongest heads at one position: "
            + ", ".join(f"L{l}H{h} at {p} “{labels[p]}” {cells[l, h, p]:+.2f}" for l, h, p in named)  # noqa: E741
        )
    if "correlation" in result:
        seconds = result["seconds"]
        agreement = ", ".join(f"{t} {r:.3f}" for t, r in result["correlation"].items())
        lines.append(f"against activation patching, correlation per table: {agreement}")
        lines.append(
            f"  {seconds['attribution']:.2f} s against {seconds['patching']:.2f} s "
            f"({seconds['patching'] / max(seconds['attribution'], 1e-9):.0f}x)"
        )
    return "\n".join(lines)
