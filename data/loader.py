"""Training batches: random windows of block_size + 1 tokens from a prepared split.

- Stateless: the windows of micro-batch `key` come from a generator seeded by (seed, split, stream, key), so a
  batch depends only on its number: resuming needs no sampler state, and each torchrun rank asks for its keys.
- A split is one sequence however many files hold it (data/shards.py): a window may span two shards.
- A fresh np.memmap per batch and one vectorised gather: one map held for a whole run lets the resident pages
  of a large file pile up (the RAM growth nanoGPT's users hit); a fresh map costs microseconds.
- On CUDA the windows go into one pinned buffer, copied with non_blocking=True, and are cut on the GPU.
- Ids past the vocabulary would fail in the embedding (on CUDA, a device-side assert that ends the process):
  a split opened through data/dataset.py has every id checked once, up to CHECKED_TOKENS; a larger split
  has each batch checked on the host (`max_id`), a microsecond next to the gather.
"""

from __future__ import annotations

import numpy as np
import torch

from common.errors import UserError
from data.shards import TokenFiles


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
        """Windows of a split; with `max_id` (a split too large to be checked at opening) each batch's ids
        are checked to be below it."""
        self.tokens, self.block_size = tokens, block_size
        self.device, self.seed, self.split_id = device, seed, 0 if split == "train" else 1
        self.max_id = max_id
        self.n_tokens = len(tokens)
        if self.n_tokens < block_size + 1:
            raise UserError(
                f"model.block_size={block_size} needs windows of {block_size + 1} tokens, but the "
                f"{split} split ({tokens.where}) has only {self.n_tokens}; lower model.block_size "
                "or use more text"
            )
        self._arange = np.arange(block_size + 1, dtype=np.int64)

    def batch(self, key: int, batch_size: int, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (batch_size, block_size) int64, for micro-batch `key` of
        `stream` (0: training batches, 1: the fixed eval batches)."""
        gen = np.random.default_rng([self.seed, self.split_id, stream, key])
        starts = gen.integers(0, self.n_tokens - self.block_size, size=batch_size)
        cuda = self.device.type == "cuda"
        windows = torch.empty((batch_size, self.block_size + 1), dtype=torch.int64, pin_memory=cuda)
        windows.numpy()[:] = self.tokens[starts[:, None] + self._arange]
        if self.max_id is not None and windows.numpy().max() >= self.max_id:
            raise UserError(
                f"{self.tokens.where} holds id {windows.numpy().max()}, past the vocabulary of "
                f"{self.max_id}; the split was not made by this dataset's tokenizer: prepare the dataset "
                "again"
            )
        windows = windows.to(self.device, non_blocking=cuda)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
