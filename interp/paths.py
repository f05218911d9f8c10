"""Path patching (Wang et al. 2022, the IOI circuit; Goldowsky-Dill et al. 2023): the effect of a
sender head (or MLP) on a receiver through one input of the receiver alone (its queries, its keys or
its values), every other path held at the base run's values.

1. the sender run: the base input with the senders' outputs (a head's z, an MLP's output) from the
   source run and every other head's output frozen at the base run's (the other MLPs are
   recomputed: a path through an MLP counts as direct);
2. the receiver run: the base input with only R's inputs from the sender run: a head's q, k or v
   (with grouped-query attention its group's), an MLP's output (`mlp`) or the final residual
   (`logits`: the direct effect); everything after R is recomputed.
The effect is scored as activation patching's, per row (`path_effects(rows=True)`) or averaged;
`EMBEDDINGS` as a sender stands for the embeddings, "MLP2" for layer 2's MLP.
Each sender set costs one forward pass and each receiver set a forward from its first layer on, all
batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional, Union

import torch

from interp.graph import EMBEDDINGS
from interp.interventions import Edit, intervene, rows_per_pass
from interp.patching import metric_ends, row_effects
from interp.scores import evaluating
from interp.tasks import Task
from model import GPT
from model.hooks import run_with_cache

RECEIVER_KINDS = ("q", "k", "v", "mlp", "logits")
Sender = Union[tuple[int, int], str]  # (layer, head), EMBEDDINGS or an MLP's name (MLP0)


@dataclass(frozen=True)
class Receiver:
    kind: str  # one of RECEIVER_KINDS
    layer: Optional[int] = None  # q, k, v, mlp
    # q, k, v: the query head (k and v: its group's key/value head is patched)
    head: Optional[int] = None

    def point(self, model: GPT) -> str:
        """The hook point the sender run caches for this receiver."""
        if self.kind == "logits":
            return f"blocks.{model.config.n_layer - 1}.resid_post"
        return f"blocks.{self.layer}.{'mlp_out' if self.kind == 'mlp' else 'attn.' + self.kind}"

    def edit(self, model: GPT, value: torch.Tensor) -> Edit:
        """The receiver run's edit, from the sender run's cached tensor at `point` (B, T, ...)."""
        if self.kind == "logits":
            return Edit("resid_post", model.config.n_layer - 1, value, per_row=True)
        if self.kind == "mlp":
            return Edit("mlp_out", self.layer, value, per_row=True)
        cfg = model.config
        head = self.head if self.kind == "q" else self.head // (cfg.n_head // cfg.kv_heads)
        return Edit(self.kind, self.layer, value[:, :, head], head=head, per_row=True)


Path = tuple[Sequence[Sender], Sequence[Receiver]]


def sender_runs(model: GPT, task: Task, senders: Sequence[Sequence[Sender]], points: list[str]):
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
            elif isinstance(sender, str):  # an MLP, "MLP2"
                point = f"blocks.{sender[3:]}.mlp_out"
                edits.append(Edit("mlp_out", int(sender[3:]), source[point], per_row=True))
            else:
                layer, head = sender
                edits[layer].value[:, :, head] = source[f"blocks.{layer}.attn.z"][:, :, head]
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
            points = sorted({r.point(model) for _, receivers in chunk for r in receivers})
            runs = sender_runs(model, task, [senders for senders, _ in chunk], points)
            for g, (_, receivers) in enumerate(chunk):
                interventions.append([r.edit(model, runs[r.point(model)][g]) for r in receivers])
    return interventions


@torch.no_grad()
def path_effects(model: GPT, task: Task, paths: Sequence[Path], rows: bool = False) -> torch.Tensor:
    """The effect of each path (senders, receivers) on the task (see the module's doc),
    (len(paths),), or with `rows` each row's, (len(paths), B)."""
    with evaluating(model):
        edits = receiver_edits(model, task, paths)
        found = row_effects(model, task, edits, metric_ends(model, task))
    return found if rows else found.mean(dim=1)
