"""A circuit found from a task alone (heads.py --discover): every edge of the graph
(interp/graph.py) scored, then the smallest set of the strongest edges whose faithfulness
(interp/faithfulness.py) reaches a target.

Scores, each the fraction of the task's effect (m(model) - m(none)) one edge carries:
- exact edge patching: m(model) - m(model without the edge), one pass per edge from the edge's layer
  on (81 passes for the induction model); the default where the graph has at most EXACT_EDGES edges;
- EAP-IG (Hanna et al. 2024): (a_w - c_w) . dm/d(input_r), the gradient averaged over IG_STEPS runs
  whose embeddings go from their ablated to their clean values (midpoints); IG_STEPS forward and
  backward passes however many edges, the default for larger graphs;
- plain edge attribution (EAP, Syed et al. 2023), the gradient at the clean run alone, for
  comparison: it misses edges whose effect a softmax saturates (docs/heads.md). `--scores both` runs
  exact and EAP-IG and prints their `rank_agreement`. The circuit: the smallest k whose strongest k
  edges reach the target (`curve`), without the edges off every path from the embeddings to the
  logits."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch

from interp.edge_run import EdgeRun
from interp.faithfulness import (
    MINIMAL_DROP,
    TaskGraph,
    assess,
    connected,
    faithfulness,
    interval,
    metric_values,
    noise,
    normalise,
)
from interp.graph import ABLATION_WORDS, writer_outputs
from interp.scores import evaluating
from model.hooks import hooked

EXACT_EDGES = (
    1000  # graphs up to this many edges are scored by exact patching unless asked otherwise
)
IG_STEPS = 5
METHODS = ("auto", "exact", "eap-ig", "eap", "both")
GRID = 24  # curve points before the bisection


@torch.no_grad()
def exact_scores(setup: TaskGraph) -> torch.Tensor:
    """Each edge's effect: (m(model) - m(model without it)) / (m(model) - m(none)), (n_edges,)."""
    n = len(setup.graph)
    keep = torch.ones(n, n).fill_diagonal_(0)
    values = metric_values(setup, keep).mean(dim=1)
    return (setup.full.mean() - values) / (setup.full.mean() - setup.none.mean())


def _input_gradients(setup: TaskGraph, embeddings: Optional[torch.Tensor]) -> torch.Tensor:
    """dm/d(input_r) of every reader r on one run (the embeddings replaced, when given): (R, B, T,
    C)."""
    model = setup.model
    graph = setup.graph
    run = EdgeRun(model, graph, setup.ablation, torch.ones(1, len(graph)), dense=True)
    run.embeddings = embeddings
    with evaluating(model), hooked(model, run.hooks()):
        logits, _ = model(setup.task.clean)
    m = setup.rows(logits[None]).mean()
    stages = sorted(run.inputs)
    grads = torch.autograd.grad(m, [run.inputs[stage] for stage in stages])
    return torch.cat([g[0] for g in grads])  # the readers in stage order, as the graph has them


def _attribution(setup: TaskGraph, grads: torch.Tensor) -> torch.Tensor:
    """(a_w - c_w) . grads_r for every edge, as a fraction of the effect."""
    graph = setup.graph
    change = writer_outputs(setup.model, setup.task.clean) - setup.ablation.outputs
    scores = torch.zeros(len(graph))
    for r, reader in enumerate(graph.readers):
        writers = graph.stage_writers(reader.stage)
        edges = [graph.edge_index[w, r] for w in range(writers)]
        scores[edges] = torch.einsum("wbtc,btc->w", change[:writers], grads[r]).float()
    return scores / setup.gap


def eap_ig_scores(setup: TaskGraph, steps: int = IG_STEPS) -> torch.Tensor:
    """EAP-IG: the gradients averaged over `steps` runs with the embeddings between ablated and
    clean."""
    clean = writer_outputs(setup.model, setup.task.clean)[0]
    ablated = setup.ablation.outputs[0]
    grads = 0
    for k in range(steps):
        alpha = (k + 0.5) / steps
        grads = grads + _input_gradients(setup, ablated + alpha * (clean - ablated))
    return _attribution(setup, grads / steps).detach()


def eap_scores(setup: TaskGraph) -> torch.Tensor:
    """Plain edge attribution: the gradients at the clean run alone."""
    return _attribution(setup, _input_gradients(setup, None)).detach()


def ranks(x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x))
    out[np.argsort(x, kind="stable")] = np.arange(len(x))
    return out


def rank_agreement(scores: np.ndarray, reference: np.ndarray, positives: np.ndarray) -> dict:
    """Spearman's rho of two edge scorings, and the ROC AUC of `scores` at telling the `positives`
    (a boolean per edge: the reference circuit's edges) from the others."""
    rho = float(np.corrcoef(ranks(scores), ranks(reference))[0, 1])
    pos = scores[positives]
    neg = scores[~positives]
    if len(pos) == 0 or len(neg) == 0:
        auc = float("nan")
    else:
        auc = float(
            (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
        )
    return {"spearman": round(rho, 4), "roc_auc": round(auc, 4)}


def prefix_masks(order: list[int], sizes: list[int], n: int) -> torch.Tensor:
    keep = torch.zeros(len(sizes), n)
    for i, k in enumerate(sizes):
        keep[i, order[:k]] = 1
    return keep


def curve(
    setup: TaskGraph, order: list[int], target: float
) -> tuple[dict[int, float], Optional[int]]:
    """f of the strongest k edges on a grid of k (every k for a small graph), then bisected between
    the last grid point below `target` and the first at or above it: ({k: f}, the smallest k
    found)."""
    n = len(order)
    sizes = sorted({0, n, *np.unique(np.geomspace(1, n, GRID).round().astype(int)).tolist()})
    if n <= 2 * GRID:
        sizes = list(range(n + 1))
    f = dict(zip(sizes, faithfulness(setup, prefix_masks(order, sizes, n)).tolist()))
    above = [k for k in sizes if f[k] >= target]
    if not above:
        return f, None
    high = above[0]
    low = max(k for k in sizes if k < high) if high > 0 else 0
    while high - low > 1:
        middle = (low + high) // 2
        f[middle] = float(faithfulness(setup, prefix_masks(order, [middle], n))[0])
        low, high = (middle, high) if f[middle] < target else (low, middle)
    return dict(sorted(f.items())), high


def area(f: dict[int, float]) -> float:
    """The area under f against the share of edges kept (trapezoids between the measured points)."""
    k = np.array(list(f)) / max(f)
    return round(float(np.trapezoid(list(f.values()), k)), 4)


def score_edges(setup: TaskGraph, method: str) -> dict[str, torch.Tensor]:
    """The scorings a method asks for, with the seconds each took."""
    wanted = {"exact": ["exact"], "eap-ig": ["eap-ig"], "eap": ["eap"], "both": ["exact", "eap-ig"]}
    if method == "auto":
        method = "exact" if len(setup.graph) <= EXACT_EDGES else "eap-ig"
    functions = {"exact": exact_scores, "eap-ig": eap_ig_scores, "eap": eap_scores}
    out = {}
    seconds = {}
    for name in wanted[method]:
        start = time.perf_counter()
        out[name] = functions[name](setup)
        seconds[name] = round(time.perf_counter() - start, 3)
    return {"scores": out, "seconds": seconds}


def summary(setup: TaskGraph) -> dict:
    """The task, the ablation and the metric's two ends, for a report."""
    return {
        "task": setup.task.description,
        "ablation": setup.ablation.kind,
        "metric": setup.metric,
        "metric_model": round(float(setup.full.mean()), 4),
        "metric_none": round(float(setup.none.mean()), 4),
        "gap": round(setup.gap, 4),
        "noise": round(noise(setup), 4),
        "rows": len(setup.full),
    }


def cut(setup: TaskGraph, scores: dict, target: float) -> tuple[torch.Tensor, Optional[int], dict]:
    """The circuit from edge scores (exact ones where there are): the strongest k edges, k the
    smallest whose f reaches `target` (every edge if none does), less the edges off every path
    from the embeddings to the logits: (its mask, k or None, the curve {k: f})."""
    ranking = scores["exact"] if "exact" in scores else next(iter(scores.values()))
    order = torch.argsort(-ranking).tolist()
    points, k = curve(setup, order, target)
    keep = prefix_masks(order, [k if k is not None else len(order)], len(order))[0]
    return connected(setup.graph, keep), k, points


def discovered_circuit(setup: TaskGraph, target: float = 0.9) -> tuple[torch.Tensor, Optional[int]]:
    """The circuit alone, as --discover finds it by default: (its mask, k or None)."""
    keep, k, _ = cut(setup, score_edges(setup, "auto")["scores"], target)
    return keep, k


def discover(setup: TaskGraph, method: str = "auto", target: float = 0.9, seed: int = 0) -> dict:
    """Score every edge, find the circuit, assess it: JSON-ready (see the module's doc)."""
    found = score_edges(setup, method)
    scores = found["scores"]
    keep, k, points = cut(setup, scores, target)
    assessed = assess(setup, keep, seed, limit=16)
    result = {
        **summary(setup),
        "method": "+".join(scores),
        "seconds": found["seconds"],
        "target": target,
        "reached": k is not None,
        "prefix": k,
        "curve": {str(n): round(v, 4) for n, v in points.items()},
        "area": area(points),
        **assessed,
    }
    if len(scores) == 2:
        positives = keep.numpy() > 0
        result["agreement"] = rank_agreement(
            scores["eap-ig"].numpy(), scores["exact"].numpy(), positives
        )
    result["edges"] = edge_list(setup, scores, keep)
    return result


def held_out(setup: TaskGraph, keep: torch.Tensor, seed: int) -> dict:
    """The circuit's faithfulness measured again on another task's rows (`setup`'s)."""
    values = metric_values(setup, keep[None])[0]
    f = float(normalise(setup, values))
    return {
        "seed": seed,
        "rows": len(values),
        "faithfulness": round(f, 4),
        "interval": interval(setup, values),
    }


def kept_mask(setup: TaskGraph, edges: list[dict]) -> torch.Tensor:
    """The mask of the edges marked kept in a list as `edge_list` writes it."""
    keep = torch.zeros(len(setup.graph))
    for e in edges:
        if e.get("kept"):
            keep[setup.graph.find(e["from"], e["to"], e["kind"])] = 1
    return keep


def edge_list(setup: TaskGraph, scores: dict[str, torch.Tensor], keep: torch.Tensor) -> list[dict]:
    """Every edge: from, to, kind, its score(s), whether the circuit keeps it; strongest first."""
    out = []
    for e in range(len(setup.graph)):
        source, target, kind = setup.graph.edge_names(e)
        edge = {"from": source, "to": target, "kind": kind}
        for name, values in scores.items():
            edge["score" if len(scores) == 1 or name == "exact" else name] = round(
                float(values[e]), 4
            )
        out.append({**edge, "kept": bool(keep[e])})
    return sorted(out, key=lambda e: (-e["kept"], -abs(e["score"])))


def format_curve(curve: dict, points: int = 12) -> list[str]:
    """The curve as two rows, k and f, at most `points` columns (the measured ks, spread out)."""
    ks = [int(k) for k in curve]
    if len(ks) > points:
        ks = sorted({ks[round(i * (len(ks) - 1) / (points - 1))] for i in range(points)})
    return [
        "  k " + "".join(f"{k:>7}" for k in ks),
        "  f " + "".join(f"{curve[str(k)]:>7.2f}" for k in ks),
    ]


def format_edges(edges: list) -> str:
    """Edges as [from, to, kind, number]: "L0H0 -> L1H1 K +0.352, ..." (or "none")."""
    # an edge into the logits has no q, k or v to name: "L1H1 -> logits +0.301"
    kinds = ["" if e[2] == "logits" else f" {e[2].upper()}" for e in edges]
    return ", ".join(f"{a} -> {b}{k} {v:+.3f}" for (a, b, _, v), k in zip(edges, kinds)) or "none"


def format_discovery(found: dict) -> str:
    """--discover's report for people: the task and its gap, the curve, the circuit and its
    measures, the rank agreement, the strongest kept edges."""
    n = len(found["edges"])
    lines = [
        f"task: {found['task']}",
        f"  metric ({found['metric']}) {found['metric_model']:+.3f} with every edge, "
        f"{found['metric_none']:+.3f} with none: a gap of {found['gap']:.3f} "
        f"± {found['noise']:.3f} (standard error over the {found['rows']} rows); "
        f"{found['ablation']} ablation: {ABLATION_WORDS[found['ablation']]}",
    ]
    if found["rows"] > 1 and found["gap"] < 2 * found["noise"]:
        lines.append("  warning: the gap is within twice its standard error: f is a share of noise")
    seconds = ", ".join(f"{k} {v:.2f} s" for k, v in found["seconds"].items())
    lines += [
        f"  scored {n} edges by {found['method']} ({seconds})",
        "faithfulness f of the strongest k edges (1: all the model does, 0: none of it):",
        *format_curve(found["curve"]),
        f"  area under the curve {found['area']:.3f} (x: the share of the {n} edges kept)",
        *_format_cut(found),
    ]
    if "agreement" in found:
        a = found["agreement"]
        lines.append(
            f"EAP-IG against exact patching: Spearman {a['spearman']:.3f}; ROC AUC "
            f"{a['roc_auc']:.3f} at finding the exact circuit's edges"
        )
    kept = [(e["from"], e["to"], e["kind"], e["score"]) for e in found["edges"] if e["kept"]]
    lines.append("strongest kept edges: " + format_edges(kept[:8]))
    return "\n".join(lines)


def _format_cut(found: dict) -> list[str]:
    """The circuit the curve was cut at, and its measures."""
    low, high = found["interval"]
    if found["reached"]:
        lines = [
            f"circuit: {found['size']} edges reach f = {found['faithfulness']:.3f} [{low:.3f}, "
            f"{high:.3f}] (target {found['target']}; the strongest {found['prefix']}, less any "
            "edge off a path from the embeddings to the logits)"
        ]
    else:
        lines = [f"circuit: no set of the strongest edges reaches f = {found['target']}; all kept"]
    minimal = found["minimality"]
    lines += [
        f"  f is for {found['ablation']} ablation: another ablation gives another f (--ablation)",
        f"  incompleteness {found['incompleteness']['value']:.3f} (the most f that removing a set "
        "of its edges costs the circuit and the model differently)",
        f"  minimality {minimal['share']:.2f} of {minimal['edges']} edges each lower f by at least "
        f"{MINIMAL_DROP} when removed alone",
        f"  left out, the most: {format_edges(found['left_out'])}",
    ]
    if "held_out" in found:
        h = found["held_out"]
        lines.append(
            f"  on {h['rows']} other rows (seed {h['seed']}): f = {h['faithfulness']:.3f} "
            f"[{h['interval'][0]:.3f}, {h['interval'][1]:.3f}]"
        )
    return lines
