"""A crafted or damaged state.pt refused, entry by entry, before any of it reaches a run.

torch.load(weights_only=True) refuses code, not numbers that do harm: an AdamW moment shorter than
its parameter makes the fused kernel write past its end. So state.pt's parts, progress numbers,
random generator states and GradScaler state are checked when it is read (`check_state`,
`progress_fields`), and every optimizer tensor against the live optimizers when it is restored
(`safe_optimizer_state`). A failure is one UserError naming the file and the entry.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError

PARTS = ("iter", "rng", "optimizer")  # what resuming cannot do without


def check_state(state: Any, path: Path) -> None:
    """state.pt as torch.load read it: its parts, random generators and GradScaler state (the
    optimizer state waits for the live optimizers: `safe_optimizer_state`)."""
    missing = [k for k in PARTS if not isinstance(state, dict) or k not in state]
    if missing:
        what = (
            f"has no {missing[0]}" if isinstance(state, dict) else f"holds a {type(state).__name__}"
        )
        raise UserError(
            f"{path} is damaged: it {what} (not state.pt as train.py writes it); use another "
            "checkpoint"
        )
    check_rng_state(state["rng"], path)
    if state.get("scaler"):
        check_scaler_state(state["scaler"], path)


def progress_fields(state: dict, kinds: dict[str, type], where: Path | str) -> dict:
    """The progress numbers state.pt records (`kinds`: each field's type), each of its field's type
    and not nan."""
    out = {}
    for name, kind in kinds.items():
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
    return out


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
    """A param group to load: the live group (this run's config), for a saved one of the same
    parameters."""
    if not isinstance(saved, dict) or saved.get("params") != names:
        raise bad("its param_groups do not list this model's parameters")
    return {**{k: v for k, v in live.items() if k != "params"}, "params": names}


def safe_optimizer_state(
    saved: Any, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], where: Path | str
) -> dict:
    """state.pt's optimizer state, checked entry by entry against the live optimizers (module
    docstring), as torch.distributed.checkpoint's set_optimizer_state_dict takes it (parameter names
    as keys)."""

    def bad(what: str) -> UserError:
        return UserError(
            f"{where} holds optimizer state that does not fit this model ({what}); resume with the "
            "config it was trained with, or use another checkpoint"
        )

    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        raise bad("it is not a mapping with a state")
    name_of = {id(p): n for n, p in model.named_parameters()}
    expected = {}
    groups = []
    for opt in optimizers:
        for live in opt.param_groups:
            names = [name_of[id(p)] for p in live["params"]]
            expected.update({name_of[id(p)]: _per_parameter(opt, live, p) for p in live["params"]})
            groups.append((live, names))
    param_groups = saved.get("param_groups")
    if not isinstance(param_groups, list) or len(param_groups) != len(groups):
        raise bad(f"{len(groups)} param_groups expected")
    out = {
        "state": {},
        "param_groups": [_group(s, g, n, bad) for s, (g, n) in zip(param_groups, groups)],
    }
    for name, entry in saved["state"].items():
        if name not in expected:
            raise bad(f"state for {name!r}, which the model does not have")
        if not isinstance(entry, dict) or set(entry) != set(expected[name]):
            raise bad(
                f"the state of {name} holds {sorted(entry) if isinstance(entry, dict) else entry!r}"
            )
        for key, (shape, dtype) in expected[name].items():
            problem = _tensor_problem(entry[key], shape, dtype)
            if problem:
                raise bad(f"the {key} of {name} {problem}")
        out["state"][name] = entry
    return out


def check_rng_state(state: Any, where: Path | str) -> None:
    """The random generators' state as `rng_state` writes it."""

    def bad(what: str) -> UserError:
        return UserError(
            f"{where} is damaged: its random generator state {what}; use another checkpoint"
        )

    if not isinstance(state, dict) or not {"torch", "numpy", "python"} <= set(state):
        raise bad("is not a mapping of torch, numpy and python")
    byte_state = (tuple(torch.get_rng_state().shape), torch.uint8)
    problem = _tensor_problem(state["torch"], *byte_state)
    if problem:
        raise bad(f"for torch {problem}")
    if "cuda" in state and torch.cuda.is_available():
        problem = _tensor_problem(
            state["cuda"], tuple(torch.cuda.get_rng_state().shape), torch.uint8
        )
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
    if (
        not isinstance(state, dict)
        or set(state) != set(keys)
        or not all(_is_number(state[k]) for k in keys)
    ):
        raise UserError(f"{where} is damaged: its GradScaler state is not {', '.join(keys)}")
    if state["scale"] <= 0 or not isinstance(state["growth_interval"], int):
        raise UserError(f"{where} is damaged: its GradScaler state has scale {state['scale']}")
