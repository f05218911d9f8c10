"""A prepared split's tokens, read as one sequence, and the training batches taken from them.

A split is the ids of its text back to back. data/prepare.py writes it in shards of about
--shard-tokens ids, each ending where a document (or a piece of a text file) ends:
`train-00000.bin`, `train-00001.bin`, ..., or one file `train.bin` when the split fits in one shard.
meta.json lists the files in order with their counts (`shards`); a dataset prepared before shards
existed lists none and has one file per split (`train.bin`, `val.bin`), which reads the same.
- `TokenFiles` is the one reader: ids at any positions (a window may span two shards, which hold
  consecutive text), mapped afresh on each call (`_map` says why), and its length.
- `check` compares each file with its count and, up to CHECKED_TOKENS ids, every id with the
  vocabulary, once per process (a changed file is checked again); past that, `TokenWindows` checks
  each batch.
- `TokenWindows` takes the training batches: random windows of block_size + 1 tokens. Stateless:
  the windows of micro-batch `key` come from a generator seeded by (seed, split, stream, key), so
  resuming needs no sampler state and each torchrun rank asks for its own keys.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError

SPLITS = ("train", "val")  # every dataset's, in this order

# splits up to this many ids have all of them checked when opened (~0.1 s per GB)
CHECKED_TOKENS = 1 << 30
SHARD_NAME = re.compile(r"^(train|val)(-\d{5})?\.bin$")


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def single_name(split: str) -> str:
    """The file of a split in one piece (and of every split of a dataset from before shards)."""
    return f"{split}.bin"


def file_tokens(path: Path | str, dtype: str | np.dtype) -> int:
    """The number of ids in a file of `dtype` ids; a missing file or one whose size is not a whole
    number of ids is one line."""
    itemsize = np.dtype(dtype).itemsize
    try:
        size = Path(path).stat().st_size
    except OSError:
        raise UserError(
            f"{path} is missing; prepare the dataset again (python prepare.py ...)"
        ) from None
    if size % itemsize:
        raise UserError(
            f"{path} is damaged: {size:,} bytes are not a whole number of {np.dtype(dtype).name} "
            "ids; prepare the dataset again"
        )
    return size // itemsize


@dataclass(frozen=True)
class TokenFiles:
    """The ids of one or more files of `dtype` ids, read as one sequence."""

    paths: tuple[str, ...]
    dtype: np.dtype
    ends: tuple[int, ...]  # where each file's ids end in the sequence

    @classmethod
    def of(cls, paths: Path | str | Sequence[Path | str], dtype: str | np.dtype) -> TokenFiles:
        """The files (or one file) in order, their counts read from their sizes."""
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        counts = [file_tokens(p, dtype) for p in paths]
        return cls(
            tuple(map(str, paths)),
            np.dtype(dtype),
            tuple(np.cumsum(counts, dtype=np.int64).tolist()),
        )

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    @property
    def where(self) -> str:
        """The file, or the shards and their folder, for messages."""
        if len(self.paths) == 1:
            return self.paths[0]
        return f"{Path(self.paths[0]).parent} ({len(self.paths)} shards)"

    def _map(self, i: int) -> np.ndarray:
        # a fresh map per read costs microseconds; one map held for a whole run lets the resident
        # pages of a large file pile up (the RAM growth nanoGPT's users hit)
        return np.memmap(self.paths[i], dtype=self.dtype, mode="r")

    def __getitem__(self, index: np.ndarray | slice) -> np.ndarray:
        """The ids at `index`: an array of positions (any shape), or a slice of positions in
        order."""
        if isinstance(index, slice):
            index = np.arange(*index.indices(len(self)))
        index = np.asarray(index)
        if len(self.paths) == 1:
            return np.asarray(self._map(0)[index])
        flat = index.ravel()
        which = np.searchsorted(self.ends, flat, side="right")  # the file of each position
        out = np.empty(flat.shape, dtype=self.dtype)
        starts = (0, *self.ends)
        for i in np.unique(which):  # one map per file touched
            picked = which == i
            out[picked] = self._map(int(i))[flat[picked] - starts[i]]
        return out.reshape(index.shape)


def check(files: TokenFiles, counts: Sequence[int], vocab_size: int) -> None:
    """Each file's size against its count in meta.json and, up to CHECKED_TOKENS ids, every id
    against the vocabulary: once per process for files that have not changed since."""
    stamps = []
    for path in files.paths:
        try:
            stat = Path(path).stat()
        except OSError:
            raise UserError(
                f"{path} is missing; prepare the dataset again (python prepare.py ...)"
            ) from None
        stamps.append((stat.st_size, stat.st_mtime_ns))
    _check(files.paths, files.dtype.name, tuple(counts), vocab_size, tuple(stamps))


@functools.lru_cache(maxsize=64)
def _check(
    paths: tuple[str, ...], dtype: str, counts: tuple[int, ...], vocab_size: int, stamps
) -> None:
    for path, count in zip(paths, counts):
        n = file_tokens(path, dtype)
        if n != count:
            raise UserError(
                f"{path} holds {n:,} ids but meta.json says {count:,}: the dataset was changed "
                "after it was prepared; prepare it again"
            )
    if sum(counts) > CHECKED_TOKENS:  # too much to read now: TokenWindows checks each batch
        return
    for path, count in zip(paths, counts):
        data = np.memmap(path, dtype=dtype, mode="r") if count else np.zeros(0, dtype)
        top = 0
        for start in range(0, count, 1 << 24):
            top = max(top, int(data[start : start + (1 << 24)].max()))
        if top >= vocab_size:
            raise UserError(
                f"{path} holds id {top}, past the vocabulary of {vocab_size} (meta.json): the "
                "split was not made by this dataset's tokenizer; prepare the dataset again"
            )


# --- the training batches ---


class TokenWindows:
    def __init__(
        self,
        tokens: TokenFiles,
        block_size: int,
        device: torch.device,
        seed: int,
        split: str,
        max_id: int | None = None,
    ):
        """Windows of a split; with `max_id` (a split too large to be checked at opening) each
        batch's ids are checked to be below it."""
        self.tokens = tokens
        self.block_size = block_size
        self.device = device
        self.seed = seed
        self.split_id = 0 if split == "train" else 1
        self.max_id = max_id
        self.n_tokens = len(tokens)
        if self.n_tokens < block_size + 1:
            raise UserError(
                f"model.block_size={block_size} needs windows of {block_size + 1} tokens, but the "
                f"{split} split ({tokens.where}) has only {self.n_tokens}; lower model.block_size "
                "or use more text"
            )
        self._arange = np.arange(block_size + 1, dtype=np.int64)

    def batch(
        self, key: int, batch_size: int, stream: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (batch_size, block_size) int64, for micro-batch `key`
        of `stream` (0: training batches, 1: the fixed eval batches)."""
        gen = np.random.default_rng([self.seed, self.split_id, stream, key])
        starts = gen.integers(0, self.n_tokens - self.block_size, size=batch_size)
        cuda = self.device.type == "cuda"
        # on CUDA one pinned buffer, copied without waiting and cut on the GPU
        windows = torch.empty((batch_size, self.block_size + 1), dtype=torch.int64, pin_memory=cuda)
        # one vectorised gather from files mapped afresh (TokenFiles._map says why)
        windows.numpy()[:] = self.tokens[starts[:, None] + self._arange]
        # an id past the vocabulary would fail in the embedding (on CUDA, a device-side assert that
        # ends the process); a split small enough had every id checked once when it was opened
        if self.max_id is not None and windows.numpy().max() >= self.max_id:
            raise UserError(
                f"{self.tokens.where} holds id {windows.numpy().max()}, past the vocabulary of "
                f"{self.max_id}; the split was not made by this dataset's tokenizer: prepare the "
                "dataset again"
            )
        windows = windows.to(self.device, non_blocking=cuda)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
