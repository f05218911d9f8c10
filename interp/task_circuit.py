"""The circuit behind a task (heads.py --circuit): the heads that matter, the edges between them,
each with what the weights say (its composition score) and what running the model says (its
path-patching effect), and the heads that write the answer.

On a task of interp/tasks.py (by default [R, R] against [R', R]), in the noising direction (what
breaks when one thing alone is corrupted): nodes are the heads whose patch (interp/patching.py)
moves the metric at least NODE_THRESHOLD of the way (at most MAX_NODES); edges are the paths between
nodes in different layers, through q, k or v, whose path-patching effect (interp/paths.py) reaches
EDGE_THRESHOLD, each with its composition score (interp/circuits.py); the answer is each node's
direct effect and its direct logit attribution (interp/lens.py). Each number is a fraction of the
clean-to-corrupted change of the metric, except the attribution (logits). The induction model's
circuit: docs/heads.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np

from interp.circuits import KINDS, all_composition_scores, composition_baseline, copying_scores
from interp.lens import direct_attribution, head_attributions
from interp.patching import metric_ends, patch_task
from interp.paths import EMBEDDINGS, Receiver, path_effects
from interp.scores import THRESHOLD, head_name, head_roles
from interp.tasks import Task
from interp.weights import head_weights
from model import GPT

NODE_THRESHOLD = 0.05  # a head is a node when patching it alone goes this fraction of the way
EDGE_THRESHOLD = 0.05  # an edge is in the circuit when its path alone goes this fraction of the way
MAX_NODES = 12  # the strongest nodes kept (edges cost three path patches per pair)
# the clean run's metric must beat the corrupted run's by this much (nats or logits)
MIN_CHANGE = 0.1


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


def select_nodes(effects: list[list[float]]) -> list[tuple[int, int]]:
    """The heads whose patch goes at least NODE_THRESHOLD of the way (at most MAX_NODES, the
    strongest), in layer order."""
    table = np.abs(np.array(effects))
    strong = [
        (float(table[layer, head]), layer, head)
        for layer, head in zip(*np.nonzero(table >= NODE_THRESHOLD))
    ]
    kept = sorted(strong, reverse=True)[:MAX_NODES]
    return sorted((int(layer), int(head)) for _, layer, head in kept)


def _role(
    roles: Optional[list[list[dict]]], layer: int, head: int
) -> tuple[Optional[str], Optional[float]]:
    if roles is None or roles[layer][head]["score"] < THRESHOLD:
        return None, None if roles is None else roles[layer][head]["score"]
    return roles[layer][head]["role"], roles[layer][head]["score"]


def check_task(model: GPT, task: Task) -> Task:
    """The task, or ValueError when the model does it no better on the clean input than on the
    corrupted one (by MIN_CHANGE): then there is no circuit to find."""
    clean, corrupted = metric_ends(model, task.noised())
    if clean - corrupted < MIN_CHANGE:
        raise ValueError(
            "the model does the task no better on the clean input than on the corrupted one "
            f"(metric {clean:+.3f} against {corrupted:+.3f}): there is no circuit to find"
        )
    return task


def find_circuit(model: GPT, task: Task, scores: Optional[dict] = None) -> dict:
    """The circuit of `task` (see the module's doc) as JSON-ready data: "nodes", "edges" (in the
    circuit) and "weaker_edges" (measured, below EDGE_THRESHOLD), with the task and the composition
    baseline. `scores`: interp.scores.score_heads' result, to name each node's role. ValueError from
    `check_task`."""
    noised = check_task(model, task).noised()
    weights = head_weights(model)
    composition = all_composition_scores(weights)
    baseline = composition_baseline(weights)
    patched = patch_task(model, noised, ("heads",))
    nodes = select_nodes(patched["heads"])
    direct = path_effects(
        model, noised, [([node], [Receiver("logits")]) for node in nodes]
    ).tolist()
    attribution = answer_attribution(model, task)
    copying = copying_scores(weights)
    roles = head_roles(scores) if scores is not None else None
    senders = [EMBEDDINGS, *nodes]
    pairs = [
        (s, r, kind)
        for s in senders
        for r in nodes
        if s == EMBEDDINGS or s[0] < r[0]
        for kind in KINDS
    ]
    path = path_effects(
        model, noised, [([s], [Receiver(kind, *r)]) for s, r, kind in pairs]
    ).tolist()
    edges = _edge_data(pairs, path, composition, model.config.n_head)
    node_data = [
        _node_data(layer, head, roles, patched, d, attribution, copying)
        for (layer, head), d in zip(nodes, direct)
    ]
    return {
        "task": task.description,
        "direction": noised.direction,
        "metric_clean": round(patched["metric_base"], 4),
        "metric_corrupted": round(patched["metric_source"], 4),
        "thresholds": {"node": NODE_THRESHOLD, "edge": EDGE_THRESHOLD},
        "composition_baseline": {"mean": round(baseline[0], 4), "std": round(baseline[1], 4)},
        "head_effects": patched["heads"],
        "nodes": node_data,
        "edges": [e for e in edges if abs(e["effect"]) >= EDGE_THRESHOLD],
        "weaker_edges": [e for e in edges if abs(e["effect"]) < EDGE_THRESHOLD],
    }


def _edge_data(pairs: list, path: list[float], composition: dict, n_head: int) -> list[dict]:
    """Each measured edge as JSON-ready data, the strongest first."""
    edges = []
    for (s, r, kind), effect in zip(pairs, path):
        edge = {
            "from": EMBEDDINGS if s == EMBEDDINGS else head_name(*s),
            "to": head_name(*r),
            "kind": kind,
        }
        if s != EMBEDDINGS:  # the embeddings are no head: no composition score
            edge["composition"] = round(
                float(composition[kind][s[0] * n_head + s[1], r[0] * n_head + r[1]]), 4
            )
        edges.append({**edge, "effect": round(effect, 4)})
    return sorted(edges, key=lambda e: -abs(e["effect"]))


def _node_data(layer, head, roles, patched, direct, attribution, copying) -> dict:
    """A node of the circuit as JSON-ready data: its role, effect, direct effect and copying."""
    role, role_score = _role(roles, layer, head)
    return {
        "name": head_name(layer, head),
        "layer": layer,
        "head": head,
        "role": role,
        "role_score": role_score,
        "effect": patched["heads"][layer][head],
        "direct_effect": round(direct, 4),
        "direct_logit_attribution": round(float(attribution[layer, head]), 4),
        "copying": round(float(copying[layer, head]), 4),
    }


def format_circuit(circuit: dict) -> str:
    """The nodes, the circuit's edges and the answer writers, for people."""
    base = circuit["composition_baseline"]
    lines = [
        f"circuit of the task: {circuit['task']}",
        f"  metric {circuit['metric_clean']:+.3f} clean, {circuit['metric_corrupted']:+.3f} "
        "corrupted; each "
        f"number below is the fraction of that change one patch makes, {circuit['direction']}",
        "heads that matter (each one's output alone corrupted):",
    ]
    for node in circuit["nodes"]:
        role = f" ({node['role']} {node['role_score']:.2f})" if node["role"] else ""
        lines.append(
            f"  {node['name']}{role}: {node['effect']:+.2f}; directly to the answer "
            f"{node['direct_effect']:+.2f}, direct logit attribution "
            f"{node['direct_logit_attribution']:+.2f}"
        )
    lines.append(
        f"edges (path patching through one input of the receiver; composition score, random heads "
        f"{base['mean']:.3f} ± {base['std']:.3f}):"
    )
    for edge in circuit["edges"]:
        score = f", composition {edge['composition']:.3f}" if "composition" in edge else ""
        lines.append(
            f"  {edge['from']} -> {edge['to']} through its {edge['kind'].upper()}: effect "
            f"{edge['effect']:+.2f}{score}"
        )
    if not circuit["edges"]:
        lines.append(f"  none reaches {circuit['thresholds']['edge']}")
    return "\n".join(lines)
