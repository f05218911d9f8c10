"""Evaluation: a training run's loss estimate; the exact loss over every token of a text, and bits
per byte (eval.py scores multiple choice); an eval's sample of the model as it is.

`evaluate_tokens` predicts every token exactly once, in windows of block_size (with `stride` S the
windows slide by S and only their last S predictions count, as in the transformers perplexity
guide); under torchrun the batches are dealt out to the ranks, each running as many forward passes
(FSDP needs it). Bits per byte: the loss in nats / ln 2 / the UTF-8 bytes of the predicted tokens.
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
from data.loader import TokenFiles, TokenWindows
from data.tokenizers import Tokenizer, bits_per_byte
from runs.config_schema import Config
from runs.runtime import Runtime

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


@torch.no_grad()
def estimate_loss(
    forward: torch.nn.Module,
    splits: dict[str, TokenWindows],
    cfg: Config,
    rt: Runtime,
    byte_lengths: torch.Tensor | None = None,
) -> dict[str, float]:
    """A training run's mean loss over the same train.eval_iters batches of each split at every
    eval, shared across ranks: {"train": loss, "val": loss, "train_bpb": bits per byte, "val_bpb":
    ...} (bpb: where `byte_lengths`, the UTF-8 bytes of each token id, is known). Every rank runs
    the same number of forward passes (under FSDP each is a collective): where eval_iters is not a
    multiple of the number of ranks, the ranks short of a batch run one more that counts for
    nothing."""
    forward.eval()
    out = {}
    tuner = rt.thread_tuner()
    per_rank = -(-cfg.train.eval_iters // rt.world_size)
    for name, data in splits.items():
        # sum of batch losses, batches, sum of bytes per token
        total = torch.zeros(3, device=rt.device)
        for key in range(rt.rank, per_rank * rt.world_size, rt.world_size):
            x, y = data.batch(key, cfg.train.batch_size, stream=1)
            with tuner.timed(), rt.autocast():
                _, loss = forward(x, y)
            # past it, a forward only keeps FSDP's collectives in step
            if key < cfg.train.eval_iters:
                one = torch.ones((), device=rt.device)
                n_bytes = byte_lengths[y].sum().float() if byte_lengths is not None else 0 * one
                total += torch.stack([loss.float(), one, n_bytes / y.numel()])
        loss_sum, count, bytes_per_token = rt.all_sum(total).tolist()  # over the ranks
        out[name] = loss_sum / count
        if bytes_per_token:  # every batch has the same number of tokens
            out[f"{name}_bpb"] = bits_per_byte(loss_sum, bytes_per_token)
    forward.train()
    return out


def final_eval_wanted(setting: str, val_tokens: int) -> bool:
    """train.final_eval: true, false, or auto (when the val split takes seconds:
    FINAL_EVAL_AUTO_TOKENS)."""
    setting = str(setting).lower()
    return setting == "true" or (setting == "auto" and val_tokens <= FINAL_EVAL_AUTO_TOKENS)


def default_batch_size(train_batch: int, block_size: int, vocab_size: int) -> int:
    """Windows per forward pass: train.batch_size fits in memory; more speeds small models up, as
    long as a batch stays within 65,536 tokens and its logits within 256 MiB."""
    return max(train_batch, min(2**16 // block_size, 2**26 // (block_size * vocab_size)))


def windows(
    n_tokens: int, block_size: int, stride: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The windows that predict tokens 1 .. n_tokens - 1 once each: (start of each window's input,
    offset within the window of its first counted prediction)."""
    stride = stride or block_size
    n_windows = 1 + max(0, math.ceil((n_tokens - 1 - block_size) / stride))
    starts = np.arange(n_windows, dtype=np.int64) * stride
    first = np.full(n_windows, block_size - stride, dtype=np.int64)
    first[0] = 0
    return starts, first


def window_batch(
    tokens: np.ndarray | TokenFiles, starts: np.ndarray, first: np.ndarray, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets (len(starts), block_size) int64; targets not counted (context only, or
    past the end) are -1."""
    n = len(tokens)
    positions = starts[:, None] + np.arange(block_size)
    ids = tokens[np.minimum(starts[:, None] + np.arange(block_size + 1), n - 1)].astype(np.int64)
    x, y = ids[:, :-1], ids[:, 1:]
    counted = (positions + 1 <= n - 1) & (np.arange(block_size) >= first[:, None])
    return x, np.where(counted, y, -1)


def check_ids(x: np.ndarray, y: np.ndarray, vocab_size: int) -> None:
    """Refuse ids past the vocabulary of the model or its tokenizer: the text was tokenized for
    another model."""
    largest = max(x.max(initial=0), y.max(initial=0))
    if largest >= vocab_size:
        raise UserError(
            f"the tokens hold id {largest}, past the vocabulary of the model or its tokenizer "
            f"({vocab_size}): not tokenized for this model"
        )


def batch_sums(logits: torch.Tensor, y: torch.Tensor, byte_table: torch.Tensor) -> torch.Tensor:
    """(predictions, nats, bytes) of one batch, in float64: targets of -1 are not counted."""
    nats = F.cross_entropy(
        logits.float().flatten(0, 1), y.flatten(), ignore_index=-1, reduction="none"
    )
    counted = y.flatten() >= 0
    n_bytes = (byte_table[y.flatten().clamp(min=0)] * counted).sum()
    return torch.stack([counted.sum(), nats.sum(), n_bytes]).double()


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
    """The loss of `model` on every token of `tokens` (an array, or a prepared split's files, read a
    batch at a time). `progress(n)` is called with the predictions of each batch done on this rank.
    Fewer than 2 tokens is a UserError naming `what`: a loss over no predictions would read as a
    perfect one."""
    block_size = model.config.block_size
    n_tokens = len(tokens)
    if n_tokens < 2:
        raise UserError(
            f"{what} holds {n_tokens} token{'s' if n_tokens != 1 else ''}: nothing to predict (the "
            "first token has no context, so an evaluation needs at least 2); give a longer text"
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
        check_ids(x, y, min(model.config.vocab_size, len(byte_lengths)))
        # no batch left for this rank: run one counting nothing, in step with the rest
        if k >= len(batches):
            y[:] = -1
        x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        with tuner.timed(), autocast():
            logits, _ = model(x)
        counted = batch_sums(logits, y, byte_table)
        sums += counted
        if progress is not None:
            progress(int(counted[0]))
    model.train(was_training)
    if rt is not None:
        sums = rt.all_sum(sums)  # over the ranks
    tokens_done, nats_sum, bytes_sum = sums.tolist()
    return TokenLoss(int(tokens_done), nats_sum, int(bytes_sum), time.perf_counter() - start_time)


# --- an eval's sample ---


def sample_prompt(cfg: Config, tokenizer: Tokenizer) -> list[int]:
    """The ids of log.sample_prompt (default: a newline, or <|endoftext|> for BPE), as sample.py has
    them."""
    from data.prompts import encode_prompt, read_prompt

    return encode_prompt(
        read_prompt(cfg.log.sample_prompt, None, tokenizer), tokenizer, cfg.model.context_limit
    )


def draw_sample(model: torch.nn.Module, tokenizer: Tokenizer, cfg: Config, rt: Runtime) -> str:
    """log.sample_tokens tokens from the model as it is now, after log.sample_prompt: temperature
    0.8, seeded by train.seed, in fp32; compiled where sample.py left the step on disk (never built
    beside training)."""
    from sampling.generate import generate
    from sampling.steps import kept_on_disk

    n = cfg.log.sample_tokens
    gen = torch.Generator(device=rt.device).manual_seed(cfg.train.seed)
    idx = torch.tensor([sample_prompt(cfg, tokenizer)], device=rt.device)
    model.eval()
    tuner = rt.thread_tuner(tries=8)
    compiled = not rt.distributed and kept_on_disk(model, 1)
    tokens = [
        t.item()
        for t in generate(model, idx, n, 0.8, None, None, gen, compile=compiled, tuner=tuner)
    ]
    model.train()
    return tokenizer.decode(idx[0].tolist()) + tokenizer.decode(tokens)
