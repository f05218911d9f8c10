"""A task of your own for heads.py --discover: a JSONL file, one prompt pair per line.

    {"clean": "the kin", "corrupted": "the sin", "answer": "g", "wrong": "s"}

`clean` and `corrupted` are texts of the same number of tokens (every line's too: the rows run as
one batch); `answer` is the token the model should predict after the clean prompt, one token of the
model's vocabulary; `wrong`, optional on every line or on none, the one it should predict after the
corrupted prompt. The metric is the logit difference logit(answer) - logit(wrong) at the last
position where every line has `wrong`, else the answer's log-probability. A bad line is one error
naming its number. docs/heads.md walks through docs/heads/words.jsonl on the default Shakespeare
model."""

from __future__ import annotations

from pathlib import Path

import torch

from common.errors import UserError
from common.user_text import json_line, read_user_text, user_text
from data.tokenizers import encode_text
from interp.tasks import Task, answer_difference, answer_log_probability
from model import GPT

KEYS = ("clean", "corrupted", "answer", "wrong")


def _line(raw: str, number: int, where: str) -> dict:
    line = json_line(raw, f"{where} line {number}", KEYS[:3], KEYS[3:])
    for key, value in line.items():
        if not isinstance(value, str) or value == "":
            raise UserError(f"{where} line {number}: {key} must be a non-empty text, got {value!r}")
    return line


def _encode(text: str, tokenizer, what: str) -> list[int]:
    return encode_text(user_text(text, what, "write the file in UTF-8"), tokenizer, what).tolist()


def _token(text: str, tokenizer, what: str) -> int:
    ids = _encode(text, tokenizer, what)
    if len(ids) != 1:
        raise UserError(
            f"{what} {text!r} is {len(ids)} tokens; give one token of the model's vocabulary"
        )
    return ids[0]


def _no_gap(same_prompts: bool, same_answers: bool, at: str) -> None:
    """Refused: a line that cannot tell the clean run from the corrupted one (it has no gap, and f's
    interval divides by 0 on resamples of it alone)."""
    if same_prompts:
        raise UserError(
            f"{at} the clean and the corrupted prompt are the same tokens: a line with no "
            "difference has no gap to share; change the corrupted prompt"
        )
    if same_answers:
        raise UserError(
            f"{at} answer and wrong are the same token: their logit difference is 0 on every run; "
            "give a wrong answer that differs"
        )


def read_task_file(path: str, tokenizer, context: int | None) -> tuple[list, list[dict]]:
    """The lines of a task file, checked, with their ids: ([(clean, corrupted, answer, wrong or
    None)], the lines as read)."""
    where = f"task file {path}"
    text = read_user_text(path, "task file")
    rows = []
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        line = _line(raw, number, where)
        at = f"{where} line {number}:"
        clean = _encode(line["clean"], tokenizer, f"{at} the clean prompt")
        corrupted = _encode(line["corrupted"], tokenizer, f"{at} the corrupted prompt")
        if len(clean) != len(corrupted):
            raise UserError(
                f"{at} the clean prompt is {len(clean)} tokens and the corrupted one "
                f"{len(corrupted)}; "
                "give two of the same length"
            )
        if rows and len(clean) != len(rows[0][0]):
            raise UserError(
                f"{at} {len(clean)} tokens where the first line has {len(rows[0][0])}; every "
                "prompt of "
                "a task file has the same length (they run as one batch)"
            )
        if context is not None and len(clean) > context:
            raise UserError(
                f"{at} {len(clean)} tokens, longer than the model's context of {context}"
            )
        answer = _token(line["answer"], tokenizer, f"{at} the answer")
        wrong = (
            _token(line["wrong"], tokenizer, f"{at} the wrong answer") if "wrong" in line else None
        )
        _no_gap(clean == corrupted, answer == wrong, f"{path}:{number}:")
        rows.append((clean, corrupted, answer, wrong))
        lines.append(line)
    if not rows:
        raise UserError(f"{where} has no lines; write one JSON object per line (docs/heads.md)")
    if len({r[3] is None for r in rows}) > 1:
        raise UserError(f"{where}: give `wrong` on every line or on none")
    return rows, lines


def file_task(model: GPT, path: str, tokenizer) -> Task:
    """The task of a JSONL file (see the module's doc)."""
    rows, _ = read_task_file(path, tokenizer, model.config.context_limit)
    device = next(model.parameters()).device

    def column(i: int) -> torch.Tensor:
        return torch.tensor([r[i] for r in rows], dtype=torch.long, device=device)

    clean = column(0)
    corrupted = column(1)
    answers = column(2)
    T = clean.size(1)
    B = len(rows)
    name = Path(path).name
    if rows[0][3] is None:
        metric = answer_log_probability(answers)
        described = f"log-probability of the answer after the {B} clean prompts of {name}"
        weights = [(r, T - 1, int(answers[r]), 1.0 / B) for r in range(B)]
    else:
        wrong = column(3)
        metric = answer_difference(answers, wrong)
        described = f"logit difference answer - wrong after the {B} clean prompts of {name}"
        weights = [(r, T - 1, int(answers[r]), 1.0 / B) for r in range(B)]
        weights += [(r, T - 1, int(wrong[r]), -1.0 / B) for r in range(B)]
    return Task(clean, corrupted, metric, described, weights)
