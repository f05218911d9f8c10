"""Head ablation: remove heads and measure what breaks (heads.py --ablate).

Zero ablation sets a head's output z (before W_O mixes the heads) to 0; mean ablation sets it to its
mean over reference validation windows, position by position (`head_means`: what the head writes on
typical text, without what it read in this input). `ablate_heads` removes every head alone, `ablate`
any sets of heads together; both batch the edited passes (interp/interventions.py). Each ablation is
measured as the change (ablated minus intact) of val_loss, repeat_loss_first_half,
repeat_loss_second_half (the copy: a head it needs raises this) and icl_score, as interp/scores.py
defines them. Inputs are `score_heads`'s (validation windows from stream 2, the means' reference
windows from stream 3, [R, R] from `seed`) but fewer by default (TEXT_TOKENS, REPEAT_TOKENS): every
head costs about one forward pass over them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch

from data.loader import TokenWindows
from interp.interventions import Edit, passes
from interp.scores import (
    evaluating,
    head_name,
    icl_differences,
    repeat_losses,
    repeated_tokens,
    token_losses,
)
from model import GPT
from model.hooks import run_with_cache

KINDS = ("zero", "mean")
METRICS = ("val_loss", "repeat_loss_first_half", "repeat_loss_second_half", "icl_score")
# Default inputs (each head costs about a forward pass over them; 6 x 384 at context 256:
# BENCHMARKS.md):
TEXT_TOKENS = 1024  # validation windows of about this many tokens in all, at least MIN_INPUTS
REPEAT_TOKENS = 512  # [R, R] sequences of about this many tokens in all, at least MIN_INPUTS
MIN_INPUTS = 4

Heads = Sequence[tuple[int, int]]  # (layer, head) pairs ablated together


def head_means(model: GPT, reference: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, every head's mean output z over the reference windows (B, T), per position: (T, H,
    d)."""
    names = [f"blocks.{layer}.attn.z" for layer in range(model.config.n_layer)]
    _, cache = run_with_cache(model, reference, names)
    return [cache[name].mean(dim=0) for name in names]


def head_edits(heads: Heads, kind: str, means: Optional[list[torch.Tensor]], T: int) -> list[Edit]:
    """The edits that ablate `heads` on inputs of T tokens."""
    if kind == "zero":
        return [Edit("z", layer, 0.0, head=head) for layer, head in heads]
    return [Edit("z", layer, means[layer][:T, head], head=head) for layer, head in heads]


def _metrics(model: GPT, idx, targets, interventions, measure) -> np.ndarray:
    """(1 + interventions, B, 2): measure(logits (G B, T, V), targets (G B, T)), two values per
    row, of each row of idx, intact and under each intervention."""
    values = np.zeros((1 + len(interventions), idx.size(0), 2))
    for which, rows, logits in passes(model, idx, interventions):
        G, B, T, V = logits.shape
        pair = measure(logits.reshape(G * B, T, V), targets[rows].repeat(G, 1))
        values[which, rows] = torch.stack([p.reshape(G, B) for p in pair], dim=2).double().cpu()
    return values


def _standard_errors(text: np.ndarray, rep: np.ndarray) -> dict[str, float]:
    """Each metric's standard error over its inputs (the intact model's windows or sequences)."""
    se = lambda v: float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0  # noqa: E731
    parts = [se(text[0, :, 0]), se(rep[0, :, 0]), se(rep[0, :, 1]), se(text[0, :, 1])]
    return {m: round(v, 4) for m, v in zip(METRICS, parts)}


@torch.no_grad()
def ablate(
    model: GPT,
    val: TokenWindows,
    groups: Sequence[Heads],
    kind: str = "zero",
    seed: int = 0,
    *,
    windows: Optional[int] = None,
    sequences: Optional[int] = None,
) -> dict:
    """The intact model's METRICS ("clean") and, for each group of heads ablated together, their
    changes ("effects": one dict of METRICS per group), with the inputs' sizes. Runs in eval mode
    without gradients; the model's mode and the global random generators are left as they were."""
    if kind not in KINDS:
        raise ValueError(f"ablation kind must be one of {', '.join(KINDS)}, got {kind!r}")
    cfg = model.config
    device = next(model.parameters()).device
    windows = windows or max(MIN_INPUTS, TEXT_TOKENS // cfg.block_size)
    n = min(cfg.block_size // 2, cfg.vocab_size)
    sequences = sequences or max(MIN_INPUTS, REPEAT_TOKENS // (2 * n))
    x, y = (t.to(device) for t in val.batch(0, windows, stream=2))
    tokens = repeated_tokens(cfg.vocab_size, n, sequences, seed).to(device)
    with evaluating(model):
        means = (
            head_means(model, val.batch(0, windows, stream=3)[0].to(device))
            if kind == "mean"
            else None
        )
        # each window's val loss and ICL score; each sequence's first- and second-half loss
        text = _metrics(
            model,
            x,
            y,
            [head_edits(g, kind, means, x.size(1)) for g in groups],
            lambda logits, y: (token_losses(logits, y).mean(dim=1), icl_differences(logits, y)),
        )
        rep = _metrics(
            model,
            tokens,
            tokens,
            [head_edits(g, kind, means, 2 * n) for g in groups],
            lambda logits, targets: repeat_losses(logits, targets, n),
        )
    # in the order of METRICS, each the mean over its inputs
    text_mean = text.mean(axis=1)
    rep_mean = rep.mean(axis=1)
    values = np.concatenate([text_mean[:, :1], rep_mean, text_mean[:, 1:]], axis=1)
    clean = values[0]
    changes = values[1:] - values[0]
    return {
        "kind": kind,
        "windows": windows,
        "sequences": sequences,
        "repeat_length": n,
        "clean": {m: round(float(v), 4) for m, v in zip(METRICS, clean)},
        "clean_se": _standard_errors(text, rep),
        "effects": [{m: round(float(v), 4) for m, v in zip(METRICS, row)} for row in changes],
    }


def ablate_heads(
    model: GPT,
    val: TokenWindows,
    kind: str = "zero",
    seed: int = 0,
    groups: Sequence[Heads] = (),
    **sizes,
) -> dict:
    """Every head ablated alone: `ablate`'s numbers with, for each of METRICS, an n_layer x n_head
    table of changes; and each of `groups` ablated together ("groups": its heads' names and
    METRICS), in the same batched passes."""
    cfg = model.config
    heads = [(layer, head) for layer in range(cfg.n_layer) for head in range(cfg.n_head)]
    result = ablate(
        model, val, [[h] for h in heads] + [list(g) for g in groups], kind, seed, **sizes
    )
    effects = result.pop("effects")
    for m in METRICS:
        values = [effect[m] for effect in effects]
        result[m] = [
            values[layer * cfg.n_head : (layer + 1) * cfg.n_head] for layer in range(cfg.n_layer)
        ]
    together = effects[len(heads) :]
    result["groups"] = [
        {"heads": [head_name(*h) for h in g], **e} for g, e in zip(groups, together)
    ]
    return result


def format_ablation(result: dict) -> str:
    """Each metric's change as a layer x head table, each group's changes, then the intact model's
    values."""
    n_head = len(result[METRICS[0]][0])
    lines = [
        f"{result['kind']} ablation of each head: change of each metric when the head is removed "
        f"({result['windows']} validation windows, {result['sequences']} [R, R] sequences of "
        f"{2 * result['repeat_length']} "
        f"tokens{', ' + result['precision'] if 'precision' in result else ''})"
    ]
    for m in METRICS:
        lines.append(f"{m:<24}" + "".join(f"{'H' + str(h):>7}" for h in range(n_head)))
        for layer, row in enumerate(result[m]):
            lines.append(f"  L{layer:<22}" + "".join(f"{v:+7.2f}" for v in row))
    for group in result.get("groups", []):
        changes = ", ".join(f"{m} {group[m]:+.3f}" for m in METRICS)
        lines.append(f"{' '.join(group['heads'])} removed together: {changes}")
    se = result.get("clean_se", {})
    clean = ", ".join(f"{m} {v:.3f} ± {se.get(m, 0):.3f}" for m, v in result["clean"].items())
    return "\n".join(
        [
            *lines,
            f"intact model, on these inputs (± the standard error over them): {clean}",
            "  (training's exact val loss reads every val token and heads.py's role scores 8k "
            "tokens of windows: theirs are the better estimates of the model; --windows and "
            "--sequences give more here)",
        ]
    )
