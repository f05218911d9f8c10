"""Evaluation data besides the prepared splits: any text file, and multiple-choice files in
HellaSwag's format.

- `encode_text_file`: a UTF-8 file tokenised with a model's tokenizer, as one sequence, read as
  prepare.py reads it (data/sources.py's TextFile: no byte-order mark, CRLF read as LF, and its
  errors for a missing, empty or non-UTF-8 file; characters a character vocabulary lacks are named).
- `read_choices`: JSON lines (read by common/user_text.py's rule) with `ctx` (the context),
  `endings` (the candidate continuations) and `label` (the index of the right one), the fields of
  the published HellaSwag files (others are ignored). A mistake in the file names its line.
  `encode_choice` joins context and ending as nanoGPT's and llm.c's HellaSwag scripts do: the ending
  follows after a space (unless either side already has whitespace there) and is tokenised on its
  own, so its tokens are the same whatever the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import UserError
from common.user_text import json_line, read_user_text
from data.sources import TextFile
from data.tokenizers import Tokenizer, encode_text


def encode_text_file(path: str | Path, tokenizer: Tokenizer) -> np.ndarray:
    """Every token of a UTF-8 text file (int64)."""
    source = TextFile(str(path), val_fraction=0.0)
    source.check()
    pieces = [encode_text(text, tokenizer, str(path)) for text in source.documents("train")]
    return np.concatenate(pieces)


@dataclass
class Choice:
    ctx: str
    endings: list[str]
    label: int
    line: int  # in the file, for error messages


def read_choices(path: str | Path) -> list[Choice]:
    """The items of a multiple-choice JSONL file; a malformed line is one error naming it."""
    path = Path(path)
    lines = read_user_text(path, "choices file", "check the path (--choices)").splitlines()
    items = []
    for n, line in enumerate(lines, start=1):
        if line.strip():
            items.append(_parse_choice(line, n, path))
    if not items:
        raise UserError(f"choices file {path} has no items; it needs one JSON object per line")
    return items


def _parse_choice(line: str, n: int, path: Path) -> Choice:
    where = f"{path} line {n}"
    row = json_line(line, where, ("ctx", "endings", "label"))
    ctx, endings, label = row["ctx"], row["endings"], row["label"]
    if not isinstance(ctx, str) or not ctx:
        raise UserError(f"{where}: ctx must be a non-empty string")
    if not (
        isinstance(endings, list)
        and len(endings) >= 2
        and all(isinstance(e, str) and e for e in endings)
    ):
        raise UserError(f"{where}: endings must be a list of at least two non-empty strings")
    if isinstance(label, str) and label.isdigit():  # some copies of HellaSwag write it as a string
        label = int(label)
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(endings):
        raise UserError(
            f"{where}: label must be the index of the right ending, 0 to {len(endings) - 1}"
        )
    return Choice(ctx, endings, label, n)


def encode_choice(
    item: Choice, tokenizer: Tokenizer, block_size: int
) -> list[tuple[list[int], int]]:
    """For each ending: (context + ending token ids, number of ending tokens), the context cut from
    the left so that the sequence fits block_size + 1 tokens (the model predicts all but the
    first)."""
    where = f"line {item.line}"
    ctx = encode_text(item.ctx, tokenizer, f"{where}'s ctx").tolist()
    out = []
    for ending in item.endings:
        joined = ending if item.ctx[-1].isspace() or ending[0].isspace() else " " + ending
        ids = encode_text(joined, tokenizer, f"{where}'s endings").tolist()
        if len(ids) > block_size:
            raise UserError(
                f"{where}: an ending of {len(ids)} tokens does not fit the model's context of "
                f"{block_size}"
            )
        keep = block_size + 1 - len(ids)
        out.append((ctx[-keep:] + ids, len(ids)))
    return out
