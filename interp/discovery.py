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
    interval_or_reason,
    metric_values,
    noise,
    normalise,
)
from interp.graph import ABLATION_WORDS, writer_outputs
from interp.scores import evaluating
from interp.task_circuit import MIN_CHANGE
from model.hooks import hooked

EXACT_EDGES = (
    1000  # graphs up to this many edges are scored by exact patching unless asked otherwise
)
IG_STEPS = 5
METHODS = ("auto", "exact", "eap-ig", "eap", "both")
GRID = 24  # curve points before the bisection
KL_WORDS = "minus the KL divergence of the run's next-token predictions from the clean run's"
# discovered.json's fields, written into it ("fields") and docs/heads.md
FIELDS = {
    "task": "the task: its inputs and its own metric",
    "ablation": "what a removed edge carries: resample (its output on the corrupted input), mean "
    "or zero",
    "metric": f"what f reads: task (the task's own metric) or kl ({KL_WORDS})",
    "metric_model": "the metric with every edge kept (the model), the mean over the rows",
    "metric_none": "the metric with no edge kept (the ablated run), the mean over the rows",
    "gap": "metric_model - metric_none: what the model does on the task; f is a share of it",
    "noise": "the gap's standard error over the rows",
    "rows": "the task's rows (sequences, windows or lines)",
    "method": "how the edges were scored: exact (patching), eap-ig, eap, or exact+eap-ig",
    "seconds": "the time each scoring took",
    "target": "the f the circuit had to reach (--target)",
    "reached": "whether the strongest k edges reach the target for some k (else all are kept)",
    "prefix": "k: the strongest edges the circuit was cut at (all of them where the target is not "
    "reached), before the edges off every path from the embeddings to the logits are dropped",
    "curve": "f of the strongest k edges, for each k measured",
    "area": "the area under the curve against the share of the edges kept (x from 0 to 1, "
    "linear, as discovered.png draws it); above 1 where sets of the strongest edges carry more "
    "than the whole model (f > 1: edges left out there work against the task)",
    "size": "the circuit's edges",
    "faithfulness": "f = (m(circuit) - metric_none) / gap: the share of the gap the circuit "
    "carries (1: all the model does, 0: none of it)",
    "interval": "f's 90% bootstrap interval over the rows",
    "incompleteness": "the most f that removing a set K of its edges costs the circuit and the "
    "model differently (K: `removed`)",
    "minimality": "the share of its edges (at most 64 tried) whose removal alone lowers f by at "
    "least 0.01, and the least needed ones",
    "left_out": "the edges outside that raise f most when added alone: [from, to, kind, gain]",
    "held_out": "f measured again on other rows (a built-in task's next seed)",
    "agreement": "with --scores both: EAP-IG's ranking against exact patching's (Spearman's rho, "
    "ROC AUC at finding the exact circuit's edges)",
    "edges": "every edge: from, to, kind (q, k, v, mlp or logits), score (the share of the gap "
    "the edge carries alone: the metric's fall when it alone is removed, over the gap), kept",
    "missing": "the numbers that could not be given, each with why",
}


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
    (a boolean per edge: the reference circuit's edges) from the others; where one has no value,
    "missing" says why."""
    out: dict = {}
    missing = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = float(np.corrcoef(ranks(scores), ranks(reference))[0, 1])
    if np.isfinite(rho):
        out["spearman"] = round(rho, 4)
    else:
        missing["spearman"] = "one of the scorings gives every edge the same score"
    pos = scores[positives]
    neg = scores[~positives]
    if len(pos) == 0 or len(neg) == 0:
        missing["roc_auc"] = "the circuit holds every edge or none: nothing to tell apart"
    else:
        auc = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
        out["roc_auc"] = round(float(auc), 4)
    return out | ({"missing": missing} if missing else {})


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
    """The area under f against the share of edges kept, k / n from 0 to 1 on a linear axis, as
    discovered.png and the explorer page draw it (trapezoids between the measured points). Not
    bounded by 1: where the strongest k edges carry more than the whole model (f > 1, the edges
    left out working against the task) the curve rises above 1, and so can the area (1.026 on
    docs/heads/words.jsonl); `area_words` says so where it happens."""
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
    spread = noise(setup)
    return {
        "task": setup.task.description,
        "ablation": setup.ablation.kind,
        "metric": setup.metric,
        "metric_model": round(float(setup.full.mean()), 4),
        "metric_none": round(float(setup.none.mean()), 4),
        "gap": round(setup.gap, 4),
        **({"noise": round(spread, 4)} if spread is not None else {}),
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
    bounds = {"interval": assessed.pop("interval")} if "interval" in assessed else {}
    missing = assessed.pop("missing", {})
    result = {
        **summary(setup),
        "method": "+".join(scores),
        "seconds": found["seconds"],
        "target": target,
        "reached": k is not None,
        "prefix": k if k is not None else len(setup.graph),
        "curve": {str(n): round(v, 4) for n, v in points.items()},
        "area": area(points),
        **assessed,
        **bounds,
    }
    if len(scores) == 2:
        positives = keep.numpy() > 0
        result["agreement"] = rank_agreement(
            scores["eap-ig"].numpy(), scores["exact"].numpy(), positives
        )
        missing |= result["agreement"].pop("missing", {})
    if "noise" not in result:
        missing["noise"] = "one row, whose gap has no spread (a standard error needs two or more)"
    if missing:
        result["missing"] = missing
    result["edges"] = edge_list(setup, scores, keep)
    result["fields"] = FIELDS
    return result


def held_out(setup: TaskGraph, keep: torch.Tensor, seed: int) -> dict:
    """The circuit's faithfulness measured again on another task's rows (`setup`'s); none where
    their gap is under MIN_CHANGE ("missing" says so)."""
    values = metric_values(setup, keep[None])[0]
    out = {"seed": seed, "rows": len(values), "gap": round(setup.gap, 4)}
    if not setup.gap >= MIN_CHANGE:
        why = f"the gap on these rows is {setup.gap:.3f}, under {MIN_CHANGE}: too little to share"
        return out | {"missing": {"faithfulness": why}}
    return (
        out
        | {"faithfulness": round(float(normalise(setup, values)), 4)}
        | interval_or_reason(setup, values)
    )


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
    task = f"task: {found['task']}"
    if found["metric"] == "kl":  # the task's own metric is not the one measured
        task += f"; measured instead by --metric kl: {KL_WORDS}, where the task reads"
    if "noise" in found:
        spread = f" ± {found['noise']:.3f} (standard error over the {found['rows']} rows)"
    else:
        spread = f" (no standard error: {found['missing']['noise']})"
    lines = [
        task,
        f"  metric ({found['metric']}) {found['metric_model']:+.3f} with every edge, "
        f"{found['metric_none']:+.3f} with none: a gap of {found['gap']:.3f}{spread}; "
        f"{found['ablation']} ablation: {ABLATION_WORDS[found['ablation']]}",
    ]
    if "noise" in found and found["gap"] < 2 * found["noise"]:
        lines.append("  warning: the gap is within twice its standard error: f is a share of noise")
    seconds = ", ".join(f"{k} {v:.2f} s" for k, v in found["seconds"].items())
    lines += [
        f"  scored {n} edges by {found['method']} ({seconds})",
        "faithfulness f of the strongest k edges (1: all the model does, 0: none of it):",
        *format_curve(found["curve"]),
        *area_words(found),
        *_format_cut(found),
    ]
    if "agreement" in found:
        a = found["agreement"]
        missing = found.get("missing", {})
        rho = f"{a['spearman']:.3f}" if "spearman" in a else f"none ({missing['spearman']})"
        auc = f"{a['roc_auc']:.3f}" if "roc_auc" in a else f"none ({missing['roc_auc']})"
        lines.append(
            f"EAP-IG against exact patching: Spearman {rho}; ROC AUC {auc} at finding the exact "
            "circuit's edges"
        )
    kept = [(e["from"], e["to"], e["kind"], e["score"]) for e in found["edges"] if e["kept"]]
    lines.append("strongest kept edges: " + format_edges(kept[:8]))
    return "\n".join(lines)


def area_words(found: dict) -> list[str]:
    """The area's line, and where the curve overshoots 1, what an area (or an f) above 1 means."""
    n = len(found["edges"])
    lines = [
        f"  area under the curve {found['area']:.3f} (x: the share of the {n} edges kept, 0 to 1 "
        "on a linear axis, as discovered.png draws it)"
    ]
    top, k = max(((f, int(k)) for k, f in found["curve"].items()), key=lambda p: (p[0], -p[1]))
    if top > 1:
        lines.append(
            f"  the curve rises above 1 (f = {top:.3f} with the strongest {k}): those edges carry "
            "more than the whole model, the ones left out working against the task; so f, and the "
            "area, can exceed 1"
        )
    return lines


def _bounds(found: dict) -> str:
    """f's interval, or why there is none."""
    if "interval" in found:
        return f"[{found['interval'][0]:.3f}, {found['interval'][1]:.3f}]"
    return f"(no interval: {found['missing']['interval']})"


def _format_cut(found: dict) -> list[str]:
    """The circuit the curve was cut at, and its measures."""
    f = f"f = {found['faithfulness']:.3f} {_bounds(found)}"
    if found["reached"]:
        lines = [
            f"circuit: {found['size']} edges reach {f} (target {found['target']}; the strongest "
            f"{found['prefix']}, less any edge off a path from the embeddings to the logits)"
        ]
    else:
        lines = [
            f"circuit: no set of the strongest edges reaches f = {found['target']}; all "
            f"{found['size']} kept: {f}"
        ]
    minimal = found["minimality"]
    share = "none" if minimal["share"] is None else f"{minimal['share']:.2f}"
    lines += [
        f"  f is for {found['ablation']} ablation: another ablation gives another f (--ablation)",
        f"  incompleteness {found['incompleteness']['value']:.3f} (the most f that removing a set "
        "of its edges costs the circuit and the model differently)",
        f"  minimality {share} of {minimal['edges']} edges each lower f by at least "
        f"{MINIMAL_DROP} when removed alone",
        f"  left out, the most: {format_edges(found['left_out'])}",
    ]
    if "held_out" in found:
        lines += _format_held_out(found["held_out"], found["target"])
    return lines


def _format_held_out(h: dict, target: float) -> list[str]:
    """The circuit's f on other rows, and a remark where it falls below the target."""
    where = f"  on {h['rows']} other rows (seed {h['seed']}):"
    if "faithfulness" not in h:
        return [f"{where} no f ({h['missing']['faithfulness']})"]
    lines = [f"{where} f = {h['faithfulness']:.3f} {_bounds(h)}"]
    if h["faithfulness"] < target:
        lines.append(
            f"  below the target {target} there: the circuit was cut to reach it on the rows it "
            "was found on and carries less of the task on others; one found on more rows "
            "(--sequences) or for a higher --target may hold better"
        )
    return lines
