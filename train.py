"""Train a GPT.

    python train.py                                   # configs/shakespeare_char.yaml
    python train.py CONFIG [section.key=value ...]    # any config, any value overridden
    python train.py CONFIG --print-config             # show the resolved config and stop
    torchrun --nproc_per_node=N train.py CONFIG       # data parallel (train.parallel: ddp | fsdp)

Each iteration runs train.grad_accum micro-batches of train.batch_size sequences, split across processes, then
one optimizer step. Every train.eval_interval iterations (and at the end) it measures train and val loss on
fixed batches, appends a line to OUT_DIR/metrics.jsonl, and writes OUT_DIR/last (and OUT_DIR/best when val
improved). Ctrl-C or SIGTERM finishes the step, writes a checkpoint and says how to resume. Errors in the
config, data or out_dir stop it before training with one line (--debug shows the traceback).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from common.errors import UserError, run_cli
from interp import scores as heads
from model import GPT
from training import checkpoint, distributed
from training.config import Config, load_config, to_dict, to_yaml
from training.optim import lr_factor, set_lr
from training.runtime import Runtime, setup
from training.tracking import Tracker, read_metrics
from training.trainer import build, check_compatible, evaluate, load_dataset, train_step


class StopRequest:
    """SIGINT / SIGTERM: the first asks training to stop after the current step; a second exits at once."""

    def __init__(self, verbose: bool = True):
        self.signum = 0
        self.verbose = verbose
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signum:
            if self.verbose:
                print(
                    "\nsecond interrupt: exiting now, without a checkpoint (the last one is intact)",
                    file=sys.stderr,
                    flush=True,
                )
            os._exit(128 + signum)
        self.signum = signum
        if self.verbose:
            print(
                f"\n{signal.Signals(signum).name}: finishing this step, then writing a checkpoint "
                "(interrupt again to exit at once)",
                file=sys.stderr,
            )


def check_out_dir(out_dir: Path, cfg: Config, n_params: int) -> None:
    """Fail before training on an out_dir that cannot hold the checkpoints, or whose run would be lost."""
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
    has_run = any((out_dir / n / checkpoint.WEIGHTS).is_file() for n in ("last", "best", ".last.old"))
    if has_run and not cfg.train.resume:
        if not cfg.train.overwrite:
            raise UserError(
                f"{out_dir} already holds a checkpoint; continue it with train.resume=true, start "
                "over with train.overwrite=true (deletes it), or pick another train.out_dir"
            )
        for name in ("last", "best", ".last.old", ".best.old"):
            shutil.rmtree(out_dir / name, ignore_errors=True)
    need = n_params * 4 * 4 * 2  # weights + AdamW moments, fp32, in last/ and best/ while swapping
    free = shutil.disk_usage(out_dir).free
    if cfg.train.save and free < need:
        raise UserError(
            f"{out_dir} has {free / 2**20:.0f} MiB free; checkpoints need about {need / 2**20:.0f} MiB. "
            "Free some space or choose another train.out_dir"
        )


def resume_command(argv: list[str], rt: Runtime) -> str:
    args = [a for a in argv if not a.startswith(("train.resume=", "train.overwrite="))] + [
        "train.resume=true"
    ]
    launcher = f"torchrun --nproc_per_node={rt.world_size}" if rt.distributed else "python"
    return f"{launcher} train.py {shlex.join(args)}"


def main(argv: list[str]) -> int:
    flags = {a for a in argv if a.startswith("--")}
    unknown = flags - {"--print-config"}
    if unknown:
        raise UserError(
            f"unknown option {sorted(unknown)[0]}; usage: python train.py [CONFIG] "
            "[section.key=value ...] [--print-config] [--debug]"
        )
    args = [a for a in argv if not a.startswith("--")]
    config_path = args[0] if args and "=" not in args[0] else None
    cfg, _ = load_config(config_path, args[1:] if config_path else args)
    if "--print-config" in flags:
        print(to_yaml(cfg), end="")
        return 0

    rt = setup(cfg.train.device, cfg.train.precision, cfg.model.n_embd, cfg.train.threads)
    meta, splits = load_dataset(cfg, rt)
    out_dir = Path(cfg.train.out_dir)
    if rt.is_main:
        with torch.device("meta"):  # shapes only, no memory
            check_out_dir(out_dir, cfg, GPT(cfg.model).num_params(non_embedding=False))
    distributed.barrier(rt)
    state, ckpt = None, None
    if cfg.train.resume:
        ckpt = checkpoint.find(out_dir, prefer=("last",))
        check_compatible(ckpt, checkpoint.load_config(ckpt), cfg, meta["tokenizer"])
        state = checkpoint.load_train_state(ckpt)
    run = build(cfg, rt, meta, splits, weights_from=ckpt)
    start_iter, best_val, train_time, skipped = 0, float("inf"), 0.0, 0
    if state is not None:
        distributed.load_optimizers(run.optimizers, state, ckpt, rt)
        if run.scaler is not None and state.get("scaler"):
            run.scaler.load_state_dict(state["scaler"])
        start_iter, best_val, train_time = state["iter"], state["best_val_loss"], state["elapsed_s"]
        skipped = state.get("skipped_steps", 0)
        checkpoint.set_rng_state(state["rng"])

    mc, tokens_per_iter = cfg.model, run.tokens_per_iter
    if rt.is_main:
        print(
            f"model: {run.raw_model.num_params() / 1e6:.2f}M parameters ({mc.n_layer} layers, "
            f"{mc.n_head} heads of {mc.head_dim}, n_embd {mc.n_embd}, context {mc.block_size}); "
            f"dataset {cfg.data.dataset}: "
            f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens"
        )
        print(
            f"device {rt.device}, precision {rt.precision}, "
            f"compile {'on' if run.step_model is not run.model else 'off'}, "
            f"{torch.get_num_threads()} threads; "
            f"batch {cfg.train.batch_size} x {mc.block_size} tokens x {run.micro_steps} micro-step(s) x "
            f"{rt.world_size} process(es) = {tokens_per_iter:,} tokens/iteration"
        )
    tracker = Tracker(
        out_dir,
        rt.is_main,
        {"project": cfg.log.wandb_project, "name": cfg.log.wandb_run_name, "config": to_dict(cfg)}
        if cfg.log.wandb
        else None,
        (state or {}).get("wandb_id"),
        fresh=state is None,
    )
    stop = StopRequest(verbose=rt.is_main)

    def save(it: int, val_loss: float | None) -> Path:
        train_state = {
            "iter": it,
            "best_val_loss": best_val,
            "elapsed_s": train_time,
            "skipped_steps": skipped,
            "tokens": it * tokens_per_iter,
            "rng": checkpoint.rng_state(),
            "wandb_id": tracker.wandb_id,
            "scaler": run.scaler.state_dict() if run.scaler is not None else None,
        }
        path = distributed.save_checkpoint(
            out_dir, "last", run.raw_model, run.optimizers, train_state, cfg, meta["tokenizer"], rt
        )
        if val_loss is not None and val_loss <= best_val and rt.is_main:
            checkpoint.copy(out_dir, "last", "best")
        return path

    bar = tqdm(
        total=cfg.train.max_iters,
        initial=start_iter,
        disable=None if rt.is_main else True,
        dynamic_ncols=True,
        unit="it",
    )
    it, loss_sum, last_log = start_iter, torch.zeros((), device=rt.device), (start_iter, time.perf_counter())
    segment_start = time.perf_counter()
    while True:
        # decided jointly by all ranks: whether to stop, and the elapsed time the schedule follows
        stop_signal, elapsed = distributed.agree(
            [stop.signum, train_time + time.perf_counter() - segment_start], rt
        )
        last = it >= cfg.train.max_iters or (cfg.train.max_time is not None and elapsed >= cfg.train.max_time)
        progress = max(
            it / max(cfg.train.max_iters, 1), elapsed / cfg.train.max_time if cfg.train.max_time else 0.0
        )
        lr = cfg.optim.lr * lr_factor(it, progress, cfg.optim)
        if (it % cfg.train.eval_interval == 0 or last) and not (state is not None and it == start_iter):
            rt.synchronize()
            eval_start, train_time = time.perf_counter(), elapsed
            losses = evaluate(run)
            best_val = min(best_val, losses["val"])
            record = {
                "iter": it,
                "train_loss": round(losses["train"], 5),
                "val_loss": round(losses["val"], 5),
                "lr": lr,
                "tokens": it * tokens_per_iter,
                "elapsed_s": round(train_time, 3),
            }
            if cfg.log.head_scores and (rt.is_main or cfg.train.parallel == "fsdp"):  # FSDP: all ranks gather
                record["heads"] = heads.score_heads(run.raw_model, splits["val"])
                tracker.step(it, heads.flat_scores(record["heads"]))
            tracker.eval(record)
            if rt.is_main:
                bar.write(
                    f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} "
                    f"({train_time:.1f}s)"
                )
                if "heads" in record:
                    bar.write(f"  heads: {heads.strongest_heads(record['heads'])}")
            if cfg.train.save:
                save(it, losses["val"])
            segment_start = time.perf_counter()
            last_log = (last_log[0], last_log[1] + segment_start - eval_start)  # tokens/s without evals
        if stop_signal:
            train_time += time.perf_counter() - segment_start
            path = save(it, None)
            if rt.is_main:
                bar.close()
                print(
                    f"stopped at iteration {it}; checkpoint in {path}\n"
                    f"resume with: {resume_command(argv, rt)}",
                    file=sys.stderr,
                )
            tracker.finish()
            distributed.shutdown(rt)
            return 128 + int(stop_signal)
        if last:
            break

        set_lr(run.optimizers, lr / cfg.optim.lr)
        step_loss, grad_norm, applied = train_step(run, it)
        if not applied:
            skipped += 1
            if skipped > cfg.train.skip_nonfinite:
                good = out_dir / "last" if (out_dir / "last").is_dir() else None
                raise UserError(
                    f"non-finite loss or gradient at iteration {it} (loss {step_loss.item():.4g}, "
                    f"gradient norm {grad_norm.item():.4g}); stopped before applying it. Last good "
                    f"checkpoint: {good or 'none'}. Lower optim.lr, raise optim.warmup_iters, or set "
                    "train.skip_nonfinite=N to skip up to N such steps"
                )
            if rt.is_main:
                bar.write(
                    f"iteration {it}: non-finite loss, step skipped ({skipped}/{cfg.train.skip_nonfinite})"
                )
        loss_sum += step_loss
        it += 1
        bar.update(1)
        if it % cfg.log.interval == 0 or it == cfg.train.max_iters:
            mean_loss = distributed.all_sum(loss_sum, rt).item() / (rt.world_size * (it - last_log[0]))
            now = time.perf_counter()
            tok_s = tokens_per_iter * (it - last_log[0]) / (now - last_log[1])
            bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}", refresh=False)
            tracker.step(
                it, {"train/loss": mean_loss, "lr": lr, "tokens_per_s": tok_s, "tokens": it * tokens_per_iter}
            )
            loss_sum.zero_()
            last_log = (it, now)
    bar.close()
    if rt.is_main and cfg.log.head_scores:
        from interp.plots import plot_training_curves  # matplotlib only when plotting

        plot_training_curves(read_metrics(tracker.metrics_path), out_dir / "heads_training.png")
    if rt.is_main:
        where = f"; checkpoints in {out_dir}" if cfg.train.save else ""
        print(f"done: {it} iterations in {train_time:.1f}s of training, best val loss {best_val:.4f}{where}")
    tracker.finish()
    distributed.shutdown(rt)
    return 0


if __name__ == "__main__":
    run_cli(main)
