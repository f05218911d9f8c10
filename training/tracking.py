"""What a run shows and records (rank 0 only): the progress bar (one line per log step without a
terminal), OUT_DIR/metrics.jsonl (one JSON line per eval, for plot.py and scripts), loss.png
(redrawn at evals within 1% of the run's wall time) and wandb (imported only when enabled).

It shows what the run reads back and decides nothing. metrics.jsonl stays valid JSON (a loss that is
not finite is null); a resumed run repairs it first (a torn last line, rows past its checkpoint). A
row that cannot be appended (a full disk) is one line; a picture that cannot be drawn, a warning.
"""

from __future__ import annotations

import configparser
import dataclasses
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
from data.dataset import Meta
from runs.checkpoint import Progress
from runs.config_schema import Config
from runs.out_dir import METRICS
from runs.runtime import Runtime
from training.evaluation import final_eval_wanted
from training.optim import schedule_warning

PLOT_SHARE = 0.01  # the most of a run's wall time that redrawing loss.png may take


class Tracker:
    def __init__(self, cfg: Config, rt: Runtime, progress: Progress):
        self.cfg = cfg
        self.rt = rt
        self.progress = progress  # the run's, as its loop advances it
        self.out_dir = Path(cfg.train.out_dir)
        self.main = rt.is_main
        self.metrics_path = self.out_dir / METRICS
        self.wandb = None
        self.last_record: dict[str, Any] = {}
        self.samples: list[list] = []  # [iteration, text] of each sample, for a wandb table
        self.started = time.perf_counter()
        self.plot_seconds = 0.0
        self.plot_cost = 0.0
        # the losses read back since the last log step
        self.loss_sum = 0.0
        self.loss_steps = 0
        self.last_log = (progress.iter, progress.elapsed_s)  # (iteration, training seconds)
        self.first = self.last_log  # where this process started (a resumed run: where it resumed)
        self.bar = tqdm(
            total=cfg.train.max_iters,
            initial=progress.iter,
            disable=None if self.main else True,
            dynamic_ncols=True,
            unit="it",
        )
        self.plot_failed = False
        if not self.main:
            return
        if not cfg.train.resume:
            self.metrics_path.unlink(missing_ok=True)
        elif self.metrics_path.is_file() and (
            repaired := repair_metrics(self.metrics_path, progress.iter)
        ):
            self.write(repaired, sys.stderr)
        log = cfg.log
        if log.wandb:
            import wandb

            wandb_id = progress.wandb_id
            self.wandb = wandb.init(
                project=log.wandb_project,
                name=log.wandb_run_name,
                config=dataclasses.asdict(cfg),
                dir=str(self.out_dir),
                id=wandb_id,
                resume="allow" if wandb_id else None,
            )
            progress.wandb_id = self.wandb.id

    def wall(self) -> float:
        """Seconds since the run started training (this process)."""
        return time.perf_counter() - self.started

    def write(self, line: str, file=None) -> None:
        if self.main:
            self.bar.write(line, file=file)

    def step(self) -> None:
        """One more iteration done."""
        self.bar.update(1)

    def losses(self, it: int, loss_sum: float, steps: int, elapsed: float, lr: float) -> None:
        """The summed mean losses of `steps` more iterations, up to iteration `it` (read back by the
        run, all ranks summed); every log.interval iterations (and at max_iters) show and log their
        mean."""
        self.loss_sum, self.loss_steps = self.loss_sum + loss_sum, self.loss_steps + steps
        if it % self.cfg.log.interval and it != self.cfg.train.max_iters:
            return
        last_it, last_elapsed = self.last_log
        mean_loss = self.loss_sum / (self.rt.world_size * self.loss_steps)
        tok_s = self.cfg.tokens_per_iter * (it - last_it) / max(elapsed - last_elapsed, 1e-9)
        self.bar.set_postfix(
            loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}", refresh=False
        )
        # no terminal (a batch job's log, a pipe): one line per log step instead
        if self.bar.disable:
            total = self.cfg.train.max_iters
            self.write(
                f"iteration {it}/{total}: loss {mean_loss:.4f}, lr {lr:.2e}, {tok_s:,.0f} tokens/s"
            )
        tokens = it * self.cfg.tokens_per_iter
        self.log(it, {"train/loss": mean_loss, "lr": lr, "tokens_per_s": tok_s, "tokens": tokens})
        self.loss_sum = 0.0
        self.loss_steps = 0
        self.last_log = (it, elapsed)

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
        scalars = {
            f"eval/{k}": v for k, v in record.items() if k != "iter" and isinstance(v, (int, float))
        }
        self.log(record["iter"], scalars)
        if "sample" in record and self.wandb is not None:
            import wandb

            self.samples.append([record["iter"], record["sample"]])
            table = wandb.Table(columns=["iter", "sample"], data=self.samples)
            self.wandb.log({"samples": table}, step=record["iter"])

    def plot(self, final: bool = False) -> None:
        """Redraw OUT_DIR/loss.png, unless that would take drawing past PLOT_SHARE of the wall time
        so far (the last drawing's cost is the guess for the next; the first, which imports
        matplotlib, is guessed at a second). Always at the end, after the last step."""
        wall = time.perf_counter() - self.started
        if (
            not self.main
            or not self.cfg.log.plot
            or (not final and self.plot_seconds + (self.plot_cost or 1.0) > PLOT_SHARE * wall)
        ):
            return
        records = read_metrics(self.metrics_path)
        if sum("val_loss" in r for r in records) < 2 and not final:  # one point: wait for a line
            return
        start = time.perf_counter()
        from training.curves import plot_run  # matplotlib only once a run draws

        try:
            plot_run(records, self.out_dir / "loss.png", title=str(self.out_dir))
        except UserError as e:  # a picture never stops training
            if not self.plot_failed:
                self.write(f"warning: {e} (training goes on without it)", sys.stderr)
            self.plot_failed = True
        self.plot_cost = time.perf_counter() - start
        self.plot_seconds += self.plot_cost

    def finish(self, n_val: int) -> None:
        """The line that says how the run ended (`n_val`: the val split's tokens)."""
        cfg = self.cfg
        last = self.last_record
        p = self.progress
        out_dir = self.out_dir
        if not self.main:
            return
        exact = ""
        if "final_val_loss" in last:
            bpb = f"; {last['final_val_bpb']:.3f} bits per byte" if "final_val_bpb" in last else ""
            n = last["final_val_tokens"]
            exact = f", final val loss {last['final_val_loss']:.4f} (exact: all {n:,} tokens{bpb})"
        elif str(cfg.train.final_eval).lower() == "auto" and not final_eval_wanted("auto", n_val):
            self.write(
                f"the val split has {n_val:,} tokens, too many for an exact eval at the end "
                f"(train.final_eval=auto); measure it with: python eval.py {out_dir}"
            )
        where = f"; checkpoints in {out_dir}" if cfg.train.save else ""
        here, wall = p.iter - self.first[0], f"{self.wall():.1f}s wall"
        # the totals are the run's; what this process did is its part since then
        if cfg.train.resume:
            since = p.elapsed_s - self.first[1]
            wall = f"resumed at iteration {self.first[0]}: {here} here in {since:.1f}s, {wall}"
        self.write(
            f"done: {p.iter} iterations in {p.elapsed_s:.1f}s of training ({wall}), best val loss "
            f"{p.best_val_loss:.4f} (estimated){exact}{where}"
        )

    def close(self) -> None:
        self.bar.close()
        if self.wandb is not None:
            self.wandb.finish()


def millions(n: int) -> str:
    """A count of parameters as the run's first line and the dry run give it: in millions, or whole
    below 5,000 (a tiny model's 3,328 embedding parameters are not "0.00M")."""
    return f"{n / 1e6:,.2f}M" if n >= 5_000 else f"{n:,}"


def describe_run(
    cfg: Config,
    rt: Runtime,
    model: torch.nn.Module,
    meta: Meta,
    progress: Progress,
    compiled: bool,
    changed: str,
) -> None:
    """What is about to train: the model, the dataset, the device, the batch; a resumed run (what
    its config `changed`, in words) or a LoRA run."""
    if not rt.is_main:
        return
    mc = cfg.model
    every = model.num_params(non_embedding=False)  # as --dry-run counts
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(
        f"model: {millions(every)} parameters ({mc.describe()}); dataset {cfg.data.dataset}: "
        f"{meta.train_tokens:,} train / {meta.val_tokens:,} val tokens"
    )
    print(
        f"device {rt.device}, precision {rt.precision}, compile {'on' if compiled else 'off'}, "
        f"{torch.get_num_threads()} threads; batch {cfg.train.batch_size} x {mc.block_size} tokens "
        f"x {cfg.train.grad_accum // rt.world_size} micro-step(s) x {rt.world_size} process(es) = "
        f"{cfg.tokens_per_iter:,} tokens/iteration"
    )
    warning = schedule_warning(cfg.optim, cfg.train)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    past = [str(i) for i in cfg.train.keep_iters if i > cfg.train.max_iters]
    if past:  # not refused: a resumed run may raise train.max_iters and reach them
        print(
            f"warning: train.keep_iters holds {', '.join(past)}, past train.max_iters="
            f"{cfg.train.max_iters}: this run keeps no checkpoint there unless it is resumed with "
            "a higher train.max_iters",
            file=sys.stderr,
        )
    if cfg.train.init_from and not cfg.train.resume:
        print(f"starting from the weights of {cfg.train.init_from} (fresh optimizer, iteration 0)")
    if cfg.train.resume:
        p = progress
        print(
            f"resuming at iteration {p.iter:,} of {cfg.train.max_iters:,} from "
            f"{Path(cfg.train.out_dir) / 'last'} ({p.elapsed_s:.1f}s of training so far, best val "
            f"loss {p.best_val_loss:.4f}){changed}"
        )
    if cfg.lora is not None:
        lc = cfg.lora
        print(
            f"LoRA: rank {lc.rank}, alpha {lc.alpha:g} on {', '.join(lc.targets)}: "
            f"{trained / 1e6:.3f}M parameters train ({100 * trained / every:.2f}% of "
            f"{millions(every)}); the base is frozen, checkpoints hold the adapters alone"
        )


def check_wandb_login() -> None:
    """Refuse log.wandb=true before training where wandb is not installed, or would stop for a
    missing login (or prompt)."""
    if importlib.util.find_spec("wandb") is None:
        raise UserError(
            "log.wandb=true needs the wandb package: pip install wandb (or leave log.wandb off)"
        )
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
            f"log.wandb=true but this machine has no wandb login (no WANDB_API_KEY, no {host} "
            "entry in ~/.netrc); run `wandb login`, or set WANDB_MODE=offline to log locally (and "
            "`wandb sync` later)"
        )


def repair_metrics(metrics_path: Path, upto: int) -> str:
    """Rewrite metrics.jsonl without torn lines and without the rows past iteration `upto` (the
    checkpoint a run resumes from); '' when it is whole, else a line saying what was dropped."""
    rows = metrics_rows(metrics_path)
    kept = [
        line
        for line, r in rows
        if r is not None and not (isinstance(r.get("iter"), int) and r["iter"] > upto)
    ]
    torn = sum(r is None for _, r in rows)
    if len(kept) == len(rows) and Path(metrics_path).read_text(errors="replace").endswith("\n"):
        return ""
    atomic_write(
        metrics_path, "".join(line + "\n" for line in kept), "free some space, then resume the run"
    )
    past = len(rows) - len(kept) - torn
    return (
        f"repaired {metrics_path}: dropped {torn} torn line(s) and {past} row(s) past iteration "
        f"{upto}, the checkpoint this run resumes from"
    )
