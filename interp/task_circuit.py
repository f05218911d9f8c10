"""The circuit behind a task (heads.py --circuit): the heads and MLPs that matter, the edges between
them, each with what the weights say (its composition score) and what running the model says (its
path-patching effect), the nodes that write the answer, and how much of the task the whole carries.

On a task of interp/tasks.py (by default [R, R] against [R', R]), in the noising direction (what
breaks when one thing alone is corrupted): nodes are the heads and MLPs whose patch
(interp/patching.py) moves the metric at least NODE_THRESHOLD of the way (at most MAX_NODES); edges
are the graph's (interp/graph.py) from the embeddings and each node into a later node (a head's q,
k or v, an MLP's input) and into the logits (its direct effect), each scored by path patching
(interp/paths.py), those reaching EDGE_THRESHOLD kept, head to head with its composition score
(interp/circuits.py); the heads' direct logit attribution (interp/lens.py). Each number is a
fraction of the clean-to-corrupted change of the metric (but the attribution: logits), with its
standard error over the task's rows. The kept edges' faithfulness, incompleteness and minimality
are interp/faithfulness.py's. The induction model's
circuit: docs/heads.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np
import torch

from interp.circuits import KINDS, all_composition_scores, composition_baseline, copying_scores
from interp.faithfulness import assess, prepare
from interp.graph import EMBEDDINGS, LOGITS, Graph, mlp_name, model_graph
from interp.interventions import Edit
from interp.lens import direct_attribution, head_attributions
from interp.patching import cached_points, metric_ends, patch_edits, row_effects
from interp.paths import path_effects
from interp.scores import HEAD_NAME, THRESHOLD, evaluating, head_name, head_roles
from interp.tasks import Task
from interp.weights import head_weights
from model import GPT
from model.hooks import run_with_cache

NODE_THRESHOLD = 0.05  # a node when patching it alone goes this fraction of the way
EDGE_THRESHOLD = 0.05  # an edge is in the circuit when its path alone goes this fraction of the way
MAX_NODES = 12  # the strongest nodes kept (edges cost three path patches per pair)
# the clean run's metric must beat the corrupted run's by this much (nats or logits)
MIN_CHANGE = 0.1
# why one row (--circuit CLEAN CORRUPTED, --sequences 1) gives no standard error, in circuit.json
ONE_ROW = "one row, which has no spread (a standard error needs two or more)"


def answer_attribution(model: GPT, task: Task) -> np.ndarray:
    """Every head's direct logit attribution to the answers the task's metric reads on the clean run
    (its `answers`, weighted), (n_layer, n_head)."""
    cfg = model.config
    by_round: dict[tuple[int, int], dict[int, tuple[int, float]]] = defaultdict(dict)
    # one round per (row, k-th answer at a position)
    for row, position, token, weight in task.answers:
        k = 0
        while position in by_round[row, k]:
            k += 1
        by_round[row, k][position] = (token, weight)
    total = np.zeros((cfg.n_layer, cfg.n_head))
    for (row, _), answers in by_round.items():
        ids = task.clean[row].tolist()
        last = max(answers) + 1
        targets = [
            answers[p][0] if p in answers else ids[min(p + 1, len(ids) - 1)] for p in range(last)
        ]
        heads = head_attributions(direct_attribution(model, ids, targets), cfg.n_layer, cfg.n_head)
        for p, (_, weight) in answers.items():
            total += weight * heads[p]
    return total


def node_effects(model: GPT, noised: Task) -> tuple[list[str], torch.Tensor]:
    """Every head's and MLP's effect on each row when its output alone is patched:
    (names, (N, B))."""
    cfg = model.config
    with evaluating(model):
        points = cached_points(model, ("heads",)) + [
            f"blocks.{layer}.mlp_out" for layer in range(cfg.n_layer) if cfg.mlp
        ]
        _, cache = run_with_cache(model, noised.source, points)
        edits = patch_edits(model, cache, ("heads",))["heads"]
        if cfg.mlp:
            for layer in range(cfg.n_layer):
                value = cache[f"blocks.{layer}.mlp_out"]
                edits.append([Edit("mlp_out", layer, value, per_row=True)])
        found = row_effects(model, noised, edits, metric_ends(model, noised))
    names = [head_name(layer, head) for layer in range(cfg.n_layer) for head in range(cfg.n_head)]
    return names + [mlp_name(layer) for layer in range(cfg.n_layer) if cfg.mlp], found


def select_nodes(names: list[str], effects: list[float], stage: dict[str, int]) -> list[str]:
    """The nodes whose patch goes at least NODE_THRESHOLD of the way (at most MAX_NODES, the
    strongest), in the order of the forward pass (`stage`: each writer's, interp/graph.py's)."""
    strong = sorted(
        ((abs(e), n) for n, e in zip(names, effects) if abs(e) >= NODE_THRESHOLD), reverse=True
    )
    kept = [n for _, n in strong[:MAX_NODES]]
    return sorted(kept, key=lambda n: (stage[n], n))


def _role(
    roles: Optional[list[list[dict]]], layer: int, head: int
) -> tuple[Optional[str], Optional[float]]:
    if roles is None or roles[layer][head]["score"] < THRESHOLD:
        return None, None if roles is None else roles[layer][head]["score"]
    return roles[layer][head]["role"], roles[layer][head]["score"]


def _mean_se(rows: torch.Tensor) -> tuple[float, Optional[float]]:
    """A row effect's mean and its standard error over the rows (None for one row: no spread)."""
    n = rows.numel()
    se = round(float(rows.std() / n**0.5), 4) if n > 1 else None
    return round(float(rows.mean()), 4), se


def _with_se(out: dict, key: str, rows: torch.Tensor) -> dict:
    """out with out[key] the rows' mean and out[key_se] its standard error, where there is one."""
    out[key], se = _mean_se(rows)
    return out if se is None else out | {f"{key}_se": se}


def _pm(item: dict, key: str) -> str:
    """ " ± item[key_se]" for a figure with a standard error, "" for one without (one row)."""
    se = item.get(f"{key}_se")
    return "" if se is None else f" ± {se:.2f}"


def head_of(node: str) -> Optional[tuple[int, int]]:
    """A head's (layer, head), None for another node."""
    head = HEAD_NAME.fullmatch(node)
    return (int(head.group(1)), int(head.group(2))) if head else None


def measure_edges(
    model: GPT, noised: Task, graph: Graph, nodes: list[str], composition: dict
) -> list[dict]:
    """The graph's edges from the embeddings or a node into a later node, and from a node into the
    logits, path-patched: JSON-ready edges, the strongest first."""
    n_head = model.config.n_head
    stage = dict(zip(graph.writers, graph.writer_stage))
    pairs = [
        (s, r, kind)
        for s in [EMBEDDINGS, *nodes]
        for r in nodes
        if stage[s] < stage[r]
        for kind in (("mlp",) if r.startswith("MLP") else KINDS)
    ] + [(s, LOGITS, LOGITS) for s in nodes]
    paths = [([s], [graph.reader(r, kind)]) for s, r, kind in pairs]
    found = path_effects(model, noised, paths, rows=True)
    edges = []
    for (s, r, kind), rows in zip(pairs, found):
        edge = {"from": s, "to": r, "kind": kind}
        heads = [head_of(n) for n in (s, r)]
        if all(heads):  # two heads: their weights' composition
            (a, b), (c, d) = heads
            score = composition[kind][a * n_head + b, c * n_head + d]
            edge["composition"] = round(float(score), 4)
        edges.append(_with_se(edge, "effect", rows))
    return sorted(edges, key=lambda e: -abs(e["effect"]))


def find_circuit(
    model: GPT, task: Task, scores: Optional[dict] = None, ablation: str = "resample"
) -> dict:
    """The circuit of `task` (see the module's doc) as JSON-ready data: "nodes", "edges" (in the
    circuit, those into the logits included) and "weaker_edges" (measured, below EDGE_THRESHOLD),
    what fell below the cut, the task's gap, the composition baseline and the circuit's
    faithfulness under `ablation`. `scores`: interp.scores.score_heads' result, to name each head's
    role. ValueError from `gap_of`."""
    gap = gap_of(model, task)
    noised = task.noised()
    weights = head_weights(model)
    baseline = composition_baseline(weights)
    names, rows = node_effects(model, noised)
    means = rows.mean(dim=1).tolist()
    graph = model_graph(model)
    nodes = select_nodes(names, means, dict(zip(graph.writers, graph.writer_stage)))
    edges = measure_edges(model, noised, graph, nodes, all_composition_scores(weights))
    kept = [e for e in edges if abs(e["effect"]) >= EDGE_THRESHOLD]
    circuit = {
        "task": task.description,
        **gap,
        "direction": noised.direction,
        "thresholds": {"node": NODE_THRESHOLD, "edge": EDGE_THRESHOLD},
        "composition_baseline": {"mean": round(baseline[0], 4), "std": round(baseline[1], 4)},
        "head_effects": np.array(means[: len(names) - model.config.n_layer * model.config.mlp])
        .reshape(model.config.n_layer, -1)
        .round(4)
        .tolist(),
        "nodes": _nodes(model, task, nodes, names, rows, edges, scores, weights),
        "edges": kept,
        "weaker_edges": [e for e in edges if abs(e["effect"]) < EDGE_THRESHOLD],
        "below": sorted(
            ([n, round(e, 4)] for n, e in zip(names, means) if n not in nodes),
            key=lambda p: -abs(p[1]),
        )[:5],
    }
    circuit.update(_faithfulness(model, task, kept, ablation))
    if "se" not in gap["gap"]:
        circuit["missing"] = {"standard_errors": ONE_ROW}
    return circuit


def _faithfulness(model: GPT, task: Task, kept: list[dict], ablation: str) -> dict:
    """The circuit's edges as a set of the graph's, assessed (interp/faithfulness.py)."""
    setup = prepare(model, task, ablation)
    keep = torch.zeros(len(setup.graph))
    for e in kept:
        keep[setup.graph.find(e["from"], e["to"], e["kind"])] = 1
    return {"faithfulness": {"ablation": ablation, **assess(setup, keep, limit=16)}}


@torch.no_grad()
def gap_of(model: GPT, task: Task) -> dict:
    """The metric on the clean and the corrupted input, their gap and its standard error over the
    rows (a single row: none, nothing to sample). ValueError when the gap is under MIN_CHANGE: the
    model does the task no better on the clean input, and there is no circuit to find."""
    with evaluating(model):
        ends = [
            task.metric(model(idx)[0], slice(None)).double() for idx in (task.clean, task.corrupted)
        ]
    clean, corrupted = (round(float(end.mean()), 4) for end in ends)
    if float((ends[0] - ends[1]).mean()) < MIN_CHANGE:
        raise ValueError(
            "the model does the task no better on the clean input than on the corrupted one "
            f"(metric {clean:+.3f} against {corrupted:+.3f}): there is no circuit to find"
        )
    value, se = _mean_se(ends[0] - ends[1])
    gap = {"value": value, **({"se": se} if se is not None else {}), "rows": len(ends[0])}
    return {"metric_clean": clean, "metric_corrupted": corrupted, "gap": gap}


def _nodes(model, task, nodes, names, rows, edges, scores, weights) -> list[dict]:
    """Each node as JSON-ready data: its role, effect, direct effect and copying (heads)."""
    attribution = answer_attribution(model, task)
    copying = copying_scores(weights)
    roles = head_roles(scores) if scores is not None else None
    direct = {e["from"]: e for e in edges if e["kind"] == LOGITS}
    out = []
    for name in nodes:
        node = _with_se({"name": name}, "effect", rows[names.index(name)])
        node["direct_effect"] = direct[name]["effect"]
        if "effect_se" in direct[name]:
            node["direct_effect_se"] = direct[name]["effect_se"]
        if name.startswith("MLP"):
            out.append({**node, "layer": int(name[3:]), "head": None, "role": None})
            continue
        layer, head = head_of(name)
        role, role_score = _role(roles, layer, head)
        node |= {"layer": layer, "head": head, "role": role, "role_score": role_score}
        node["direct_logit_attribution"] = round(float(attribution[layer, head]), 4)
        out.append({**node, "copying": round(float(copying[layer, head]), 4)})
    return out


def within_noise(gap: dict) -> bool:
    """Whether a task's gap (gap_of's) is less than twice its standard error (one row has none)."""
    return gap["rows"] > 1 and gap.get("se") is not None and gap["value"] < 2 * gap["se"]


def format_circuit(circuit: dict) -> str:
    """The gap, the nodes (and what fell below the cut), the edges (and why one can exceed its
    receiver) and the circuit's faithfulness, for people."""
    gap = circuit["gap"]
    if "se" in gap:
        spread = f" ± {gap['se']:.3f} (standard error over {gap['rows']} rows)"
        each = ", ± its standard error"
    else:
        spread = f" (no standard errors: {circuit['missing']['standard_errors']})"
        each = ""
    lines = [
        f"circuit of the task: {circuit['task']}",
        f"  metric {circuit['metric_clean']:+.3f} clean, {circuit['metric_corrupted']:+.3f} "
        f"corrupted: a gap of {gap['value']:.3f}{spread}; each number below is the fraction of "
        f"that gap one patch makes, {circuit['direction']}{each}",
    ]
    if within_noise(gap):
        lines.append(
            "  warning: the gap is within twice its standard error: the model may not do this task "
            "at all, and the nodes and edges below may be noise (more --sequences, or a model "
            "trained longer)"
        )
    noisy = [
        f"{n['name']} {n['effect']:+.2f} ± {n['effect_se']:.2f}"
        for n in circuit["nodes"]
        if "effect_se" in n and abs(n["effect"]) < 2 * n["effect_se"]
    ]
    if noisy:
        lines.append(
            f"  warning: {', '.join(noisy)}: within twice the standard error of 0. On "
            f"{gap['rows']} rows a gap of {gap['value']:.3f} is too small to tell these from noise "
            "(more --sequences, or a model that does the task better)"
        )
    lines += _format_nodes(circuit) + _format_edges(circuit)
    f = circuit["faithfulness"]
    if "interval" in f:
        bounds = f"[{f['interval'][0]:.3f}, {f['interval'][1]:.3f}]"
    else:
        bounds = f"(no interval: {f['missing']['interval']})"
    left_out = ", ".join(f"{a} -> {b} {k.upper()} {g:+.3f}" for a, b, k, g in f["left_out"])
    lines += [
        f"the circuit as {f['size']} edges of the graph (those into the logits included): "
        f"faithfulness {f['faithfulness']:.3f} {bounds} under {f['ablation']} "
        "ablation (another ablation gives another f: --ablation)",
        f"  incompleteness {f['incompleteness']['value']:.3f}; minimality "
        f"{f['minimality']['share'] or 0:.2f} of its edges lower f by at least 0.01 alone; left "
        f"out, the most: {left_out or 'none'}",
    ]
    return "\n".join(lines)


def _format_nodes(circuit: dict) -> list[str]:
    cut = circuit["thresholds"]["node"]
    lines = [
        f"nodes: heads and MLPs whose output alone corrupted moves the metric {cut:.0%} of the way "
        "or more:"
    ]
    for node in circuit["nodes"]:
        role = f" ({node['role']} {node['role_score']:.2f})" if node.get("role") else ""
        dla = node.get("direct_logit_attribution")
        attribution = f", direct logit attribution {dla:+.2f}" if dla is not None else ""
        lines.append(
            f"  {node['name']}{role}: {node['effect']:+.2f}{_pm(node, 'effect')}; directly "
            f"to the answer {node['direct_effect']:+.2f}{_pm(node, 'direct_effect')}"
            f"{attribution}"
        )
    if not circuit["nodes"]:
        lines.append("  none")
    below = ", ".join(f"{name} {effect:+.3f}" for name, effect in circuit["below"]) or "none"
    lines.append(f"  below {cut:.0%}, the strongest: {below}")
    return lines


def _format_edges(circuit: dict) -> list[str]:
    base = circuit["composition_baseline"]
    cut = circuit["thresholds"]["edge"]
    lines = [
        f"edges of {cut:.0%} or more (path patching through one input of the receiver; "
        f"composition of two heads' weights, random heads {base['mean']:.3f} ± {base['std']:.3f}):"
    ]
    effects = {n["name"]: n["effect"] for n in circuit["nodes"]}
    larger = []
    for edge in circuit["edges"]:
        score = f", composition {edge['composition']:.3f}" if "composition" in edge else ""
        into = "directly" if edge["kind"] == LOGITS else f"through its {edge['kind'].upper()}"
        lines.append(
            f"  {edge['from']} -> {edge['to']} {into}: {edge['effect']:+.2f}"
            f"{_pm(edge, 'effect')}{score}"
        )
        if edge["to"] in effects and edge["effect"] > effects[edge["to"]]:
            larger.append(f"{edge['from']} -> {edge['to']} {edge['kind'].upper()}")
    weaker = circuit["weaker_edges"]
    strongest = f" (the strongest {weaker[0]['effect']:+.3f})" if weaker else ""
    lines.append(f"  below {cut:.0%}: {len(weaker)} more edges in circuit.json{strongest}")
    if larger:
        lines.append(
            f"  {', '.join(larger)}: larger than the receiver's own effect. Corrupting one input "
            "of a node can hurt the task more than the corrupted run's whole output, which its own "
            "effect patches in (keys corrupted alone send its attention to the wrong tokens)"
        )
    return lines
