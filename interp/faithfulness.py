"""How much of a task's behaviour a circuit carries, what it leaves out, whether a smaller one does.

A circuit is a set of the graph's edges (interp/graph.py); the rest carry the ablated run (resample
by default). For the task's metric m (interp/tasks.py: the answer's log-probability, or a logit
difference; `--metric kl`: minus the KL divergence of the run's next-token distribution from the
clean one, where the metric reads), each row gives m(C), m(model) (every edge), m(none) (no edge):
- faithfulness f(C) = (m(C) - m(none)) / (m(model) - m(none)), the means over the rows, with a 90%
  bootstrap interval over them; 1: the circuit does all the model does, 0: nothing;
- incompleteness (Wang et al. 2022): the largest |m(C - K) - m(model - K)| over subsets K of C
  (`incompleteness`), normalised the same way: a complete circuit loses what the model loses;
- minimality: the share of C's edges whose removal alone lowers f by at least MINIMAL_DROP;
- the left-out edges that carry most: f(C + e) - f(C) for each edge e outside C.
Every number depends on the ablation: a circuit faithful under resample ablation need not be under
mean or zero ablation, whose "none" is another run. `assess` reports them all, JSON-ready."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from interp.edge_run import dense_copies, prefers_dense, run_edges
from interp.graph import Ablation, Graph, ablation_of, model_graph, reader_layer
from interp.interventions import rows_per_pass
from interp.scores import evaluating
from interp.tasks import Task
from model import GPT

METRICS = ("task", "kl")
MINIMAL_DROP = 0.01  # an edge is needed when removing it alone lowers f by this much
BOOTSTRAP = 400  # resamples of the rows for f's interval
RANDOM_SUBSETS = 8  # incompleteness: random subsets K of the circuit
GREEDY_STEPS = 3  # incompleteness: edges a greedy K grows to
CANDIDATES = 8  # incompleteness: edges tried at each greedy step
MINIMALITY_SAMPLE = 64  # minimality: at most this many of the circuit's edges, drawn at random
LEFT_OUT = 5  # the left-out edges listed


@dataclass
class TaskGraph:
    """What every measurement of circuits on one task shares."""

    model: GPT
    graph: Graph
    task: Task
    ablation: Ablation
    metric: str  # "task" or "kl"
    full: torch.Tensor  # m(model) per row, (B,)
    none: torch.Tensor  # m(none) per row, (B,)
    clean_logp: Optional[torch.Tensor] = (
        None  # kl: the clean run's log-probabilities where it reads
    )

    @property
    def gap(self) -> float:
        return float((self.full - self.none).mean())

    def rows(self, logits: torch.Tensor) -> torch.Tensor:
        """The metric of each row of logits (G, B, T, vocab): (G, B)."""
        if self.metric == "task":
            return self.task.metric(logits, slice(None)).float()
        logp = F.log_softmax(logits[..., self.task.positions, :].float(), dim=-1)
        kl = (self.clean_logp.exp() * (self.clean_logp - logp)).sum(dim=-1)
        return -kl.mean(dim=-1)


def prepare(model: GPT, task: Task, ablation: str = "resample", metric: str = "task") -> TaskGraph:
    """The graph, the ablated outputs and the two ends of the metric for `task`."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: {', '.join(METRICS)}")
    graph = model_graph(model)
    with evaluating(model), torch.no_grad():
        setup = TaskGraph(
            model, graph, task, ablation_of(model, ablation, task.corrupted), metric, None, None
        )
        if metric == "kl":
            logits = model(task.clean)[0][:, task.positions]
            setup.clean_logp = F.log_softmax(logits.float(), dim=-1)
        ends = metric_values(setup, torch.stack([torch.ones(len(graph)), torch.zeros(len(graph))]))
    setup.full = ends[0]
    setup.none = ends[1]
    return setup


def _start(graph: Graph, keep: torch.Tensor) -> int:
    """The first layer a mask changes (where its copy splits from the shared pass)."""
    removed = (keep < 1).nonzero()[:, 0].tolist()
    return min((reader_layer(graph, e) for e in removed), default=graph.n_layer - 1)


@torch.no_grad()
def metric_values(setup: TaskGraph, keep: torch.Tensor) -> torch.Tensor:
    """m of every row under each mask of keep (G, n_edges): (G, B). Masks that change only late
    layers share the pass up to there; masks near the model's run sparse, the others dense, each
    pass as many as fit (interp/edge_run.py)."""
    model = setup.model
    graph = setup.graph
    task = setup.task
    B, T = task.clean.shape
    starts = [_start(graph, k) for k in keep]
    dense = prefers_dense(graph, keep).tolist()
    out = torch.empty(len(keep), B)
    with evaluating(model):
        for kind in (False, True):
            per_pass = dense_copies(model, graph, B, T) if kind else rows_per_pass(model, T) // B
            which = sorted(
                (g for g in range(len(keep)) if dense[g] == kind), key=lambda g: -starts[g]
            )
            for at in range(0, len(which), max(1, per_pass)):
                part = which[at : at + max(1, per_pass)]
                start = min(starts[g] for g in part)
                logits = run_edges(
                    model, graph, task.clean, setup.ablation, keep[part], start, kind
                )
                out[part] = setup.rows(logits).cpu()
    return out


def normalise(setup: TaskGraph, values: torch.Tensor) -> torch.Tensor:
    """Metric values (..., B) as faithfulness, the means over the rows: (...)."""
    full = setup.full.mean()
    none = setup.none.mean()
    return (values.mean(dim=-1) - none) / (full - none)


def faithfulness(setup: TaskGraph, keep: torch.Tensor) -> torch.Tensor:
    """f of each mask of keep (G, n_edges): (G,)."""
    return normalise(setup, metric_values(setup, keep))


def _resampled(setup: TaskGraph, values: torch.Tensor, seed: int) -> np.ndarray:
    """f on BOOTSTRAP resamples of the rows, less those whose gap is 0 (f a share of nothing)."""
    gen = np.random.default_rng(seed)
    rows = torch.from_numpy(gen.integers(0, len(values), size=(BOOTSTRAP, len(values))))
    full = setup.full[rows].mean(dim=1)
    none = setup.none[rows].mean(dim=1)
    f = ((values[rows].mean(dim=1) - none) / (full - none)).numpy()
    return f[np.isfinite(f)]


def interval(setup: TaskGraph, values: torch.Tensor, seed: int = 0) -> tuple[float, float]:
    """f's 90% bootstrap interval over the rows, from one mask's metric values (B,); (nan, nan)
    where no resample has a gap (`interval_or_reason` says why)."""
    f = _resampled(setup, values, seed)
    if len(f) == 0:
        return float("nan"), float("nan")
    low, high = np.quantile(f, [0.05, 0.95])
    return round(float(low), 4), round(float(high), 4)


def interval_or_reason(setup: TaskGraph, values: torch.Tensor, seed: int = 0) -> dict:
    """{"interval": [low, high]}, or {"missing": {"interval": why there is none}}: one row (every
    resample is that row), resamples of the rows whose gap is 0, or every resample giving the same
    f (a circuit whose left-out edges change nothing: f = 1 on every row)."""
    if len(values) < 2:
        why = "one row, which every resample of the rows repeats (an interval needs two or more)"
        return {"missing": {"interval": why}}
    f = _resampled(setup, values, seed)
    if len(f) < 0.9 * BOOTSTRAP:
        why = (
            f"{BOOTSTRAP - len(f)} of {BOOTSTRAP} resamples of the rows have no gap between every "
            "edge and none: rows with a gap of 0 carry no share"
        )
        return {"missing": {"interval": why}}
    # an interval of no width: say why rather than print [f, f]
    if torch.equal(values, setup.full):
        why = (
            "the circuit's metric equals the model's on every row (each edge left out changes "
            "nothing: it scores exactly 0), so every resample of the rows gives f = 1"
        )
        return {"missing": {"interval": why}}
    if np.ptp(f) < 1e-6:  # the same up to float rounding
        why = f"every resample of the rows gives the same f, {f[0]:.3f}: an interval of no width"
        return {"missing": {"interval": why}}
    return {"interval": list(interval(setup, values, seed))}


def noise(setup: TaskGraph) -> Optional[float]:
    """The standard error of the clean-corrupted gap over the rows (None for one row: no spread)."""
    diff = setup.full - setup.none
    return float(diff.std() / len(diff) ** 0.5) if len(diff) > 1 else None


def connected(graph: Graph, keep: torch.Tensor) -> torch.Tensor:
    """keep (n_edges,) without the edges off every path from the embeddings to the logits: under
    resample ablation they change nothing (a node no kept path reaches computes its corrupted
    output; one whose output reaches no logit is not read)."""
    kept = [graph.edges[e] for e in keep.nonzero()[:, 0].tolist()]
    node = {r: graph.readers[r].node for _, r in kept}
    writer_of = {name: w for w, name in enumerate(graph.writers)}
    reached = {0}
    live = {len(graph.writers)}
    for w, r in sorted(kept, key=lambda e: graph.writer_stage[e[0]]):  # writers in forward order
        if w in reached and node[r] in writer_of:
            reached.add(writer_of[node[r]])
    for w, r in sorted(kept, key=lambda e: -graph.writer_stage[e[0]]):  # and backward
        if writer_of.get(node[r], len(graph.writers)) in live:
            live.add(w)
    out = torch.zeros_like(keep)
    for e in keep.nonzero()[:, 0].tolist():
        w, r = graph.edges[e]
        if w in reached and w in live and writer_of.get(node[r], len(graph.writers)) in live:
            out[e] = 1
    return out


def _without(keep: torch.Tensor, edges: list[int]) -> torch.Tensor:
    out = keep.clone()
    out[edges] = 0
    return out


def incompleteness(setup: TaskGraph, keep: torch.Tensor, seed: int = 0) -> dict:
    """The largest |m(C - K) - m(model - K)| / (m(model) - m(none)) over the subsets K tried: random
    halves of C, then K grown greedily, one edge at a time, towards the largest difference."""
    inside = keep.nonzero()[:, 0].tolist()
    if not inside:
        return {"value": 0.0, "removed": []}
    gen = np.random.default_rng(seed)
    everything = torch.ones_like(keep)
    tried = [[e for e in inside if gen.random() < 0.5] for _ in range(RANDOM_SUBSETS)]
    values = _gaps(setup, keep, everything, tried)
    best = int(np.argmax(values))
    worst = values[best]
    subset = tried[best]
    grown: list[int] = []
    for _ in range(min(GREEDY_STEPS, len(inside))):
        rest = [e for e in inside if e not in grown]
        candidates = [int(e) for e in gen.permutation(rest)[:CANDIDATES]]
        values = _gaps(setup, keep, everything, [grown + [e] for e in candidates])
        grown.append(candidates[int(np.argmax(values))])
        if max(values) > worst:
            worst = max(values)
            subset = list(grown)
    names = [setup.graph.edge_names(e) for e in subset]
    return {"value": round(float(worst), 4), "removed": [list(n) for n in names]}


def _gaps(setup: TaskGraph, keep, everything, subsets: list[list[int]]) -> list[float]:
    masks = [_without(keep, K) for K in subsets] + [_without(everything, K) for K in subsets]
    values = metric_values(setup, torch.stack(masks)).mean(dim=1)
    scale = setup.full.mean() - setup.none.mean()
    n = len(subsets)
    return [abs(float((values[i] - values[n + i]) / scale)) for i in range(n)]


def minimality(setup: TaskGraph, keep: torch.Tensor, f: float, seed: int = 0) -> dict:
    """The share of the circuit's edges (at most MINIMALITY_SAMPLE of them, drawn at random) whose
    removal alone lowers f by at least MINIMAL_DROP, and the least needed ones."""
    inside = keep.nonzero()[:, 0].tolist()
    if not inside:
        return {"share": None, "edges": 0, "weakest": []}
    if len(inside) > MINIMALITY_SAMPLE:
        gen = np.random.default_rng(seed)
        inside = sorted(int(e) for e in gen.choice(inside, MINIMALITY_SAMPLE, replace=False))
    drops = f - faithfulness(setup, torch.stack([_without(keep, [e]) for e in inside]))
    weakest = sorted(zip(drops.tolist(), inside))[:LEFT_OUT]
    return {
        "share": round(float((drops >= MINIMAL_DROP).float().mean()), 4),
        "edges": len(inside),
        "weakest": [[*setup.graph.edge_names(e), round(d, 4)] for d, e in weakest],
    }


def left_out(setup: TaskGraph, keep: torch.Tensor, f: float, limit: Optional[int] = None) -> list:
    """The edges outside the circuit that add most to f when added alone: [from, to, kind, f gain].
    With more than `limit` of them, only the `limit` a gradient at the circuit ranks highest are
    run."""
    outside = (keep == 0).nonzero()[:, 0].tolist()
    if limit is not None and len(outside) > limit:
        mask = keep.clone().requires_grad_(True)
        with evaluating(setup.model):
            logits = run_edges(
                setup.model, setup.graph, setup.task.clean, setup.ablation, mask[None]
            )
            (grad,) = torch.autograd.grad(setup.rows(logits).mean(), mask)
        outside = sorted(outside, key=lambda e: -float(grad[e]))[:limit]
    if not outside:
        return []
    added = torch.stack([keep.index_fill(0, torch.tensor([e]), 1.0) for e in outside])
    gains = faithfulness(setup, added) - f
    best = sorted(zip(gains.tolist(), outside), reverse=True)[:LEFT_OUT]
    return [[*setup.graph.edge_names(e), round(g, 4)] for g, e in best]


def assess(
    setup: TaskGraph, keep: torch.Tensor, seed: int = 0, limit: Optional[int] = None
) -> dict:
    """Every measure of the circuit `keep` (n_edges,), JSON-ready: f's interval where there is one,
    else "missing" saying why (interval_or_reason)."""
    values = metric_values(setup, keep[None])[0]
    f = float(normalise(setup, values))
    return {
        "size": int(keep.sum()),
        "faithfulness": round(f, 4),
        **interval_or_reason(setup, values, seed),  # "interval", or "missing" saying why none
        "incompleteness": incompleteness(setup, keep, seed),
        "minimality": minimality(setup, keep, f, seed),
        "left_out": left_out(setup, keep, f, limit),
    }
