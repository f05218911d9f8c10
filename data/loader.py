"""Training batches: random windows of block_size + 1 tokens from a prepared split.

Stateless: the windows of micro-batch `key` come from a generator seeded by (seed, split, stream,
key), so resuming needs no sampler state and each torchrun rank asks for its own keys. A split is
one sequence however many files hold it (data/shards.py): a window may span two shards.
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
        # one vectorised gather from files mapped afresh (data/shards.py says why)
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
