"""Attention-head roles: scores that say what each head attends to, in a model and through training.

A role score is a head's mean attention weight on the role's key over chosen queries, so it lies in
[0, 1]: previous-, first- and current-token on real text (validation windows), duplicate-token and
induction (Olsson et al. 2022) on repeated random tokens [R, R] (`repeated_tokens`); beside them,
per model, the repeated-sequence loss of each half and the in-context learning score. docs/heads.md
("The scores") defines each one and how to read it; the functions below say which queries and keys
they take. heads.py calls `score_heads`; with log.head_scores: true, interp/circuit_training.py's
HeadScores calls it at each eval of a training run, prints `strongest_heads`, logs `flat_scores`.
Attention weights are materialised a chunk of windows at a time (ATTENTION_BYTES), so a GPT-2-sized
model can be scored too. `head_name` is every head's label (L1H0).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from common.errors import UserError
from data.loader import TokenWindows
from model import GPT

ROLES = ("induction", "previous_token", "duplicate_token", "first_token", "current_token")
TEXT_ROLES = ("previous_token", "first_token", "current_token")
THRESHOLD = 0.4  # a head "has" a role when it scores at least this
ATTENTION_BYTES = 1 << 30  # attention weights held at once while scoring (float32, all layers)


def role_name(role: str) -> str:
    return role.replace("_", "-")


def text_scores(weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """Previous-, first- and current-token scores, each (B, n_head), from one layer's (B, n_head, T,
    T) attention weights on real text: per window, the mean over queries 1 .. T-1."""
    return {
        "previous_token": weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1),
        "first_token": weights[..., 1:, 0].mean(dim=-1),
        "current_token": weights.diagonal(dim1=-2, dim2=-1)[..., 1:].mean(dim=-1),
    }


def repeat_scores(weights: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """Duplicate-token and induction scores, each (B, n_head), from one layer's (B, n_head, 2n, 2n)
    attention weights on [R, R] sequences with len(R) = n: per sequence, the mean over queries n ..
    2n-1 (query q holds the token of position q - n) of the attention on key q - n (its earlier
    occurrence) and on key q - n + 1 (the token that followed it: an induction head, with a
    previous-token head in an earlier layer, copies what came next last time)."""
    return {
        "duplicate_token": weights.diagonal(offset=-n, dim1=-2, dim2=-1).mean(dim=-1),
        "induction": weights.diagonal(offset=1 - n, dim1=-2, dim2=-1)[..., 1:].mean(dim=-1),
    }


def repeated_tokens(vocab_size: int, n: int, count: int, seed: int) -> torch.Tensor:
    """(count, 2n) sequences [R, R], each R n distinct ids drawn uniformly from the vocabulary:
    without repeats, every token of the second half has exactly one earlier occurrence."""
    rng = np.random.default_rng(seed)
    halves = np.stack([rng.choice(vocab_size, n, replace=False) for _ in range(count)])
    return torch.from_numpy(np.concatenate([halves, halves], axis=1))


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy, (B, T)."""
    return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")


def repeat_losses(
    logits: torch.Tensor, tokens: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence (B,), the mean loss of the predictions of tokens 1 .. n-1 (the first half:
    nothing to copy) and of n+1 .. 2n-1 (the second: the copy). Token n, R's first token again, is
    left out: nothing before it says the copy starts."""
    losses = token_losses(logits[:, :-1], tokens[:, 1:])  # column p: the prediction of token p + 1
    return losses[:, : n - 1].mean(dim=1), losses[:, n:].mean(dim=1)


def icl_positions(block_size: int) -> tuple[int, int]:
    """(early, late) context positions of the in-context learning score: a tenth of the context and
    all of it (Olsson et al. compare the 50th and 500th tokens)."""
    return max(block_size // 10 - 1, 0), block_size - 1


def icl_differences(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per window (B,), the loss at the late context position minus the loss at the early one."""
    early, late = icl_positions(logits.size(1))
    losses = token_losses(logits[:, [early, late]], targets[:, [early, late]])
    return losses[:, 1] - losses[:, 0]


@contextmanager
def evaluating(model: torch.nn.Module):
    """Eval mode (no dropout) inside the block; the mode the model was in after it."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _passes(
    model: GPT, idx: torch.Tensor
) -> Iterator[tuple[slice, torch.Tensor, list[torch.Tensor]]]:
    """(rows, logits, attention weights per layer) of idx through the explicit attention path, in
    chunks of rows small enough that every layer's weights fit in about ATTENTION_BYTES."""
    cfg = model.config
    size = max(1, ATTENTION_BYTES // (4 * cfg.n_layer * cfg.n_head * idx.size(1) ** 2))
    for start in range(0, idx.size(0), size):
        logits, weights = model.attention_weights(idx[start : start + size])
        yield slice(start, start + size), logits, [w.float() for w in weights]


def _mean(parts: list[torch.Tensor]) -> float:
    return round(torch.cat(parts).mean().item(), 4)


def _table(parts: list[list[dict[str, torch.Tensor]]], role: str) -> list[list[float]]:
    """n_layer x n_head means over every row of every chunk."""
    layers = [
        torch.cat([chunk[layer][role] for chunk in parts]).mean(dim=0)
        for layer in range(len(parts[0]))
    ]
    return [[round(float(v), 4) for v in layer] for layer in layers]


@torch.no_grad()
def score_heads(
    model: GPT,
    val: TokenWindows,
    seed: int = 0,
    *,
    sequences: int = 16,
    windows: Optional[int] = None,
) -> dict:
    """Every head's role scores (n_layer x n_head lists), the ICL score and the repeated-sequence
    losses.

    `windows` validation windows (default: about 8k tokens' worth) come from `val`'s stream 2;
    `sequences` [R, R] sequences from `seed`. Runs in eval mode without gradients and puts the model
    back in the mode it was in; the global random generators are not touched. Pass the unwrapped
    model (not the DDP or compiled one).
    """
    cfg = model.config
    device = next(model.parameters()).device
    windows = windows or max(16, 8192 // cfg.block_size)
    n = min(cfg.block_size // 2, cfg.vocab_size)
    if n < 2:
        raise UserError(
            "head role scores need [R, R] sequences of at least 2 tokens each, so a context of 4 "
            f"or more; this model's is {cfg.block_size}"
        )
    x, y = (t.to(device) for t in val.batch(0, windows, stream=2))
    tokens = repeated_tokens(cfg.vocab_size, n, sequences, seed).to(device)
    text = []
    rep = []
    icl = []
    first = []
    second = []
    with evaluating(model):
        for rows, logits, weights in _passes(model, x):
            text.append([text_scores(w) for w in weights])
            icl.append(icl_differences(logits, y[rows]))
        for rows, logits, weights in _passes(model, tokens):
            rep.append([repeat_scores(w, n) for w in weights])
            halves = repeat_losses(logits, tokens[rows], n)
            first.append(halves[0])
            second.append(halves[1])
    scores = {role: _table(text if role in TEXT_ROLES else rep, role) for role in ROLES}
    found = {
        **scores,
        "icl_score": _mean(icl),
        "repeat_loss_first_half": _mean(first),
        "repeat_loss_second_half": _mean(second),
        "repeat_length": n,
        "icl_positions": list(icl_positions(cfg.block_size)),
    }
    return {**found, "notes": caveats(found, cfg.window, cfg.vocab_size)}


def caveats(scores: dict, window: Optional[int], vocab_size: int) -> list[str]:
    """Where the repeated-sequence numbers cannot mean what they say: a window that cannot reach the
    first copy, a first copy predicted worse than uniform guessing (rare tokens, not copying)."""
    n = scores["repeat_length"]
    notes = []
    if window is not None and window <= n:
        notes.append(
            f"the window of {window} tokens does not reach back {n} tokens to the first copy of R: "
            "no head can attend there, so the duplicate-token and induction scores are 0 by "
            "construction, whatever the model learned"
        )
    uniform = float(np.log(vocab_size))
    if scores["repeat_loss_first_half"] > uniform + 0.5:
        notes.append(
            f"the first copy's loss ({scores['repeat_loss_first_half']:.2f}) is above uniform "
            f"guessing's ln {vocab_size} = {uniform:.2f}: random tokens are rarer than this model "
            "expects, so the repeated-sequence losses measure rare tokens as much as copying; "
            "compare the two halves, not either with ln(vocab)"
        )
    return notes


def strongest(table: list[list[float]]) -> tuple[int, int, float]:
    """(layer, head, score) of the highest score in an n_layer x n_head table."""
    layer, head = divmod(int(np.argmax(table)), len(table[0]))
    return layer, head, table[layer][head]


HEAD_NAME = re.compile(r"L(\d+)H(\d+)")  # a head's label, as `head_name` writes it


def head_name(layer: int, head: int) -> str:
    """A head's label in every table, picture and command line: L1H0 is layer 1's head 0."""
    return f"L{layer}H{head}"


def head_roles(scores: dict) -> list[list[dict]]:
    """Per layer, per head: its strongest role and score."""
    n_layer, n_head = len(scores[ROLES[0]]), len(scores[ROLES[0]][0])
    roles = [
        [max(ROLES, key=lambda r: scores[r][layer][head]) for head in range(n_head)]
        for layer in range(n_layer)
    ]
    return [
        [
            {"role": role_name(role), "score": scores[role][layer][head]}
            for head, role in enumerate(row)
        ]
        for layer, row in enumerate(roles)
    ]


def strongest_heads(scores: dict) -> str:
    """One line: the strongest head of each role, then the ICL score and the repeated-sequence
    losses."""
    parts = []
    for role in ROLES:
        layer, head, value = strongest(scores[role])
        parts.append(f"{role_name(role)} {head_name(layer, head)} {value:.2f}")
    parts.append(f"ICL {scores['icl_score']:+.2f}")
    parts.append(
        f"repeat loss {scores['repeat_loss_first_half']:.2f} -> "
        f"{scores['repeat_loss_second_half']:.2f}"
    )
    return " | ".join(parts)


def flat_scores(scores: dict) -> dict[str, float]:
    """A few scalars for wandb: the best score of each role, the ICL score, the repeated-sequence
    losses."""
    out = {f"heads/{role}_max": strongest(scores[role])[2] for role in ROLES}
    for key in ("icl_score", "repeat_loss_first_half", "repeat_loss_second_half"):
        out[f"heads/{key}"] = scores[key]
    return out


def format_scores(scores: dict) -> str:
    """The role scores as one layer x head table per role, then the model-level numbers."""
    n_head = len(scores[ROLES[0]][0])
    lines = [
        "head role scores (rows: layers, columns: heads; 1.00 = all attention on the role's key)"
    ]
    for role in ROLES:
        lines.append(
            f"{role_name(role):<16}" + "".join(f"{'H' + str(h):>6}" for h in range(n_head))
        )
        for layer, row in enumerate(scores[role]):
            lines.append(f"  L{layer:<14}" + "".join(f"{v:6.2f}" for v in row))
    roles = [
        f"{head_name(layer, head)} {role_name(role)} {v:.2f}"
        for role in ROLES
        for layer, row in enumerate(scores[role])
        for head, v in enumerate(row)
        if v >= THRESHOLD
    ]
    early, late = scores["icl_positions"]
    lines += [
        f"heads with a role (score >= {THRESHOLD}): {', '.join(roles) or 'none'}",
        f"in-context learning score: {scores['icl_score']:+.3f} (loss at context position {late} "
        f"minus at position {early}, validation windows)",
        f"repeated-sequence loss: {scores['repeat_loss_first_half']:.3f} on the first half, "
        f"{scores['repeat_loss_second_half']:.3f} on the second (R of {scores['repeat_length']} "
        "tokens)",
        *(f"note: {note}" for note in scores.get("notes", [])),
    ]
    return "\n".join(lines)
