"""What a patching experiment measures: a clean and a corrupted input of the same shape, a metric of
the model's logits, and the direction of the patches (interp/patching.py, attribution.py,
paths.py, task_circuit.py).

The tasks: a prompt pair (`prompt_pair`, heads.py --patch: the logit difference logit(a) - logit(b)
at the last position), repeated random sequences (`repeat_task`, the induction task: clean [R, R],
corrupted [R', R]; the mean log-probability of the second copy's true next tokens, which copying
lifts from about -ln(vocab) to near 0) and validation windows whose token before the last is swapped
for another window's (`previous_token_task`: the next token's log-probability); a JSONL file's
prompt pairs are interp/task_file.py's. A patch runs one input (the base) with activations from the
other (the source) and scores the fraction of the way it goes, (metric(patched) - metric(base)) /
(metric(source) - metric(base)). Denoising (the default: base corrupted) asks what restores the
clean behaviour; noising (`noised()`, as Wang et al. 2022 path-patch) what breaks when it alone is
corrupted. A metric is averaged over rows, so rows may be split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from interp.scores import evaluating, repeated_tokens
from model import GPT

# logits (..., rows, T, vocab), rows -> (..., rows)
Metric = Callable[[torch.Tensor, slice], torch.Tensor]
# (row, position, token, weight): what the answer's logit is made of
Answer = tuple[int, int, int, float]


@dataclass
class Task:
    clean: torch.Tensor  # (B, T) token ids
    corrupted: torch.Tensor  # (B, T)
    metric: Metric  # per row, from the logits of those rows
    description: str  # one line for people: what the inputs are and what the metric measures
    # the logits the metric reads on the clean run, weighted (for direct attribution)
    answers: list[Answer]
    # False: clean patched into the corrupted run; True: corrupted into the clean run
    noising: bool = False
    # the positions whose predictions the metric reads (a KL metric compares them)
    positions: slice = field(default_factory=lambda: slice(-1, None))

    @property
    def base(self) -> torch.Tensor:
        return self.clean if self.noising else self.corrupted

    @property
    def source(self) -> torch.Tensor:
        return self.corrupted if self.noising else self.clean

    def noised(self) -> Task:
        return replace(self, noising=True)

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        """The metric of logits (..., B, T, vocab) of every row, averaged over the rows: (...)."""
        return self.metric(logits, slice(None)).mean(dim=-1)

    def ends(self, base: float, source: float) -> dict[str, float]:
        """The metric on the base and the source run, named as the inputs are: clean, corrupted."""
        clean, corrupted = (base, source) if self.noising else (source, base)
        return {"metric_clean": clean, "metric_corrupted": corrupted}

    @property
    def direction(self) -> str:
        return (
            "corrupted into clean (noising)" if self.noising else "clean into corrupted (denoising)"
        )


def _logit_difference(a: int, b: int) -> Metric:
    def metric(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        last = logits[..., -1, :].float()
        return last[..., a] - last[..., b]

    return metric


@torch.no_grad()
def prompt_pair(
    model: GPT, clean: list[int], corrupted: list[int], name: Callable[[int], str] = str
) -> Task:
    """The logit difference task of two prompts, its tokens named by `name` (a token's text);
    ValueError when their lengths differ or both runs predict the same token."""
    if len(clean) != len(corrupted):
        raise ValueError(
            f"the prompts have {len(clean)} and {len(corrupted)} tokens; patching needs equal"
        )
    device = next(model.parameters()).device
    idx = torch.tensor([clean, corrupted], dtype=torch.long, device=device)
    with evaluating(model):
        a, b = (int(i) for i in model(idx)[0][:, -1].argmax(dim=-1))
    if a == b:
        raise ValueError(f"both prompts make token {a} the most likely next; patching needs two")
    return Task(
        idx[:1],
        idx[1:],
        _logit_difference(a, b),
        f"logit difference logit({name(a)}) - logit({name(b)}) after the prompts",
        [(0, len(clean) - 1, a, 1.0), (0, len(clean) - 1, b, -1.0)],
    )


def _copy_log_probability(tokens: torch.Tensor, n: int) -> Metric:
    targets = tokens[:, n + 1 :]  # the tokens predicted at positions n .. 2n - 2

    def metric(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        logp = F.log_softmax(logits[..., n:-1, :].float(), dim=-1)
        wanted = targets[rows].expand(*logp.shape[:-1])
        return logp.gather(-1, wanted[..., None])[..., 0].mean(dim=-1)

    return metric


def repeat_task(model: GPT, sequences: int = 16, seed: int = 0) -> Task:
    """Clean [R, R] against corrupted [R', R] (R of n = min(block_size / 2, vocab) tokens), the
    metric the mean log-probability of the second copy's tokens (see the module's doc)."""
    cfg = model.config
    device = next(model.parameters()).device
    n = min(cfg.block_size // 2, cfg.vocab_size)
    if n < 3:
        raise ValueError(f"block_size={cfg.block_size} is too short for [R, R] sequences")
    clean = repeated_tokens(cfg.vocab_size, n, sequences, seed).to(device)
    # R': not any --seed's R
    other_seed = int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])
    other = repeated_tokens(cfg.vocab_size, n, sequences, other_seed)
    corrupted = torch.cat([other[:, :n].to(device), clean[:, n:]], dim=1)
    weight = 1.0 / (sequences * (n - 1))
    answers = [
        (r, p, int(clean[r, p + 1]), weight) for r in range(sequences) for p in range(n, 2 * n - 1)
    ]
    return Task(
        clean,
        corrupted,
        _copy_log_probability(clean, n),
        f"mean log-probability of the second copy's tokens in [R, R] ({sequences} sequences, R of "
        f"{n} tokens), corrupted: [R', R]",
        answers,
        positions=slice(n, 2 * n - 1),
    )


PREVIOUS_TOKEN_CONTEXT = 32  # the previous-token task's windows: this many tokens (or the context)


def previous_token_task(model: GPT, val, rows: int = 64, seed: int = 0) -> Task:
    """Validation windows (clean) against the same windows with the token before the last replaced
    by the one another window has there (corrupted: from the data's own distribution); the metric
    the log-probability of the true next token after the last: how much the prediction uses the
    token before the last. `val`: data/loader.py's TokenWindows."""
    T = min(model.config.block_size, PREVIOUS_TOKEN_CONTEXT)
    x, y = val.batch(seed, rows, stream=4)
    x = x[:, -T:].cpu()
    targets = y[:, -1].cpu()
    corrupted = x.clone()
    for shift in range(1, rows):  # each row's token from the next row whose token differs
        same = corrupted[:, -2] == x[:, -2]
        corrupted[same, -2] = x.roll(shift, dims=0)[same, -2]
    device = next(model.parameters()).device
    x = x.to(device)
    corrupted = corrupted.to(device)
    targets = targets.to(device)
    return Task(
        x,
        corrupted,
        answer_log_probability(targets),
        f"log-probability of the next token after {rows} validation windows of {T} tokens, "
        "corrupted: the token before the last from another window",
        [(r, T - 1, int(targets[r]), 1.0 / rows) for r in range(rows)],
    )


def _last(logits: torch.Tensor, tokens: torch.Tensor, rows: slice) -> torch.Tensor:
    """Each row's value at its token in the last position's logits (..., rows)."""
    last = logits[..., -1, :].float()
    return last.gather(-1, tokens[rows].expand(*last.shape[:-1])[..., None])[..., 0]


def answer_log_probability(answers: torch.Tensor) -> Metric:
    """Each row's log-probability of its answer (B,) after the last position."""

    def metric(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        return _last(F.log_softmax(logits[..., -1:, :].float(), dim=-1), answers, rows)

    return metric


def answer_difference(answers: torch.Tensor, wrong: torch.Tensor) -> Metric:
    """Each row's logit difference between its answer and its wrong answer (each (B,))."""

    def metric(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        return _last(logits, answers, rows) - _last(logits, wrong, rows)

    return metric
