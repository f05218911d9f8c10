"""state.pt: what a run needs to continue besides its weights; one type builds, checks and restores it.

On disk one dict: the `Progress` fields, `tokens` (for people), `rng`, `scaler` and `optimizer` (torch's
optimizer state dict keyed by parameter name, whole); tests/fixtures/format_v1 holds one from before this
module. `load` reads it with torch.load(weights_only=True) and checks what needs no live object; `restore`
checks each optimizer tensor against its parameter before putting it back: a tensor of the wrong shape does
worse than fail (a short AdamW moment makes the fused kernel write past its end). The moments and step counts
are restored; the param_groups are the live optimizer's, numbers (lr, betas, eps, weight decay, momentum)
and flags: built from this run's config, which may change them on resume. A failure is one line naming the
file and the entry.
"""

from __future__ import annotations

import dataclasses
import math
import random
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import UserError, first_line

STATE = "state.pt"
PARTS = ("iter", "rng", "optimizer")  # what resuming cannot do without


@dataclass
class Progress:
    """How far a run has come: what a checkpoint's state.pt records besides optimizer and RNG state."""

    iter: int = 0
    best_val_loss: float = math.inf
    elapsed_s: float = 0.0  # training seconds (evals and checkpoints excluded)
    skipped_steps: int = 0  # steps skipped for a non-finite loss (train.skip_nonfinite)
    evaluated_at: int = -1  # the iteration of the last eval, so a resumed run does not repeat it
    wandb_id: str | None = None
    threads: int = 0  # the CPU thread count the steps ran at (common/threads.py): a resumed run goes on there
    # where a run resumed with another budget took its schedule up (training/resume.py's `schedule_note`): the
    # iteration, the training seconds and the share of the schedule done there (0, 0, 0: from the start)
    schedule_iter: int = 0
    schedule_elapsed: float = 0.0
    schedule_done: float = 0.0

    @classmethod
    def from_state(cls, state: dict, where: Path | str = STATE) -> Progress:
        """The progress a checkpoint's state.pt records, each number of its field's type (not nan)."""
        out = {}
        for name, kind in typing.get_type_hints(cls).items():
            if name not in state:
                continue
            value = state[name]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is int:
                fits = number and isinstance(value, int) and value >= -1
            elif kind is float:
                fits = number and not math.isnan(value)
            else:  # wandb_id
                fits = value is None or isinstance(value, str)
            if not fits:
                raise UserError(f"{where} is damaged: its {name} is {value!r}; use another checkpoint")
            out[name] = float(value) if kind is float else value
        return cls(**out)


@dataclass
class TrainState:
    """A run's state.pt (see the module docstring)."""

    progress: Progress
    rng: dict[str, Any]  # `rng_state`
    optimizer: dict  # the optimizers' state keyed by parameter name, whole
    scaler: dict | None = None  # GradScaler's (fp16 runs)
    tokens: int = 0  # iterations x tokens per iteration: for people reading the file

    @classmethod
    def capture(
        cls,
        progress: Progress,
        tokens_per_iter: int,
        model: torch.nn.Module,
        optimizers: list[torch.optim.Optimizer],
        scaler: torch.amp.GradScaler,
    ) -> TrainState:
        """The state of a run now (a copy of its progress). Every rank calls it (training/run.py's
        `save_checkpoint` says in which order under FSDP)."""
        return cls(
            dataclasses.replace(progress),
            rng_state(),
            optimizer_state(model, optimizers),
            scaler.state_dict() if scaler.is_enabled() else None,
            progress.iter * tokens_per_iter,
        )

    def to_dict(self) -> dict[str, Any]:
        """What state.pt holds."""
        return {
            **dataclasses.asdict(self.progress),
            "tokens": self.tokens,
            "rng": self.rng,
            "scaler": self.scaler,
            "optimizer": self.optimizer,
        }

    def save(self, path: Path) -> None:
        """torch.save(self.to_dict(), path), failing with the OSError of the write that failed."""
        with open(path, "wb") as f:
            recorded = _Recorded(f)
            try:
                torch.save(self.to_dict(), recorded)
            except RuntimeError:
                if recorded.error is None:
                    raise
                raise recorded.error from None

    @classmethod
    def load(cls, path: Path) -> TrainState:
        """state.pt read (never unpickling code) and checked, but for the optimizer state, which only the
        live optimizers can check (`restore`)."""
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # UnpicklingError for code, anything for a damaged file
            raise UserError(
                f"{path} is damaged or holds something other than tensors and numbers (refused to load it: "
                f"{first_line(e)})"
            ) from None
        missing = [k for k in PARTS if not isinstance(state, dict) or k not in state]
        if missing:
            what = f"has no {missing[0]}" if isinstance(state, dict) else f"holds a {type(state).__name__}"
            raise UserError(
                f"{path} is damaged: it {what} (not state.pt as train.py writes it); use another checkpoint"
            )
        check_rng_state(state["rng"], path)
        if state.get("scaler"):
            check_scaler_state(state["scaler"], path)
        progress = Progress.from_state(state, path)
        return cls(progress, state["rng"], state["optimizer"], state.get("scaler"), state.get("tokens", 0))

    def restore(
        self,
        model: torch.nn.Module,
        optimizers: list[torch.optim.Optimizer],
        scaler: torch.amp.GradScaler,
        where: Path,
    ) -> Progress:
        """Put the optimizer state (sharded again under FSDP, for any number of ranks), the GradScaler's and
        the random generators' back into a run; its progress. `where`: this state.pt, for messages."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        mismatch = UserError(
            f"checkpoint {where.parent} holds state for a different optimizer setup; resume with the "
            "optim.name it was trained with"
        )
        checked = safe_optimizer_state(self.optimizer, model, optimizers, where)
        try:
            set_optimizer_state_dict(
                model, optimizers, checked, options=StateDictOptions(full_state_dict=True)
            )
        except (KeyError, ValueError, RuntimeError):
            raise mismatch from None
        if self.scaler and scaler.is_enabled():
            scaler.load_state_dict(self.scaler)
        set_rng_state(self.rng, where)
        return dataclasses.replace(self.progress)


def optimizer_state(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict:
    """The optimizers' state keyed by parameter name, whole (FSDP: gathered; every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizers, options=whole_state_options())


def whole_state_options():
    """torch.distributed.checkpoint's options for full (unsharded) state dicts, weights' or optimizers':
    under torchrun gathered to rank 0's CPU."""
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


# --- the random generators ---


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


def set_rng_state(state: dict[str, Any], where: Path | str = STATE) -> None:
    check_rng_state(state, where)
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # on the current device


# --- checks ---


def _tensor_problem(value: Any, shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
    if not isinstance(value, torch.Tensor):
        return f"is a {type(value).__name__}, not a tensor"
    if value.layout != torch.strided or value.is_quantized or value.device.type != "cpu":
        return "is not a plain tensor"
    if tuple(value.shape) != shape or value.dtype != dtype:
        return f"is {list(value.shape)} {value.dtype}, not {list(shape)} {dtype}"
    if not value.is_contiguous():
        return "is not contiguous"
    return None


def _per_parameter(opt: torch.optim.Optimizer, group: dict, p: torch.Tensor) -> dict:
    """What `opt` keeps for parameter p: key -> (shape, dtype)."""
    like = (tuple(p.shape), p.dtype)
    if isinstance(opt, torch.optim.AdamW):
        keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group.get("amsgrad") else [])
        return {"step": ((), torch.float32), **dict.fromkeys(keys, like)}
    return {"momentum_buffer": like}  # training/muon.py's Muon


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _group(saved: Any, live: dict, names: list[str], bad) -> dict:
    """A param group to load: the live group (this run's config), for a saved one of the same parameters."""
    if not isinstance(saved, dict) or saved.get("params") != names:
        raise bad("its param_groups do not list this model's parameters")
    return {**{k: v for k, v in live.items() if k != "params"}, "params": names}


def safe_optimizer_state(
    saved: Any, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], where: Path | str
) -> dict:
    """state.pt's optimizer state, checked entry by entry against the live optimizers (module docstring),
    as torch.distributed.checkpoint's set_optimizer_state_dict takes it (parameter names as keys)."""

    def bad(what: str) -> UserError:
        return UserError(
            f"{where} holds optimizer state that does not fit this model ({what}); resume with the config "
            "it was trained with, or use another checkpoint"
        )

    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        raise bad("it is not a mapping with a state")
    name_of = {id(p): n for n, p in model.named_parameters()}
    expected, groups = {}, []
    for opt in optimizers:
        for live in opt.param_groups:
            names = [name_of[id(p)] for p in live["params"]]
            expected.update({name_of[id(p)]: _per_parameter(opt, live, p) for p in live["params"]})
            groups.append((live, names))
    param_groups = saved.get("param_groups")
    if not isinstance(param_groups, list) or len(param_groups) != len(groups):
        raise bad(f"{len(groups)} param_groups expected")
    out = {"state": {}, "param_groups": [_group(s, g, n, bad) for s, (g, n) in zip(param_groups, groups)]}
    for name, entry in saved["state"].items():
        if name not in expected:
            raise bad(f"state for {name!r}, which the model does not have")
        if not isinstance(entry, dict) or set(entry) != set(expected[name]):
            raise bad(f"the state of {name} holds {sorted(entry) if isinstance(entry, dict) else entry!r}")
        for key, (shape, dtype) in expected[name].items():
            problem = _tensor_problem(entry[key], shape, dtype)
            if problem:
                raise bad(f"the {key} of {name} {problem}")
        out["state"][name] = entry
    return out


def check_rng_state(state: Any, where: Path | str) -> None:
    """The random generators' state as `rng_state` writes it."""

    def bad(what: str) -> UserError:
        return UserError(f"{where} is damaged: its random generator state {what}; use another checkpoint")

    if not isinstance(state, dict) or not {"torch", "numpy", "python"} <= set(state):
        raise bad("is not a mapping of torch, numpy and python")
    byte_state = (tuple(torch.get_rng_state().shape), torch.uint8)
    problem = _tensor_problem(state["torch"], *byte_state)
    if problem:
        raise bad(f"for torch {problem}")
    if "cuda" in state and torch.cuda.is_available():
        problem = _tensor_problem(state["cuda"], tuple(torch.cuda.get_rng_state().shape), torch.uint8)
        if problem:
            raise bad(f"for CUDA {problem}")
    numpy_state = state["numpy"]
    if not (isinstance(numpy_state, (tuple, list)) and len(numpy_state) == 5):
        raise bad("for numpy is not the 5 values of numpy.random.get_state")
    kind, keys, pos, has_gauss, gauss = numpy_state
    problem = _tensor_problem(keys, (624,), torch.int64)
    if kind != "MT19937" or problem or not (keys.min() >= 0 and keys.max() < 2**32):
        raise bad(f"for numpy {problem or 'is not MT19937 state'}")
    if not (isinstance(pos, int) and 0 <= pos <= 624 and has_gauss in (0, 1) and _is_number(gauss)):
        raise bad("for numpy has a position or gauss out of range")
    try:
        random.Random().setstate(_python_state(state["python"]))
    except (TypeError, ValueError, OverflowError) as e:
        raise bad(f"for python is refused ({e})") from None


def _python_state(state: Any) -> tuple:
    version, internal, gauss_next = state  # a TypeError or ValueError when it is not three values
    return (version, tuple(internal), gauss_next)


def check_scaler_state(state: Any, where: Path | str) -> None:
    """A GradScaler's state (fp16 runs): its five numbers, finite, the scale positive."""
    keys = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
    if not isinstance(state, dict) or set(state) != set(keys) or not all(_is_number(state[k]) for k in keys):
        raise UserError(f"{where} is damaged: its GradScaler state is not {', '.join(keys)}")
    if state["scale"] <= 0 or not isinstance(state["growth_interval"], int):
        raise UserError(f"{where} is damaged: its GradScaler state has scale {state['scale']}")
