"""Batched interventions: many edited forward passes of one input, run as one pass over a bigger
batch.

An `Edit` sets one slice of one hook point (model/hooks.py) to a value: a head's query, key, value
or output z, the residual stream entering a layer, the attention's or the MLP's output, at every
position or at one. An intervention is a list of edits applied together. `intervene` runs B rows
unedited and under G interventions in one forward pass whose batch grows layer by layer: at each
layer a copy of the unedited rows joins for every intervention that starts changing things there, so
the layers before its first edit run once, shared. Removing each of a 6 x 6 model's 36 heads costs
about 21 forward passes' worth of layers, not 36 per window. `passes` cuts the work into passes that
fit ACTIVATION_BYTES (the logits of a big vocabulary dominate). Ablation, activation patching and
path patching (whose sender runs `capture` activations) all run here; interp/edge_run.py runs the
graph's edge masks, which rebuild each reader's input and are no edit of a hook point.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Optional, Union

import torch

from model import GPT
from model.hooks import hooked, run_with_cache

ACTIVATION_BYTES = 1 << 30  # logits and activations of one pass, float32, roughly


HEAD_POINTS = ("q", "k", "v", "z")  # attention points with a head index (k, v: a key/value head's)


@dataclass(eq=False)
class Edit:
    """Set `point` of block `layer` (at one `position`, or all; of one `head`, for a head's point)
    to `value`, the same for every row: a number, or a tensor that broadcasts to one row's slice:
    (T, d) or (d,) for a head's point, (T, C) or (C,) for the others (T: the input's length; with a
    position, the shapes without T). With `per_row`, `value` has one such slice per row of the
    input, stacked: (B, ...)."""

    # a head's "q", "k", "v", "z", or a block point: "resid_pre", "attn_out", "mlp_out", ...
    point: str
    layer: int
    value: Union[torch.Tensor, float]
    head: Optional[int] = None  # a head's points only
    position: Optional[int] = None  # None: every position
    per_row: bool = False

    @property
    def name(self) -> str:
        return f"blocks.{self.layer}.{'attn.' if self.point in HEAD_POINTS else ''}{self.point}"

    def index(self, rows: slice) -> tuple:
        position = slice(None) if self.position is None else self.position
        return (rows, position) if self.head is None else (rows, position, self.head)

    def for_rows(self, rows: slice) -> Edit:
        """The edit for a slice of the input's rows (its values' rows, when it has one per row)."""
        return replace(self, value=self.value[rows]) if self.per_row else self


def first_layer(intervention: Sequence[Edit]) -> int:
    """The first layer an intervention changes (0 for none)."""
    return min((e.layer for e in intervention), default=0)


def _grow(rows: int, copies: int, x: torch.Tensor, name: str) -> torch.Tensor:
    """The residual with `copies` more copies of its first (unedited) `rows` rows appended."""
    return torch.cat([x, x[:rows].repeat(copies, 1, 1)])


def _apply(edits: list[tuple[slice, Edit]], x: torch.Tensor, name: str) -> torch.Tensor:
    x = x.clone()
    for rows, edit in edits:
        x[edit.index(rows)] = edit.value
    return x


@torch.no_grad()
def intervene(
    model: GPT,
    idx: torch.Tensor,
    interventions: Sequence[Sequence[Edit]],
    capture: Sequence[str] = (),
):
    """Logits (1 + G, B, T, vocab) of idx (B, T): first unedited, then under each of the G
    interventions; with `capture` (hook point names), also {name: (1 + G, B, ...)}, the activations
    there in the same order (a point before the batch's first growth, or after its last).

    The batch grows as the forward goes: the unedited rows come first; at each layer's resid_pre, a
    copy of them is appended for every intervention that starts there (its edits then write into its
    rows), so no layer runs for an intervention before the layer it first changes."""
    B = idx.size(0)
    G = len(interventions)
    order = sorted(range(G), key=lambda g: first_layer(interventions[g]))
    block = {g: 1 + k for k, g in enumerate(order)}  # row block of each intervention
    hooks: dict[str, list] = {}
    for layer in sorted({first_layer(i) for i in interventions}):
        copies = sum(first_layer(i) == layer for i in interventions)
        hooks[f"blocks.{layer}.resid_pre"] = [partial(_grow, B, copies)]
    edits: dict[str, list[tuple[slice, Edit]]] = {}
    for g, intervention in enumerate(interventions):
        for edit in intervention:
            edits.setdefault(edit.name, []).append((slice(block[g] * B, (block[g] + 1) * B), edit))
    for name, todo in edits.items():
        hooks.setdefault(name, []).append(partial(_apply, todo))
    with hooked(model, hooks):
        logits, cache = run_with_cache(model, idx, capture)
    picked = [0, *(block[g] for g in range(G))]

    def blocks(x: torch.Tensor) -> torch.Tensor:  # a point before the batch grew: every block alike
        x = x.view(-1, B, *x.shape[1:])
        return x.expand(1 + G, *x.shape[1:]) if len(x) == 1 else x[picked]

    if not capture:
        return blocks(logits)
    return blocks(logits), {name: blocks(x) for name, x in cache.items()}


def rows_per_pass(model: GPT, T: int) -> int:
    """How many rows of T tokens one pass may hold within ACTIVATION_BYTES."""
    cfg = model.config
    # logits, and the widest activations of a layer
    per_row = 4 * T * (cfg.vocab_size + 12 * cfg.n_embd)
    return max(2, ACTIVATION_BYTES // per_row)


def passes(
    model: GPT, idx: torch.Tensor, interventions: Sequence[Sequence[Edit]]
) -> Iterator[tuple[list[int], slice, torch.Tensor]]:
    """Every row of idx unedited (index 0) and under each intervention (index 1 + i), in passes that
    fit ACTIVATION_BYTES: (indices, rows of idx, their logits (len(indices), len(rows), T, vocab)).
    Each index comes once per slice of rows; interventions that start at nearby layers share a
    pass."""
    rows = rows_per_pass(model, idx.size(1))
    window = max(1, min(idx.size(0), rows // (1 + len(interventions))))
    per_pass = max(1, rows // window - 1)
    order = sorted(range(len(interventions)), key=lambda i: first_layer(interventions[i]))
    for r in range(0, idx.size(0), window):
        part = slice(r, r + window)
        for at in range(0, len(order), per_pass):
            which = order[at : at + per_pass]
            edits = [[edit.for_rows(part) for edit in interventions[i]] for i in which]
            logits = intervene(model, idx[part], edits)
            if at == 0:
                yield [0, *(1 + i for i in which)], part, logits
            else:
                yield [1 + i for i in which], part, logits[1:]
        if not order:
            yield [0], part, intervene(model, idx[part], [])
