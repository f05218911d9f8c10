"""Path patching (Wang et al. 2022, the IOI circuit; Goldowsky-Dill et al. 2023): the effect of a
sender on a receiver through one input of the receiver alone, every other path held at the base
run's values. Senders and receivers are the graph's writers and readers (interp/graph.py): a path is
an edge of the graph (or a set of them), scored by path patching:

1. the sender run: the base input with the senders' outputs (a head's z, an MLP's output, the
   embeddings) from the source run and every other head's output frozen at the base run's (the
   other MLPs are recomputed: a path through an MLP counts as direct);
2. the receiver run: the base input with only the receivers' inputs from the sender run: a head's
   q, k or v (with grouped-query attention the key/value head of the group), an MLP's output or the
   final residual (the logits: the direct effect); everything after them is recomputed.
The effect is scored as activation patching's, per row (`path_effects(rows=True)`) or averaged.
Each sender set costs a forward pass and each receiver set one from its first layer on, batched
(interp/interventions.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from interp.graph import EMBEDDINGS, LOGITS, Reader
from interp.interventions import Edit, intervene, rows_per_pass
from interp.patching import metric_ends, row_effects
from interp.scores import HEAD_NAME, evaluating
from interp.tasks import Task
from model import GPT
from model.hooks import run_with_cache

Path = tuple[Sequence[str], Sequence[Reader]]  # senders (writers' names), receivers


def point(model: GPT, reader: Reader) -> str:
    """The hook point the sender run caches for a receiver."""
    if reader.kind == LOGITS:
        return f"blocks.{model.config.n_layer - 1}.resid_post"
    kind = "mlp_out" if reader.kind == "mlp" else "attn." + reader.kind
    return f"blocks.{reader.stage // 2}.{kind}"


def receiver_edit(model: GPT, reader: Reader, value: torch.Tensor) -> Edit:
    """The receiver run's edit, from the sender run's tensor at `point` (B, T, ...)."""
    if reader.kind in (LOGITS, "mlp"):
        layer = reader.stage // 2 if reader.kind == "mlp" else model.config.n_layer - 1
        return Edit("mlp_out" if reader.kind == "mlp" else "resid_post", layer, value, per_row=True)
    head = reader.index
    return Edit(reader.kind, reader.stage // 2, value[:, :, head], head=head, per_row=True)


def sender_runs(model: GPT, task: Task, senders: Sequence[Sequence[str]], points: list[str]):
    """Step 1 for each sender set: the activations at `points`, each (G, B, T, ...)."""
    L = model.config.n_layer
    outputs = [f"blocks.{layer}.attn.z" for layer in range(L)] + ["blocks.0.resid_pre"]
    outputs += [f"blocks.{layer}.mlp_out" for layer in range(L) if model.config.mlp]
    _, base = run_with_cache(model, task.base, outputs)
    _, source = run_with_cache(model, task.source, outputs)
    runs = []
    for group in senders:
        # every head's output the base run's but the senders', from the source run
        edits = [Edit("z", i, base[f"blocks.{i}.attn.z"].clone(), per_row=True) for i in range(L)]
        for sender in group:
            if sender == EMBEDDINGS:
                edits.append(Edit("resid_pre", 0, source["blocks.0.resid_pre"], per_row=True))
            elif HEAD_NAME.fullmatch(sender):
                layer, head = map(int, HEAD_NAME.fullmatch(sender).groups())
                edits[layer].value[:, :, head] = source[f"blocks.{layer}.attn.z"][:, :, head]
            else:  # an MLP, "MLP2"
                name = f"blocks.{sender[3:]}.mlp_out"
                edits.append(Edit("mlp_out", int(sender[3:]), source[name], per_row=True))
        runs.append(edits)
    _, cache = intervene(model, task.base, runs, capture=points)
    return {name: x[1:] for name, x in cache.items()}


@torch.no_grad()
def receiver_edits(model: GPT, task: Task, paths: Sequence[Path]) -> list[list[Edit]]:
    """Step 2's edits of each path: its receivers' inputs from its sender run (run here, in
    batches)."""
    interventions = []
    (B, T) = task.base.shape
    step = max(1, rows_per_pass(model, T) // B - 1)  # sender sets per run, beside the base rows
    with evaluating(model):
        for start in range(0, len(paths), step):
            chunk = paths[start : start + step]
            points = sorted({point(model, r) for _, receivers in chunk for r in receivers})
            runs = sender_runs(model, task, [senders for senders, _ in chunk], points)
            for g, (_, receivers) in enumerate(chunk):
                edits = [receiver_edit(model, r, runs[point(model, r)][g]) for r in receivers]
                interventions.append(edits)
    return interventions


@torch.no_grad()
def path_effects(model: GPT, task: Task, paths: Sequence[Path], rows: bool = False) -> torch.Tensor:
    """The effect of each path (senders, receivers) on the task (see the module's doc),
    (len(paths),), or with `rows` each row's, (len(paths), B)."""
    with evaluating(model):
        edits = receiver_edits(model, task, paths)
        found = row_effects(model, task, edits, metric_ends(model, task))
    return found if rows else found.mean(dim=1)
