"""Multiple-choice accuracy (HellaSwag's format, data/evalsets.py), as eval.py --choices scores it.

Each ending is scored by the total loss of its tokens given the context (`acc`), and normalised per
token (the acc_norm of nanoGPT's and llm.c's HellaSwag scripts), per character of the ending as
written (lm-evaluation-harness's acc_norm) and per UTF-8 byte (its acc_bytes): the lowest is the
model's answer. The total loss of an ending is minus lm-eval's loglikelihood of it
(`choice_losses`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from data.evalsets import Choice, encode_choice
from data.tokenizers import Tokenizer


@dataclass
class ChoiceScore:
    items: int
    acc: float  # the ending with the lowest total loss
    acc_per_token: float  # lowest loss per token (nanoGPT's and llm.c's acc_norm)
    # lowest loss per character of the ending (lm-evaluation-harness's acc_norm)
    acc_per_char: float
    # lowest loss per UTF-8 byte of the ending (lm-evaluation-harness's acc_bytes)
    acc_per_byte: float
    chance: float  # the expected accuracy of a random guess


@torch.no_grad()
def ending_losses(
    model: torch.nn.Module, encoded: list[tuple[list[int], int]], autocast=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, tokens) of each ending given its context, in one batch."""
    device = next(model.parameters()).device
    width = max(len(ids) for ids, _ in encoded) - 1
    x = torch.zeros((len(encoded), width), dtype=torch.long)
    y = torch.full((len(encoded), width), -1, dtype=torch.long)
    for row, (ids, n_ending) in enumerate(encoded):
        seq = torch.tensor(ids)
        x[row, : len(ids) - 1] = seq[:-1]
        y[row, len(ids) - 1 - n_ending : len(ids) - 1] = seq[-n_ending:]  # the ending's tokens only
    x, y = x.to(device), y.to(device)
    with autocast() if autocast is not None else contextlib.nullcontext():
        logits, _ = model(x)
    nats = F.cross_entropy(logits.float().transpose(1, 2), y, ignore_index=-1, reduction="none")
    return nats.double().sum(dim=1).cpu(), (y >= 0).sum(dim=1).cpu()


def choice_losses(
    model: torch.nn.Module, tokenizer: Tokenizer, item: Choice, autocast=None
) -> torch.Tensor:
    """The total loss in nats of each ending of `item` given its context (float64, on the CPU)."""

    return ending_losses(model, encode_choice(item, tokenizer, model.config.block_size), autocast)[
        0
    ]


def score_choices(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    items: list[Choice],
    autocast=None,
    progress: Callable[[int], None] | None = None,
) -> ChoiceScore:
    """Accuracy of `model` on multiple-choice items: each ending scored by its loss given the
    context, in total and per token, character and byte."""
    was_training = model.training
    model.eval()
    right = np.zeros(4)
    for item in items:
        total, tokens = ending_losses(
            model, encode_choice(item, tokenizer, model.config.block_size), autocast
        )
        chars = torch.tensor([len(e) for e in item.endings], dtype=torch.float64)
        n_bytes = torch.tensor([len(e.encode("utf-8")) for e in item.endings], dtype=torch.float64)
        scores = torch.stack([total, total / tokens, total / chars, total / n_bytes], dim=1)
        right += (scores.argmin(dim=0) == item.label).numpy()
        if progress is not None:
            progress(1)
    model.train(was_training)
    n = len(items)
    chance = sum(1 / len(item.endings) for item in items) / n
    return ChoiceScore(n, *(right / n).tolist(), chance)
