"""Resuming with changed values: one rule, applied by training/plan.py and training/run.py.

A resumed run starts from its checkpoint's config, with what the command line's overrides set
(`resume_config`). It may change any value (the budget, evals, logging, the learning rate and its
schedule, ...) but those KEPT_ON_RESUME lists: the weights, adapters and state.pt have their
shape, so changes there are refused, all in one line naming where they can go instead
(`resume_changes`).
What changes is applied (the optimizers' numbers are the config's; state.pt restores moments and
step counts) and named in the resume line (`resumed`); another budget continues the schedule from
where it was. Only resumed runs import this module.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import UserError
from runs.checkpoint import STATE, Checkpoint, Progress, TrainState
from runs.config import Config, Request, with_overrides
from training.optim import lr_factor, schedule_progress

FROM_WEIGHTS = "start a new run from its weights: train.init_from={ckpt} train.out_dir=NEW {ours}"

# What a resumed run must keep, as (what it is, where a change can go instead): every other value
# may change on resume (applied, and named in the resume line); dropout may change here too.
KEPT_ON_RESUME = {
    "model.": ("model's shape (its weights have it)", "train a new model in another train.out_dir"),
    "lora.": ("adapters' shape", "train new adapters in another train.out_dir"),
    "optim.name": ("optimizer (state.pt holds its state)", FROM_WEIGHTS),
}
# how this command finds the run
NOT_COMPARED = ("train.resume", "train.overwrite", "train.out_dir")


def resume_config(request: Request, ckpt: Checkpoint) -> Config:
    """The config a resumed run starts from: its checkpoint's, with the command line's overrides
    set (`resume_changes` then refuses those it must keep). A config file named beside
    train.resume=true finds the run (its train.out_dir); its other values are the checkpoint's, so
    nothing a run was started with needs typing again. How this command finds the run
    (NOT_COMPARED) is its own; train.init_from stays where the weights came from at iteration 0,
    which only a fresh run reads (one given again may have moved since, or be spelled otherwise)."""
    theirs = ckpt.config()
    cfg = with_overrides(theirs, request.overrides, f"checkpoint {ckpt}")
    t = request.cfg.train
    train = dataclasses.replace(
        cfg.train,
        resume=t.resume,
        overwrite=t.overwrite,
        out_dir=t.out_dir,
        init_from=theirs.train.init_from,
    )
    return dataclasses.replace(cfg, train=train)


def _values(cfg: Config) -> dict[str, Any]:
    """Every value of cfg by dotted key (a lora section that is not there: lora = None)."""
    out: dict[str, Any] = {}
    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        if value is None:
            out[section.name] = None
            continue
        out |= {f"{section.name}.{k}": v for k, v in dataclasses.asdict(value).items()}
    return out


def shown(value: Any) -> str:
    """A config value as a command line gives it."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return f"[{','.join(map(str, value))}]" if isinstance(value, (list, tuple)) else str(value)


def resume_changes(ckpt: Checkpoint, cfg: Config) -> list[tuple[str, Any, Any]]:
    """(key, the checkpoint's value, the config's) for each value a resumed run changes; one line
    refusing one it must keep (KEPT_ON_RESUME), naming where the change can go instead."""
    theirs = _values(ckpt.config())
    ours = _values(cfg)
    if (theirs.get("lora", 0) is None) != (ours.get("lora", 0) is None):
        said = "has no lora section" if "lora" in theirs else "has a lora section"
        raise UserError(
            f"checkpoint {ckpt} {said} but the config "
            f"{'does' if 'lora' in theirs else 'does not'}; resume with the config it was trained "
            "with, or start a new run in another train.out_dir"
        )
    changed = []
    kept = []  # values a resume must keep that the command line changes
    for key in [*ours, *(k for k in theirs if k not in ours)]:
        old, new = theirs.get(key), ours.get(key)
        if old == new or key in NOT_COMPARED:
            continue
        why = next((v for k, v in KEPT_ON_RESUME.items() if key.startswith(k)), None)
        if why is not None and not key.endswith(".dropout"):
            kept.append((key, old, new, why))
        changed.append((key, old, new))
    if kept:
        raise _kept_changed(ckpt, kept)
    return changed


def _kept_changed(ckpt: Checkpoint, kept: list[tuple[str, Any, Any, tuple[str, str]]]) -> UserError:
    """One line naming every value the command line changes that a resumed run must keep (the
    config is the checkpoint's, `resume_config`), and where the changes can go instead."""
    has = ", ".join(f"{key}={shown(old)}" for key, old, _, _ in kept)
    says = ", ".join(shown(new) for _, _, new, _ in kept)
    whats = " and ".join(dict.fromkeys(what for *_, (what, _) in kept))
    ours = " ".join(f"{key}={shown(new)}" for key, _, new, _ in kept)
    by_way: dict[str, list[str]] = {}  # each way with the changes it takes
    for key, _, new, (_, way) in kept:
        by_way.setdefault(way, []).append(f"{key}={shown(new)}")
    ways = [way.format(ckpt=ckpt, ours=" ".join(given)) for way, given in by_way.items()]
    return UserError(
        f"checkpoint {ckpt} has {has} but the command line asks for {says}; a resumed run keeps "
        f"its {whats}: resume without {ours}, or " + "; or ".join(ways)
    )


def resumed(plan, model, optimizers, scaler) -> tuple[Progress, str]:
    """The progress a resumed run (`plan`: training/plan.py's Plan, which imports this module) goes
    on from, its state.pt put back into `model`, `optimizers` and `scaler` (`restore`), and its
    changes in words for the resume line (`schedule_note`)."""
    state = plan.resume.train_state()
    progress = restore(state, model, optimizers, scaler, plan.resume.folder / STATE)
    return schedule_note(plan, progress)


def schedule_note(plan, progress: Progress) -> tuple[Progress, str]:
    """`resumed`'s progress and line. With another budget (train.max_iters, train.max_time) the
    schedule goes on from the point it had reached: what was left of it is spread over what is left
    of the budget (no jump in the learning rate). A budget already spent is refused."""
    before = plan.resume.config()
    cfg = plan.cfg
    p = progress
    t = cfg.train
    was = before.train
    if p.iter > t.max_iters:
        raise UserError(
            f"checkpoint {plan.resume} is at iteration {p.iter:,}, past "
            f"train.max_iters={t.max_iters}: nothing to train; raise train.max_iters above "
            f"{p.iter} to train on"
        )
    if t.max_time and t.max_time != was.max_time and p.elapsed_s >= t.max_time:
        raise UserError(
            f"checkpoint {plan.resume} has trained {p.elapsed_s:.1f}s, past "
            f"train.max_time={t.max_time:g}: nothing to train; raise train.max_time above "
            f"{p.elapsed_s:.1f} to train on"
        )
    if not plan.changed:
        return p, ""
    lr_was = _lr_at(before, p)
    budget = (was.max_iters, was.max_time) != (t.max_iters, t.max_time)
    if budget:
        done = schedule_progress(p, p.elapsed_s, was)
        p = dataclasses.replace(
            p, schedule_iter=p.iter, schedule_elapsed=p.elapsed_s, schedule_done=done
        )
    lr_now = _lr_at(cfg, p)
    names = ", ".join(f"{key} {shown(old)} -> {shown(new)}" for key, old, new in plan.changed)
    # the same as shown: no jump to name
    was_shown = f"{lr_was:.3g}"
    now_shown = f"{lr_now:.3g}"
    lr = (
        f"learning rate {now_shown}"
        if was_shown == now_shown
        else f"learning rate {was_shown} -> {now_shown}"
    )
    if budget:
        lr += f"; the schedule goes on from {p.schedule_done:.0%} done to its end at the new budget"
    return p, f"; changed: {names} ({lr})"


def _lr_at(cfg: Config, p: Progress) -> float:
    """The learning rate (AdamW's, as logged) that cfg's schedule sets at p's iteration."""
    done = schedule_progress(p, p.elapsed_s, cfg.train)
    return cfg.optim.lr * lr_factor(p.iter, done, cfg.optim)


def restore(state: TrainState, model, optimizers, scaler, where: Path) -> Progress:
    """Put a checkpoint's optimizer state (sharded again under FSDP, for any number of ranks), its
    GradScaler's and its random generators' back into a run; its progress. `where`: its state.pt,
    for messages."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    from runs.state_checks import safe_optimizer_state

    checked = safe_optimizer_state(state.optimizer, model, optimizers, where)
    try:
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizers, checked, options=options)
    except (KeyError, ValueError, RuntimeError):
        raise UserError(
            f"checkpoint {where.parent} holds state for a different optimizer setup; resume with "
            "the optim.name it was trained with"
        ) from None
    if state.scaler and scaler.is_enabled():
        scaler.load_state_dict(state.scaler)
    set_rng_state(state.rng, where)
    return dataclasses.replace(state.progress)


def set_rng_state(state: dict[str, Any], where: Path | str = STATE) -> None:
    """Put the random generators back as the checkpoint's `rng_state` recorded them (checked)."""
    from runs.state_checks import check_rng_state

    check_rng_state(state, where)
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # on the current device
