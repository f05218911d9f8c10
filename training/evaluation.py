"""Exact evaluation: the loss over every token of a text, bits per byte, and multiple-choice accuracy.

- `evaluate_tokens` predicts every token of a sequence (a split's bin file, or any token array) exactly once,
  in windows of block_size tokens; the first token has no context and is not predicted. Non-overlapping
  windows (the default) give the first prediction of each window one token of context; with `stride` S <
  block_size the windows slide by S and only the last S predictions of each window count (the scheme of the
  transformers perplexity guide), so every prediction after the first window sees at least block_size - S
  tokens. Windows are batched; the last one is padded and its padding ignored.
- Bits per byte: the total loss in nats / ln 2 / the UTF-8 bytes of the predicted tokens (`byte_lengths` of
  data/tokenizers.py), which does not depend on the tokenizer: a character model and a BPE model compare.
  Special tokens (<|endoftext|> between documents) have no bytes; their loss counts like any other.
- `score_choices`: multiple choice (HellaSwag's format, data/evalsets.py). Each ending is scored by the total
  loss of its tokens given the context (`acc`), and normalised for its length: per token (`acc_per_token`,
  the acc_norm of nanoGPT's and llm.c's HellaSwag scripts), per character of the ending as written
  (`acc_per_char`, lm-evaluation-harness's acc_norm) and per UTF-8 byte (`acc_per_byte`, its acc_bytes);
  the lowest loss is the model's answer. The two acc_norms differ (a token is several characters), hence
  the names. The total loss of an ending is minus lm-eval's loglikelihood of it (`choice_losses`).
- Under torchrun the batches are dealt out to the ranks and the sums all-reduced; every rank runs the same
  number of forward passes, as FSDP needs.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from common.errors import UserError
from common.threads import ThreadTuner
from data.evalsets import Choice, encode_choice
from data.shards import TokenFiles
from data.tokenizers import Tokenizer, bits_per_byte
from runs.runtime import Runtime
from training import distributed

# train.final_eval=auto: the exact eval at the end up to this many val tokens
FINAL_EVAL_AUTO_TOKENS = 4_000_000


@dataclass
class TokenLoss:
    """Sums over the predicted tokens of one evaluation."""

    tokens: int  # predictions scored
    nats: float  # their total loss
    bytes: int  # UTF-8 bytes of the predicted tokens
    seconds: float = 0.0

    @property
    def loss(self) -> float:
        return self.nats / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))

    @property
    def bpb(self) -> float | None:
        """None where the predicted tokens stand for no bytes (special tokens alone)."""
        return bits_per_byte(self.nats, self.bytes)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


def final_eval_wanted(setting: str, val_tokens: int) -> bool:
    """train.final_eval: true, false, or auto (when the val split takes seconds: FINAL_EVAL_AUTO_TOKENS)."""
    setting = str(setting).lower()
    return setting == "true" or (setting == "auto" and val_tokens <= FINAL_EVAL_AUTO_TOKENS)


def default_batch_size(train_batch: int, block_size: int, vocab_size: int) -> int:
    """Windows per forward pass: train.batch_size fits in memory; more speeds small models up, as long as a
    batch stays within 65,536 tokens and its logits within 256 MiB."""
    return max(train_batch, min(2**16 // block_size, 2**26 // (block_size * vocab_size)))


def windows(n_tokens: int, block_size: int, stride: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The windows that predict tokens 1 .. n_tokens - 1 once each: (start of each window's input, offset
    within the window of its first counted prediction)."""
    stride = stride or block_size
    n_windows = 1 + max(0, math.ceil((n_tokens - 1 - block_size) / stride))
    starts = np.arange(n_windows, dtype=np.int64) * stride
    first = np.full(n_windows, block_size - stride, dtype=np.int64)
    first[0] = 0
    return starts, first


def window_batch(
    tokens: np.ndarray | TokenFiles, starts: np.ndarray, first: np.ndarray, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets (len(starts), block_size) int64; targets not counted (context only, or past the
    end) are -1."""
    n = len(tokens)
    positions = starts[:, None] + np.arange(block_size)
    ids = tokens[np.minimum(starts[:, None] + np.arange(block_size + 1), n - 1)].astype(np.int64)
    x, y = ids[:, :-1], ids[:, 1:]
    counted = (positions + 1 <= n - 1) & (np.arange(block_size) >= first[:, None])
    return x, np.where(counted, y, -1)


@torch.no_grad()
def evaluate_tokens(
    model: torch.nn.Module,
    tokens: np.ndarray | TokenFiles,
    byte_lengths: np.ndarray,
    batch_size: int,
    stride: int | None = None,
    rt: Runtime | None = None,
    progress: Callable[[int], None] | None = None,
    what: str = "the text",
) -> TokenLoss:
    """The loss of `model` on every token of `tokens` (an array, or a prepared split's files, read a batch at
    a time). `progress(n)` is called with the predictions of each batch done on this rank. Fewer than 2
    tokens is a UserError naming `what`: a loss over no predictions would read as a perfect one."""
    block_size = model.config.block_size
    n_tokens = len(tokens)
    if n_tokens < 2:
        raise UserError(
            f"{what} holds {n_tokens} token{'s' if n_tokens != 1 else ''}: nothing to predict (the first "
            "token has no context, so an evaluation needs at least 2); give a longer text"
        )
    rank, world = (rt.rank, rt.world_size) if rt is not None else (0, 1)
    device = next(model.parameters()).device
    autocast = rt.autocast if rt is not None else contextlib.nullcontext
    byte_table = torch.as_tensor(byte_lengths, device=device, dtype=torch.int64)
    starts, first = windows(n_tokens, block_size, stride)
    batches = [slice(i, i + batch_size) for i in range(0, len(starts), batch_size)]
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # tokens, nats, bytes
    was_training = model.training
    model.eval()
    start_time = time.perf_counter()
    tuner = rt.thread_tuner() if rt is not None else ThreadTuner.for_device(device)
    for k in range(rank, math.ceil(len(batches) / world) * world, world):
        batch = batches[min(k, len(batches) - 1)]
        x, y = window_batch(tokens, starts[batch], first[batch], block_size)
        if max(x.max(initial=0), y.max(initial=0)) >= min(model.config.vocab_size, len(byte_lengths)):
            raise UserError(
                f"the tokens hold id {max(x.max(), y.max())}, past the vocabulary of the model or its "
                f"tokenizer ({min(model.config.vocab_size, len(byte_lengths))}): not tokenized for this model"
            )
        if k >= len(batches):  # no batch left for this rank: run one counting nothing, in step with the rest
            y[:] = -1
        x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        with tuner.timed(), autocast():
            logits, _ = model(x)
        nats = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-1, reduction="none")
        counted = y.flatten() >= 0
        n_bytes = (byte_table[y.flatten().clamp(min=0)] * counted).sum()
        sums += torch.stack([counted.sum(), nats.sum(), n_bytes]).double()
        if progress is not None:
            progress(int(counted.sum()))
    model.train(was_training)
    if rt is not None:
        sums = distributed.all_sum(sums, rt)
    tokens_done, nats_sum, bytes_sum = sums.tolist()
    return TokenLoss(int(tokens_done), nats_sum, int(bytes_sum), time.perf_counter() - start_time)


@dataclass
class ChoiceScore:
    items: int
    acc: float  # the ending with the lowest total loss
    acc_per_token: float  # lowest loss per token (nanoGPT's and llm.c's acc_norm)
    acc_per_char: float  # lowest loss per character of the ending (lm-evaluation-harness's acc_norm)
    acc_per_byte: float  # lowest loss per UTF-8 byte of the ending (lm-evaluation-harness's acc_bytes)
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


def choice_losses(model: torch.nn.Module, tokenizer: Tokenizer, item: Choice, autocast=None) -> torch.Tensor:
    """The total loss in nats of each ending of `item` given its context (float64, on the CPU)."""
    return ending_losses(model, encode_choice(item, tokenizer, model.config.block_size), autocast)[0]


def score_choices(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    items: list[Choice],
    autocast=None,
    progress: Callable[[int], None] | None = None,
) -> ChoiceScore:
    """Accuracy of `model` on multiple-choice items: each ending scored by its loss given the context, in
    total and per token, character and byte."""
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
