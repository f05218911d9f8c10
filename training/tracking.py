"""What a run shows and records (rank 0 only): the progress bar, OUT_DIR/metrics.jsonl, loss.png and wandb.

- Without a terminal (a batch job, a pipe) the bar gives way to one line per log step.
- metrics.jsonl: one JSON line per eval (iter, train_loss, val_loss, lr, tokens, elapsed_s: training seconds,
  evals excluded), for plot.py and scripts. loss.png is redrawn at evals within 1% of the run's wall time.
- wandb is imported only when enabled, follows WANDB_MODE, and a resumed run continues the same wandb run.
- Losses, gradient norms and finite flags stay on the device, read back every log.interval iterations (and
  before evals and stops), so the GPU never waits for the host in between.
- metrics.jsonl stays valid JSON: a loss that is not finite is written as null. A resumed run repairs it
  first: a last line torn by a crash is dropped, and so are the rows past the checkpoint it resumes from (a
  kill after an eval's row, before its checkpoint). A row that cannot be appended (a full disk) is one
  line, the file cut back to what it was; a picture that cannot be drawn is a warning, and training goes on.
"""

from __future__ import annotations

import configparser
import importlib.util
import netrc
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from tqdm import tqdm

from common import json_text
from common.errors import UserError
from common.files import append_line, atomic_write
from common.json_text import metrics_rows, read_metrics  # plot.py reads them without training/
from runs.config import to_dict
from runs.out_dir import METRICS
from training import distributed
from training.trainer import Run

PLOT_SHARE = 0.01  # the most of a run's wall time that redrawing loss.png may take


class Tracker:
    def __init__(self, run: Run):
        self.run, self.main = run, run.rt.is_main
        self.metrics_path = run.out_dir / METRICS
        self.wandb = None
        self.last_record: dict[str, Any] = {}
        self.samples: list[list] = []  # [iteration, text] of each sample, for a wandb table
        self.started, self.plot_seconds, self.plot_cost = time.perf_counter(), 0.0, 0.0
        self.loss_sum = torch.zeros((), device=run.rt.device)
        self.steps: list[tuple[int, torch.Tensor]] = []  # (iteration, [loss, gradient norm, finite]) not read
        self.last_log = (run.progress.iter, run.progress.elapsed_s)  # (iteration, training seconds)
        self.first = self.last_log  # where this process started (a resumed run: where it resumed)
        self.bar = tqdm(
            total=run.cfg.train.max_iters,
            initial=run.progress.iter,
            disable=None if self.main else True,
            dynamic_ncols=True,
            unit="it",
        )
        self.plot_failed = False
        if not self.main:
            return
        if not run.cfg.train.resume:
            self.metrics_path.unlink(missing_ok=True)
        elif self.metrics_path.is_file() and (
            repaired := repair_metrics(self.metrics_path, run.progress.iter)
        ):
            self.write(repaired, sys.stderr)
        log = run.cfg.log
        if log.wandb:
            import wandb

            wandb_id = run.progress.wandb_id
            self.wandb = wandb.init(
                project=log.wandb_project,
                name=log.wandb_run_name,
                config=to_dict(run.cfg),
                dir=str(run.out_dir),
                id=wandb_id,
                resume="allow" if wandb_id else None,
            )
            run.progress.wandb_id = self.wandb.id

    def wall(self) -> float:
        """Seconds since the run started training (this process)."""
        return time.perf_counter() - self.started

    def write(self, line: str, file=None) -> None:
        if self.main:
            self.bar.write(line, file=file)

    def step(
        self, it: int, loss: torch.Tensor, grad_norm: torch.Tensor, finite: torch.Tensor, elapsed: float
    ) -> None:
        """After iteration it - 1 (`it` done): keep its results; every log.interval iterations (and at
        max_iters) show and log the mean loss."""
        self.loss_sum += loss
        self.steps.append((it - 1, torch.stack([loss.float(), grad_norm.float(), finite.float()])))
        self.bar.update(1)
        if it % self.run.cfg.log.interval and it != self.run.cfg.train.max_iters:
            return
        last_it, last_elapsed = self.last_log
        world = self.run.rt.world_size
        mean_loss = distributed.all_sum(self.loss_sum, self.run.rt).item() / (world * (it - last_it))
        lr = self.run.optimizers[0].param_groups[0]["lr"]
        tok_s = self.run.cfg.tokens_per_iter * (it - last_it) / max(elapsed - last_elapsed, 1e-9)
        self.bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}", refresh=False)
        if self.bar.disable:  # no terminal (a batch job's log, a pipe): one line per log step instead
            total = self.run.cfg.train.max_iters
            self.write(f"iteration {it}/{total}: loss {mean_loss:.4f}, lr {lr:.2e}, {tok_s:,.0f} tokens/s")
        tokens = it * self.run.cfg.tokens_per_iter
        self.log(it, {"train/loss": mean_loss, "lr": lr, "tokens_per_s": tok_s, "tokens": tokens})
        self.loss_sum.zero_()
        self.last_log = (it, elapsed)

    def nonfinite_steps(self) -> list[tuple[int, float, float]]:
        """(iteration, loss, gradient norm) of each step since the last call whose loss or gradient was not
        finite (the same on every rank); one read-back."""
        if not self.steps:
            return []
        its, values = zip(*self.steps)
        self.steps = []
        rows = torch.stack(values).tolist()
        return [(it, loss, norm) for it, (loss, norm, finite) in zip(its, rows) if not finite]

    def log(self, it: int, values: dict[str, Any]) -> None:
        if self.wandb is not None:
            self.wandb.log(values, step=it)

    def eval(self, record: dict[str, Any]) -> None:
        """Record one eval: a metrics.jsonl line, wandb (scalars, and the sample in a table)."""
        if not self.main:
            return
        self.last_record = record
        line = json_text.dumps(record) + "\n"
        append_line(self.metrics_path, line, "free some space, then resume the run")
        scalars = {f"eval/{k}": v for k, v in record.items() if k != "iter" and isinstance(v, (int, float))}
        self.log(record["iter"], scalars)
        if "sample" in record and self.wandb is not None:
            import wandb

            self.samples.append([record["iter"], record["sample"]])
            table = wandb.Table(columns=["iter", "sample"], data=self.samples)
            self.wandb.log({"samples": table}, step=record["iter"])

    def plot(self, final: bool = False) -> None:
        """Redraw OUT_DIR/loss.png, unless that would take drawing past PLOT_SHARE of the wall time so far
        (the last drawing's cost is the guess for the next; the first, which imports matplotlib, is guessed
        at a second). Always at the end, after the last step."""
        wall = time.perf_counter() - self.started
        if (
            not self.main
            or not self.run.cfg.log.plot
            or (not final and self.plot_seconds + (self.plot_cost or 1.0) > PLOT_SHARE * wall)
        ):
            return
        records = read_metrics(self.metrics_path)
        if sum("val_loss" in r for r in records) < 2 and not final:  # one point: wait for a line
            return
        start = time.perf_counter()
        from interp.curves import plot_run  # matplotlib only once a run draws

        try:
            plot_run(records, self.run.out_dir / "loss.png", title=str(self.run.out_dir))
        except UserError as e:  # a picture never stops training
            if not self.plot_failed:
                self.write(f"warning: {e} (training goes on without it)", sys.stderr)
            self.plot_failed = True
        self.plot_cost = time.perf_counter() - start
        self.plot_seconds += self.plot_cost

    def close(self) -> None:
        self.bar.close()
        if self.wandb is not None:
            self.wandb.finish()


def check_wandb_login() -> None:
    """Refuse log.wandb=true before training where wandb is not installed, or would stop for a missing
    login (or prompt)."""
    if importlib.util.find_spec("wandb") is None:
        raise UserError("log.wandb=true needs the wandb package: pip install wandb (or leave log.wandb off)")
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    modes = [os.environ.get("WANDB_MODE", "")]
    for settings in (Path.home() / ".config" / "wandb" / "settings", Path("wandb") / "settings"):
        parser = configparser.ConfigParser()
        try:
            parser.read(settings)
            modes.append(parser.get("default", "mode", fallback=""))
        except configparser.Error:
            pass
    if any(m.lower() in ("offline", "disabled", "dryrun") for m in modes):
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        login = netrc.netrc(os.environ.get("NETRC")).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        login = None
    if not login:
        raise UserError(
            f"log.wandb=true but this machine has no wandb login (no WANDB_API_KEY, no {host} entry in "
            "~/.netrc); run `wandb login`, or set WANDB_MODE=offline to log locally (and `wandb sync` later)"
        )


def repair_metrics(metrics_path: Path, upto: int) -> str:
    """Rewrite metrics.jsonl without torn lines and without the rows past iteration `upto` (the checkpoint
    a run resumes from); '' when it is whole, else a line saying what was dropped."""
    rows = metrics_rows(metrics_path)
    kept = [
        line
        for line, r in rows
        if r is not None and not (isinstance(r.get("iter"), int) and r["iter"] > upto)
    ]
    torn = sum(r is None for _, r in rows)
    if len(kept) == len(rows) and Path(metrics_path).read_text(errors="replace").endswith("\n"):
        return ""
    atomic_write(metrics_path, "".join(line + "\n" for line in kept), "free some space, then resume the run")
    past = len(rows) - len(kept) - torn
    return (
        f"repaired {metrics_path}: dropped {torn} torn line(s) and {past} row(s) past iteration {upto}, the "
        "checkpoint this run resumes from"
    )
