"""A synthetic dataset for watching induction heads form: random segments that repeat.

The text is a stream of chunks. A chunk is a random segment (length uniform in [min_len, max_len],
its characters drawn uniformly from `alphabet`, all different when `distinct`) written `min_repeats`
.. `max_repeats` times, each copy followed by 0 .. `max_gap` random filler characters (max_gap 0:
the segment repeats periodically, back to back). The first copy of a segment is unpredictable; every
later copy can be predicted by in-context copying: find the previous occurrence of the current
character and predict what followed it, which is what an induction head does. The segment length
varies, so no fixed attention offset can copy; the model has to match content. With `shakespeare` >
0 that fraction of the chunks are eight lines of Shakespeare instead (real language mixed with
copying). Deterministic for a given seed and split; about half a second per million characters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from common.errors import UserError
from data.sources import Documents, counted

PIECE = 1 << 16  # characters per yielded piece


@dataclass(frozen=True)
class Repeats:
    train_chars: int = 1_000_000
    val_chars: int = 100_000
    alphabet: str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    min_len: int = 8
    max_len: int = 32
    min_repeats: int = 3
    max_repeats: int = 6
    max_gap: int = 0
    # no character twice in a segment: every copy has one unambiguous continuation
    distinct: bool = True
    shakespeare: float = 0.0
    seed: int = 0
    separate_documents = False

    def to_meta(self) -> dict:
        return {"type": "repeats", **self.__dict__}

    def check(self) -> None:
        if not (
            0 < self.min_len <= self.max_len
            and 1 <= self.min_repeats <= self.max_repeats
            and self.max_gap >= 0
            and self.alphabet
            and 0.0 <= self.shakespeare <= 1.0
        ):
            raise UserError(f"repeats dataset: impossible settings {self.to_meta()}")
        if self.distinct and self.max_len > len(set(self.alphabet)):
            raise UserError(
                f"repeats dataset: distinct segments of up to {self.max_len} characters need at "
                f"least that many different characters, the alphabet has {len(set(self.alphabet))}"
            )

    unit = "char"  # the progress bar counts characters

    def documents(self, split: str, start: Optional[int] = None) -> Documents:
        """The split in pieces; the position is the pieces yielded (data.sources.counted)."""
        docs = counted(self._pieces(split), start)
        docs.size = self.train_chars if split == "train" else self.val_chars
        return docs

    def _pieces(self, split: str) -> Iterator[str]:
        rng = np.random.default_rng([self.seed, 0 if split == "train" else 1])
        total = self.train_chars if split == "train" else self.val_chars
        letters = np.array(list(dict.fromkeys(self.alphabet)))  # each character once
        lines = _shakespeare_lines() if self.shakespeare > 0 else []
        out = []
        size = 0
        made = 0
        while made < total:
            if lines and rng.random() < self.shakespeare:
                start = int(rng.integers(len(lines) - 8))
                chunk = "".join(lines[start : start + 8])
            else:
                chunk = "".join(self._chunk(rng, letters))
            chunk = chunk[: total - made]
            out.append(chunk)
            size += len(chunk)
            made += len(chunk)
            if size >= PIECE:
                yield "".join(out)
                out = []
                size = 0
        if out:
            yield "".join(out)

    def _chunk(self, rng: np.random.Generator, letters: np.ndarray) -> list[str]:
        length = int(rng.integers(self.min_len, self.max_len + 1))
        segment = "".join(rng.choice(letters, length, replace=not self.distinct))
        repeats = int(rng.integers(self.min_repeats, self.max_repeats + 1))
        gaps = rng.integers(0, self.max_gap + 1, size=repeats)
        filler = "".join(rng.choice(letters, int(gaps.sum())))
        parts = []
        used = 0
        for gap in gaps:
            parts += [segment, filler[used : used + gap]]
            used += gap
        return parts


def _shakespeare_lines() -> list[str]:
    text = (Path(__file__).resolve().parent / "tinyshakespeare.txt").read_text(encoding="utf-8")
    return text.splitlines(keepends=True)
