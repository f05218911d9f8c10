"""A synthetic dataset for watching induction heads form: random segments that repeat.

The text is a stream of random segments (characters drawn uniformly from `alphabet`, length uniform in
[min_len, max_len]); each segment appears `min_repeats`..`max_repeats` times, separated by 0..`max_gap`
random filler characters, so a repeat starts at a random distance. Predicting the second and later copies
of a segment needs in-context copying: find the previous occurrence of the current character and predict
what followed it (an induction head). With `shakespeare` > 0 that fraction of the stream is Shakespeare
text instead (real language mixed with copying). Deterministic for a given seed and split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from tinygpt.errors import UserError

PIECE = 1 << 16  # characters per yielded piece


@dataclass(frozen=True)
class Repeats:
    train_chars: int = 1_000_000
    val_chars: int = 100_000
    alphabet: str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    min_len: int = 8
    max_len: int = 32
    min_repeats: int = 2
    max_repeats: int = 4
    max_gap: int = 8
    shakespeare: float = 0.0
    seed: int = 0
    separate_documents = False

    def describe(self) -> dict:
        return {"type": "repeats", **self.__dict__}

    def check(self) -> None:
        if not (0 < self.min_len <= self.max_len and 1 <= self.min_repeats <= self.max_repeats and self.alphabet):
            raise UserError(f"repeats dataset: impossible settings {self.describe()}")

    def documents(self, split: str) -> Iterator[str]:
        rng = np.random.default_rng([self.seed, 0 if split == "train" else 1])
        total = self.train_chars if split == "train" else self.val_chars
        letters = np.array(list(self.alphabet))
        lines = _shakespeare_lines() if self.shakespeare > 0 else []
        out, size, made = [], 0, 0
        while made < total:
            if lines and rng.random() < self.shakespeare:
                start = int(rng.integers(len(lines) - 8))
                chunk = "".join(lines[start:start + 8])
            else:
                segment = "".join(rng.choice(letters, int(rng.integers(self.min_len, self.max_len + 1))))
                parts = []
                for _ in range(int(rng.integers(self.min_repeats, self.max_repeats + 1))):
                    parts.append(segment)
                    parts.append("".join(rng.choice(letters, int(rng.integers(0, self.max_gap + 1)))))
                chunk = "".join(parts)
            chunk = chunk[:total - made]
            out.append(chunk)
            size += len(chunk)
            made += len(chunk)
            if size >= PIECE:
                yield "".join(out)
                out, size = [], 0
        if out:
            yield "".join(out)


def _shakespeare_lines() -> list[str]:
    text = (Path(__file__).resolve().parent / "tinyshakespeare.txt").read_text(encoding="utf-8")
    return text.splitlines(keepends=True)
