"""Training batches: random windows of block_size + 1 tokens from a prepared split.

- Stateless: the windows of micro-batch `key` come from a generator seeded by (seed, split, stream, key), so a
  batch depends only on its number: resuming needs no sampler state, and each torchrun rank asks for its keys.
- A fresh np.memmap per batch and one vectorised gather: one map held for a whole run lets the resident pages
  of a large file pile up (the RAM growth nanoGPT's users hit); a fresh map costs microseconds.
- On CUDA the windows go into one pinned buffer, copied with non_blocking=True, and are cut on the GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from common.errors import UserError


class TokenWindows:
    def __init__(
        self, path: Path | str, dtype: str, block_size: int, device: torch.device, seed: int, split: str
    ):
        self.path, self.dtype, self.block_size = str(path), np.dtype(dtype), block_size
        self.device, self.seed, self.split_id = device, seed, 0 if split == "train" else 1
        if not Path(self.path).is_file():
            raise UserError(f"{self.path} is missing; prepare the dataset again (python prepare.py ...)")
        self.n_tokens = Path(self.path).stat().st_size // self.dtype.itemsize
        if self.n_tokens < block_size + 1:
            raise UserError(
                f"model.block_size={block_size} needs windows of {block_size + 1} tokens, but the "
                f"{split} split ({self.path}) has only {self.n_tokens}; lower model.block_size "
                "or use more text"
            )
        self._arange = np.arange(block_size + 1, dtype=np.int64)

    def batch(self, key: int, batch_size: int, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (batch_size, block_size) int64, for micro-batch `key` of
        `stream` (0: training batches, 1: the fixed eval batches)."""
        gen = np.random.default_rng([self.seed, self.split_id, stream, key])
        starts = gen.integers(0, self.n_tokens - self.block_size, size=batch_size)
        data = np.memmap(self.path, dtype=self.dtype, mode="r")
        cuda = self.device.type == "cuda"
        windows = torch.empty((batch_size, self.block_size + 1), dtype=torch.int64, pin_memory=cuda)
        windows.numpy()[:] = data[starts[:, None] + self._arange]
        del data
        windows = windows.to(self.device, non_blocking=cuda)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
