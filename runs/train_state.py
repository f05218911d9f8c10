"""state.pt: what a run needs to continue besides its weights: the optimizers' state keyed by parameter
name, its progress, the random generators' state (tensors and numbers only, read with
torch.load(weights_only=True), which refuses anything else).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import UserError
from runs import verify

STATE = "state.pt"


def optimizer_state(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict:
    """The optimizers' state keyed by parameter name, whole (FSDP: gathered; every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizers, options=_whole())


def _whole():
    """Full (unsharded) state dicts; under torchrun gathered to rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return StateDictOptions(full_state_dict=True, cpu_offload=distributed)


class _Recorded:
    """A file for torch.save that keeps the OSError of a failed write: torch reports it only as a
    RuntimeError ("unexpected pos ...") without the reason."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _save_state(state: dict, path: Path) -> None:
    """torch.save(state, path), failing with the OSError of the write that failed."""
    with open(path, "wb") as f:
        recorded = _Recorded(f)
        try:
            torch.save(state, recorded)
        except RuntimeError:
            if recorded.error is None:
                raise
            raise recorded.error from None


def load_optimizers(
    model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], state: dict, where: Path
) -> None:
    """Restore the optimizer state written by `write_checkpoint` (sharding it again under FSDP, for any
    number of ranks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    mismatch = UserError(
        f"checkpoint {where.parent} holds state for a different optimizer setup; resume with the optim.name "
        "it was trained with"
    )
    if "optimizer" not in state:
        raise mismatch
    checked = verify.safe_optimizer_state(state["optimizer"], model, optimizers, where)
    options = StateDictOptions(full_state_dict=True)
    try:
        set_optimizer_state_dict(model, optimizers, checked, options=options)
    except (KeyError, ValueError, RuntimeError):
        raise mismatch from None


def rng_state() -> dict[str, Any]:
    """Every random generator training touches, as tensors and plain numbers (weights_only-loadable). On CUDA,
    the generator of this process's device only: every rank seeds its device alike and draws alike, and a
    run resumed where fewer GPUs are visible has no generators for the others."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return state


def set_rng_state(state: dict[str, Any], where: Path | str = "state.pt") -> None:
    verify.check_rng_state(state, where)
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # on the current device
