"""An out_dir guarded before training: writable, written by one train.py at a time, with room for
the checkpoints, and a run it holds (checkpoints, or metrics.jsonl alone: train.save=false) never
overwritten by accident (train.resume continues it, train.overwrite deletes it). train.py holds
OUT_DIR/.lock for its whole run (common/locks.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from common import locks
from common.errors import UserError
from common.files import check_not_links, size_text
from runs.checkpoint import KEPT, OUT_DIR_ADVICE, is_checkpoint
from runs.config import Config

LOCK = ".lock"  # in an out_dir: held by the train.py that writes into it
# a run's records (training/tracking.py): a run, even one without checkpoints
METRICS = "metrics.jsonl"
# what train.overwrite deletes beside the checkpoints
RECORDS = (METRICS, "loss.png", "heads_training.png")


def holds_run(out_dir: Path) -> bool:
    """Whether out_dir holds a run's checkpoint (last/, best/, or last/ while it was being
    replaced)."""
    return any(is_checkpoint(out_dir / n) for n in ("last", "best", ".last.old"))


def held(out_dir: Path) -> str | None:
    """The run out_dir holds, which train.overwrite would delete, in words; None: none."""
    if holds_run(out_dir):
        return "a checkpoint"
    metrics = out_dir / METRICS
    if metrics.is_file() and metrics.stat().st_size > 0:  # a run's, with train.save=false too
        return f"a run's {METRICS} (a run without checkpoints)"
    return None


def held_advice(what: str) -> str:
    """What to do about the run `held` found."""
    resume = "continue it with train.resume=true, " if what == "a checkpoint" else ""
    return (
        f"{resume}start over with train.overwrite=true (deletes it), or pick another train.out_dir"
    )


def check_out_dir(out_dir: Path, cfg: Config, n_params: int) -> None:
    """Fail before training on an out_dir that cannot hold the checkpoints, whose run would be lost,
    or that another run writes into; with train.overwrite, delete the run it holds. Holds
    OUT_DIR/.lock from here to the end of the process (the caller's run)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise UserError(
            f"train.out_dir {out_dir} is not writable ({e.strerror or e}); choose another "
            "train.out_dir or fix its permissions"
        ) from None
    locks.hold(
        out_dir / LOCK,
        f"train.out_dir {out_dir}",
        exclusive=True,
        advice="another train.py writes into it: wait for it to end (or stop it), or choose "
        "another train.out_dir",
    )
    check_not_links(out_dir, ("last", "best"), OUT_DIR_ADVICE)
    what = held(out_dir)
    if what and not cfg.train.resume:
        if not cfg.train.overwrite:
            raise UserError(f"{out_dir} already holds {what}; {held_advice(what)}")
        kept = [p.name for p in out_dir.glob(f"{KEPT}*") if is_checkpoint(p)]
        for name in ("last", "best", ".last.old", ".best.old", *kept):
            shutil.rmtree(out_dir / name, ignore_errors=True)
        for name in RECORDS:
            (out_dir / name).unlink(missing_ok=True)
    check_room(out_dir, cfg, n_params)


def check_room(out_dir: Path, cfg: Config, n_params: int) -> None:
    """Refuse an out_dir (that exists) without room for the checkpoints of `n_params` trained
    parameters; the dry run calls it too."""
    need = n_params * 4 * 4 * 2  # weights + AdamW moments, fp32, in last/ and best/ while swapping
    # a kept checkpoint shares last/'s files until last/ is replaced: then it holds its own
    need += n_params * 4 * 3 * len(cfg.train.keep_iters)
    free = shutil.disk_usage(out_dir).free
    if cfg.train.save and free < need:
        raise UserError(
            f"{out_dir} has {size_text(free)} free; checkpoints need about {size_text(need)}. Free "
            "some space or choose another train.out_dir"
        )
