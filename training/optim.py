"""Optimizers and the learning-rate schedule.

AdamW (weight decay on 2-D weights only; fused where torch has it, else foreach), or Muon for the
blocks' hidden matrices (training/muon.py) with AdamW for the rest. The schedule: a linear warmup
to optim.lr, then cosine, warmup-stable-decay or constant over the run's progress: the larger of
iter / max_iters and elapsed / max_time, so a run with a time budget still ends decayed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from runs.config import OptimConfig, TrainConfig

if TYPE_CHECKING:
    from runs.checkpoint import Progress


def _adamw(groups: list[dict], cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    impl = cfg.impl
    if impl == "auto":
        impl = "fused" if device.type in ("cpu", "cuda", "mps") else "foreach"
    kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kwargs)


def make_optimizers(
    model: torch.nn.Module, cfg: OptimConfig, device: torch.device
) -> list[torch.optim.Optimizer]:
    """The optimisers for model's parameters (one, or Muon + AdamW); each group remembers its base
    lr."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    muon_names: set[str] = set()
    if cfg.name == "muon":
        muon_names = {n for n, p in params.items() if p.dim() == 2 and n.startswith("blocks.")}
    decay = [p for n, p in params.items() if p.dim() >= 2 and n not in muon_names]
    no_decay = [p for n, p in params.items() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    optimizers: list[torch.optim.Optimizer] = [
        _adamw([g for g in groups if g["params"]], cfg, device)
    ]
    if muon_names:
        from training.muon import Muon  # Muon runs only

        muon = Muon(
            [params[n] for n in sorted(muon_names)],
            lr=cfg.muon_lr,
            momentum=cfg.muon_momentum,
            weight_decay=cfg.muon_weight_decay,
        )
        optimizers.append(muon)
    for opt in optimizers:
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers


def schedule_progress(p: Progress, elapsed: float, train: TrainConfig) -> float:
    """How much of the run is done at iteration p.iter, in [0, 1]: the larger of the iteration and
    the time budget's share, counted from where a run resumed with another budget took the schedule
    up (p.schedule_*, training/resume.py's `schedule_note`): what was left of it spreads over what
    is left of the budget."""
    # 0s: the plain schedule
    it0 = p.schedule_iter
    elapsed0 = p.schedule_elapsed
    done = p.schedule_done
    by_time = (elapsed - elapsed0) / max(train.max_time - elapsed0, 1e-9) if train.max_time else 0.0
    return min(
        1.0, done + (1.0 - done) * max((p.iter - it0) / max(train.max_iters - it0, 1), by_time)
    )


def lr_factor(it: int, progress: float, cfg: OptimConfig) -> float:
    """Multiplier on each group's base lr at iteration `it` with `progress` in [0, 1] of the run
    done: a linear warmup to 1 (optim.lr, the peak) over optim.warmup_iters, then the schedule's
    decay over the rest of the run, from 1 at the warmup's end to optim.min_lr_ratio at the run's
    end."""
    w = cfg.warmup_iters
    # a time budget spent within the warmup ends at the schedule's end, too
    if it < w and progress < 1.0:
        return (it + 1) / w
    p = min(max(progress, 0.0), 1.0)
    # the decay counts from the warmup's end: the share of the run the warmup took is progress * w /
    # it, exactly w / max_iters by iterations, and by time (train.max_time) as the run's pace says;
    # it needs no state, so a resumed run follows the same schedule
    warm = p * w / it if it > 0 else 0.0
    p = (p - warm) / (1.0 - warm) if warm < 1.0 else 1.0
    floor = cfg.min_lr_ratio
    if cfg.schedule == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p))
    if cfg.schedule == "wsd":
        start = 1.0 - cfg.decay_frac
        return 1.0 if p <= start else 1.0 - (1.0 - floor) * (p - start) / cfg.decay_frac
    return 1.0


def schedule_warning(cfg: OptimConfig, train: TrainConfig) -> str | None:
    """What is wrong with a schedule that never reaches optim.lr (a warmup as long as the run), or
    None."""
    if train.max_iters == 0 or cfg.warmup_iters < train.max_iters:  # 0: an eval alone, no step
        return None
    w = cfg.warmup_iters
    n = train.max_iters
    fix = max(1, train.max_iters // 10)
    return (
        f"optim.warmup_iters={w} is not below train.max_iters={n}: the learning rate warms up all "
        f"run and never decays (it reaches optim.lr={cfg.lr:g} at iteration {w}); set "
        f"optim.warmup_iters={fix}"
    )


def set_lr(optimizers: list[torch.optim.Optimizer], factor: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * factor


def step_unless(opt: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """opt.step(), or nothing at all (parameters, moments and step counts unchanged) where the 0-d
    tensor `skip` is true, without reading it back where the optimizer can take it as
    `found_inf`."""
    if getattr(opt, "_step_supports_amp_scaling", False):  # fused AdamW (torch), Muon (ours)
        # gradients already unscaled
        opt.grad_scale = None
        opt.found_inf = skip.float()
        try:
            opt.step()
        finally:
            del opt.grad_scale, opt.found_inf
    elif not skip.item():
        opt.step()
