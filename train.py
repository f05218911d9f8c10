"""Train a GPT.

    python train.py                                   # configs/shakespeare_char.yaml
    python train.py CONFIG [section.key=value ...]    # any config, any value overridden
    python train.py CONFIG --print-config             # show the resolved config and stop
    python train.py CONFIG --dry-run                  # what the run will cost (memory, time), then stop
    torchrun --nproc_per_node=N train.py CONFIG       # data parallel (train.parallel: ddp | fsdp)

Each iteration runs train.grad_accum micro-batches of train.batch_size sequences, split across processes, then
one optimizer step. Every train.eval_interval iterations (and at the end) it estimates train and val loss
on fixed batches, appends a line to OUT_DIR/metrics.jsonl, redraws OUT_DIR/loss.png, and writes OUT_DIR/last
(and OUT_DIR/best when val improved); at the end it measures the loss over the whole val split exactly.
Ctrl-C or SIGTERM finishes the step, writes a checkpoint and says how to resume. Errors in the config, data
or out_dir stop it before training with one line (--debug shows the traceback).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time

import torch

from common.errors import ConfigError, UserError, run_cli
from data.prompts import default_prompt, encode_prompt
from data.tokenizers import from_meta
from interp import scores as heads
from model import generate
from runs import checkpoint
from runs.config import CONFIG_DIR, Config, load_config, shipped_configs, to_yaml
from training import distributed, estimate
from training.evaluation import default_batch_size, evaluate_tokens, final_eval_wanted
from training.optim import lr_factor, schedule_progress, set_lr
from training.tracking import Tracker, check_wandb_login, read_metrics
from training.trainer import Run, evaluate, save, start_run, train_step


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


class Clock:
    """Training seconds: one running clock, paused while the run evaluates and writes checkpoints."""

    def __init__(self, elapsed: float = 0.0):
        self.banked, self.started = elapsed, time.perf_counter()

    def elapsed(self) -> float:
        return self.banked + (time.perf_counter() - self.started if self.started is not None else 0.0)

    @contextlib.contextmanager
    def paused(self):
        self.banked, self.started = self.elapsed(), None
        try:
            yield
        finally:
            self.started = time.perf_counter()


class Agreement:
    """The stop signal and the training seconds, as every rank acts on them. One process reads them every
    iteration. torchrun ranks agree on them (one all-reduce, which waits for the slowest rank) only at log
    steps and evals, where the host syncs anyway, and hold them in between: no other iteration waits. So
    under torchrun a signal or train.max_time takes effect within log.interval iterations, and a learning
    rate that follows max_time moves in steps of log.interval iterations."""

    def __init__(self, run: Run, stop: StopRequest, clock: Clock):
        self.run, self.stop, self.clock, self.values = run, stop, clock, None

    def now(self, it: int) -> tuple[int, float]:
        """(signal number or 0, training seconds) at the start of iteration `it`."""
        cfg, rt = self.run.cfg, self.run.rt
        host_syncs = it % cfg.log.interval == 0 or it % cfg.train.eval_interval == 0
        if self.values is None or not rt.distributed or host_syncs:
            signum, elapsed = distributed.agree([self.stop.signum, self.clock.elapsed()], rt)
            self.values = (int(signum), elapsed)
        return self.values


def main(argv: list[str]) -> int:
    parsed = parse_command_line(argv)
    if parsed is None:
        return 0
    run = start_run(*parsed)
    cfg, rt, p = run.cfg, run.rt, run.progress
    prepare(run)
    log, stop, clock = Tracker(run), StopRequest(verbose=rt.is_main), Clock(p.elapsed_s)
    agreed = Agreement(run, stop, clock)
    try:
        while True:
            # termination conditions, the same on all ranks: a signal, max_iters, max_time
            signum, elapsed = agreed.now(p.iter)
            done = p.iter >= cfg.train.max_iters or elapsed >= (cfg.train.max_time or float("inf"))

            # determine and set the learning rate
            progress = schedule_progress(p.iter, elapsed, cfg.train)
            set_lr(run.optimizers, lr_factor(p.iter, progress, cfg.optim))

            # evaluate the loss on train/val and write checkpoints (the clock stops meanwhile)
            if (p.iter % cfg.train.eval_interval == 0 or done) and p.evaluated_at != p.iter:
                with clock.paused():
                    p.elapsed_s = elapsed
                    evaluate_and_save(run, log, final=done)
            if signum:
                return stop_with_checkpoint(run, log, clock, argv, int(signum))
            if done:
                break

            # forward, backward, update (not applied, on the device, if the loss or gradient is not finite)
            loss, grad_norm, finite = train_step(run, p.iter)
            p.iter += 1

            # timing and logging; at log steps the host reads the losses back and counts non-finite steps
            if log.step(p.iter, loss, grad_norm, finite, clock.elapsed()):
                skip_or_stop(run, log)
        finish(run, log)
        return 0
    finally:
        log.close()
        distributed.shutdown(rt)


def parse_command_line(argv: list[str]) -> tuple[Config, dict[str, str]] | None:
    """The config the command line asks for, and where each key set explicitly came from (load_config's
    origins); None when it only asked for help or the config."""
    flags = {a for a in argv if a.startswith("-")}
    if flags & {"-h", "--help"}:
        print(usage())
        return None
    unknown = flags - {"--print-config", "--dry-run"}
    if unknown:
        raise ConfigError(
            f"unknown option {sorted(unknown)[0]}; usage: python train.py [CONFIG] [section.key=value ...] "
            "[--print-config] [--dry-run] [--debug] (python train.py --help for more)"
        )
    args = [a for a in argv if not a.startswith("-")]
    config_path = args[0] if args and "=" not in args[0] else None
    cfg, origins = load_config(config_path, args[1:] if config_path else args)
    if "--print-config" in flags:
        if cfg.train.init_from:
            print(f"# the model keys not set explicitly will follow train.init_from {cfg.train.init_from}")
        print(to_yaml(cfg), end="")
        return None
    if "--dry-run" in flags:
        print(estimate.dry_run(cfg, config_path or "the default config"))
        return None
    if cfg.log.wandb:
        check_wandb_login()
    return cfg, origins


def usage() -> str:
    configs = "\n".join(f"  {name:<26}{about}" for name, about in shipped_configs())
    return f"""usage: python train.py [CONFIG] [section.key=value ...] [--print-config] [--dry-run] [--debug]
       torchrun --nproc_per_node=N train.py [CONFIG] [section.key=value ...]

Train a GPT on a dataset, writing checkpoints and metrics to train.out_dir.

CONFIG is a YAML file, or the name of one shipped in {CONFIG_DIR.name}/ (default: shakespeare_char):
{configs}

A config has the sections model, data, train, optim and log. Every key, its type and its default is
documented in training/config.py (model keys in model/config.py); --print-config shows them resolved.
Any key can be overridden as section.key=value (YAML syntax):

  python train.py shakespeare_char model.n_layer=6 optim.lr=1e-3 train.max_iters=5e3
  python train.py shakespeare_char train.device=cpu train.max_time=60 log.wandb=true
  python train.py shakespeare_char train.resume=true        # continue out_dir's last checkpoint

options:
  -h, --help        show this help and exit
  --print-config    print the resolved config and exit
  --dry-run         print what the run will cost (parameters, tokens, memory, time) and exit
  --debug           show the traceback of an error (also TINYGPT_DEBUG=1)"""


def prepare(run: Run) -> None:
    """Check the out_dir before training (rank 0, the others wait) and describe the run."""
    cfg, rt = run.cfg, run.rt
    if rt.is_main:
        checkpoint.prepare_out_dir(run.out_dir, cfg, run.raw_model.num_params(non_embedding=False))
    distributed.barrier(rt)
    if not rt.is_main:
        return
    mc, meta = cfg.model, run.meta
    print(
        f"model: {run.raw_model.num_params() / 1e6:.2f}M parameters ({mc.n_layer} layers, {mc.n_head} heads "
        f"of {mc.head_dim}, n_embd {mc.n_embd}, context {mc.block_size}); dataset {cfg.data.dataset}: "
        f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens"
    )
    if cfg.log.sample_every:  # a prompt the vocabulary cannot encode stops here, not at the first sample
        tokenizer = from_meta(meta["tokenizer"])
        prompt = cfg.log.sample_prompt
        encode_prompt(prompt if prompt is not None else default_prompt(tokenizer), tokenizer, mc.block_size)
    print(
        f"device {rt.device}, precision {rt.precision}, compile {'on' if run.compiled else 'off'}, "
        f"{torch.get_num_threads()} threads; batch {cfg.train.batch_size} x {mc.block_size} tokens x "
        f"{run.micro_steps} micro-step(s) x {rt.world_size} process(es) = {run.tokens_per_iter:,} "
        "tokens/iteration"
    )
    if cfg.train.init_from and not cfg.train.resume:
        print(f"starting from the weights of {cfg.train.init_from} (fresh optimizer, iteration 0)")


def evaluate_and_save(run: Run, log: Tracker, final: bool = False) -> None:
    """Losses on the fixed eval batches (and head scores, a sample, and at the end the exact val loss, when
    asked), one metrics line, checkpoints."""
    cfg, p = run.cfg, run.progress
    skip_or_stop(run, log)  # a checkpoint records the steps skipped so far
    losses = evaluate(run)
    improved = losses["val"] <= p.best_val_loss
    previous, p.best_val_loss, p.evaluated_at = p.evaluated_at, min(p.best_val_loss, losses["val"]), p.iter
    record = {
        "iter": p.iter,
        "train_loss": round(losses["train"], 5),
        "val_loss": round(losses["val"], 5),
        **({"val_bpb": round(losses["val_bpb"], 5)} if "val_bpb" in losses else {}),
        "lr": run.optimizers[0].param_groups[0]["lr"],
        "tokens": p.iter * run.tokens_per_iter,
        "elapsed_s": round(p.elapsed_s, 3),
    }
    every_rank = run.rt.is_main or cfg.train.parallel == "fsdp"  # FSDP: all ranks gather for a forward
    if cfg.log.head_scores and every_rank:
        record["heads"] = heads.score_heads(run.raw_model, run.splits["val"])
        log.log(p.iter, heads.flat_scores(record["heads"]))
    if final and final_eval_wanted(cfg.train.final_eval, run.meta["val_tokens"]):
        record |= exact_val_loss(run)
    n = cfg.log.sample_every
    if n and p.iter and (final or p.iter // n > max(previous, 0) // n) and every_rank:
        record["sample"] = sample_text(run)
    log.eval(record, final)
    bpb = f", val bpb {record['val_bpb']:.3f}" if "val_bpb" in record else ""
    train, val = losses["train"], losses["val"]
    log.write(f"iter {p.iter}: train loss {train:.4f}, val loss {val:.4f}{bpb} ({p.elapsed_s:.1f}s)")
    if "heads" in record:
        log.write(f"  heads: {heads.strongest_heads(record['heads'])}")
    if "sample" in record:
        log.write(f"sample at iteration {p.iter} (temperature 0.8, seed {cfg.train.seed}):")
        log.write(record["sample"].strip("\n") + "\n")
    if cfg.train.save:
        save(run, improved)


def exact_val_loss(run: Run) -> dict:
    """The loss over every token of the val split (training/evaluation.py), all ranks together."""
    cfg = run.cfg
    batch = default_batch_size(cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size)
    byte_lengths = run.byte_lengths if run.byte_lengths is not None else torch.zeros(cfg.model.vocab_size)
    val = run.splits["val"]
    result = evaluate_tokens(run.raw_model, val.path, byte_lengths, batch, rt=run.rt, dtype=val.dtype.name)
    out = {"final_val_loss": round(result.loss, 5), "final_val_tokens": result.tokens}
    return out | ({"final_val_bpb": round(result.bpb, 5)} if result.bytes else {})


def sample_text(run: Run) -> str:
    """log.sample_tokens tokens from the model as it is now: temperature 0.8, seeded by train.seed, in fp32
    (as sample.py), after log.sample_prompt."""
    cfg, model = run.cfg, run.raw_model
    tokenizer = from_meta(run.meta["tokenizer"])
    prompt = cfg.log.sample_prompt if cfg.log.sample_prompt is not None else default_prompt(tokenizer)
    ids = encode_prompt(prompt, tokenizer, cfg.model.block_size)
    generator = torch.Generator(device=run.rt.device).manual_seed(cfg.train.seed)
    idx = torch.tensor([ids], device=run.rt.device)
    model.eval()
    tokens = [t.item() for t in generate(model, idx, cfg.log.sample_tokens, 0.8, None, None, generator)]
    model.train()
    return prompt + tokenizer.decode(tokens)


def skip_or_stop(run: Run, log: Tracker) -> None:
    """Count the steps since the last look that were not applied for a non-finite loss or gradient; past
    train.skip_nonfinite, stop (their results are read back at log steps, evals and stops only)."""
    p, allowed = run.progress, run.cfg.train.skip_nonfinite
    for it, loss, grad_norm in log.nonfinite_steps():
        p.skipped_steps += 1
        if p.skipped_steps > allowed:
            good = run.out_dir / "last" if (run.out_dir / "last").is_dir() else None
            raise UserError(
                f"non-finite loss or gradient at iteration {it} (loss {loss:.4g}, gradient norm "
                f"{grad_norm:.4g}); that step was skipped and training stopped at iteration {p.iter}. Last "
                f"good checkpoint: {good or 'none'}. Lower optim.lr, raise optim.warmup_iters, or set "
                "train.skip_nonfinite=N to skip up to N such steps"
            )
        log.write(f"iteration {it}: non-finite loss, step skipped ({p.skipped_steps}/{allowed})")


def stop_with_checkpoint(run: Run, log: Tracker, clock: Clock, argv: list[str], signum: int) -> int:
    """Ctrl-C or SIGTERM: write OUT_DIR/last, say how to resume, exit with 128 + the signal's number."""
    skip_or_stop(run, log)
    with clock.paused():
        run.progress.elapsed_s = clock.elapsed()
        path = save(run, improved=False)
    log.write(f"stopped at iteration {run.progress.iter}; checkpoint in {path}", sys.stderr)
    log.write(f"resume with: {resume_command(argv, run)}", sys.stderr)
    return 128 + signum


def finish(run: Run, log: Tracker) -> None:
    p, out_dir, last = run.progress, run.out_dir, log.last_record
    if not run.rt.is_main:
        return
    if run.cfg.log.head_scores:
        from interp.plots import plot_training_curves  # matplotlib only when plotting

        plot_training_curves(read_metrics(log.metrics_path), out_dir / "heads_training.png")
    exact, n_val = "", run.meta["val_tokens"]
    if "final_val_loss" in last:
        bpb = f"; {last['final_val_bpb']:.3f} bits per byte" if "final_val_bpb" in last else ""
        n = last["final_val_tokens"]
        exact = f", final val loss {last['final_val_loss']:.4f} (exact: all {n:,} tokens{bpb})"
    elif str(run.cfg.train.final_eval).lower() == "auto" and not final_eval_wanted("auto", n_val):
        log.write(
            f"the val split has {n_val:,} tokens, too many for an exact eval at the end "
            f"(train.final_eval=auto); measure it with: python eval.py {out_dir}"
        )
    where = f"; checkpoints in {out_dir}" if run.cfg.train.save else ""
    log.write(
        f"done: {p.iter} iterations in {p.elapsed_s:.1f}s of training ({log.wall():.1f}s wall), best val "
        f"loss {p.best_val_loss:.4f} (estimated){exact}{where}"
    )


def resume_command(argv: list[str], run: Run) -> str:
    args = [a for a in argv if not a.startswith(("train.resume=", "train.overwrite="))] + [
        "train.resume=true"
    ]
    launcher = f"torchrun --nproc_per_node={run.rt.world_size}" if run.rt.distributed else "python"
    return f"{launcher} train.py {shlex.join(args)}"


if __name__ == "__main__":
    run_cli(distributed.explain_hangs(main))
