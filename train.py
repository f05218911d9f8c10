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
Ctrl-C, SIGTERM or SIGHUP (a closed terminal; training/control.py lists the scheduler signals too) finishes
the step, writes a checkpoint and says how to resume. Output to a pipe or terminal that closed is dropped,
and training goes on. An eval whose loss is not finite writes no checkpoint and counts as a skipped step
(train.skip_nonfinite). Errors in the config, data or out_dir stop it before training with one line
(--debug shows the traceback).
"""

from __future__ import annotations

from common.errors import ConfigError, UserError, run_cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import math
import shlex
import sys
import textwrap

import torch

from data.prompts import encode_prompt, read_prompt
from interp.scores import flat_scores, score_heads, strongest_heads
from model import generate
from runs import checkpoint
from runs.config import CONFIG_DIR, Request, from_arguments, shipped_configs, to_yaml
from runs.out_dir import check_out_dir
from training import distributed, estimate
from training.control import Agreement, Clock, StopRequest
from training.evaluation import default_batch_size, evaluate_tokens, final_eval_wanted
from training.optim import lr_factor, schedule_progress, schedule_warning, set_lr
from training.plan import plan_run
from training.tracking import Tracker, check_wandb_login, read_metrics
from training.trainer import Run, estimate_loss, save_checkpoint, start_run, train_step


def main(argv: list[str]) -> int:
    request = parse_command_line(argv)
    if request is None:
        return 0
    run = start_run(plan_run(request))
    cfg, t, p = run.cfg, run.cfg.train, run.progress
    check_and_describe(run)
    log, stop, clock = Tracker(run), StopRequest(verbose=run.rt.is_main), Clock(p.elapsed_s)
    agreed = Agreement(run.rt, stop, clock, sync_every=(cfg.log.interval, t.eval_interval))
    try:
        while True:
            # termination, the same on every rank: a signal, train.max_iters, train.max_time
            signum, elapsed = agreed.now(p.iter)
            last = p.iter >= t.max_iters or elapsed >= (t.max_time or math.inf)
            evaluating = (last or p.iter % t.eval_interval == 0) and p.evaluated_at != p.iter

            # steps skipped for a non-finite loss or gradient: read back at log steps, evals and stops
            if evaluating or signum or last or p.iter % cfg.log.interval == 0:
                count_nonfinite(run, log)

            # the learning rate
            set_lr(run.optimizers, lr_factor(p.iter, schedule_progress(p.iter, elapsed, t), cfg.optim))

            # once in a while: evaluate, draw a sample, write checkpoints, draw loss.png (the clock stops)
            if evaluating:
                with clock.paused():
                    p.elapsed_s = elapsed
                    record, improved, finite = run_eval(run, log, last)
                    sampling = (
                        cfg.log.sample_every and p.iter > 0 and (last or p.iter % cfg.log.sample_every == 0)
                    )
                    if finite and sampling:
                        record["sample"] = draw_sample(run, log)
                    log.eval(record)
                    if not finite:  # a diverged model never replaces a checkpoint
                        count_nonfinite_eval(run, log, record, last)
                    elif t.save:
                        save_checkpoint(run, improved)
                    log.plot(last)

            # a signal (Ctrl-C, SIGTERM): write a checkpoint, say how to resume, stop
            if signum:
                return stop_with_checkpoint(run, log, clock, argv, signum)
            if last:
                break

            # forward, backward, update (not applied, on the device, if the loss or gradient is not finite),
            # on a CPU at the thread count the steps' times choose (common/threads.py)
            with run.tuner.timed(p.iter):
                loss, grad_norm, finite = train_step(run, p.iter)
            p.iter += 1

            # timing and logging (the host reads the losses back every log.interval iterations)
            log.step(p.iter, loss, grad_norm, finite, clock.elapsed())
        finish(run, log)
        return 0
    finally:
        log.close()
        distributed.shutdown(run.rt)


def parse_command_line(argv: list[str]) -> Request | None:
    """The config the command line asks for; None when it only asked for help, the config or a dry run."""
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
    request = from_arguments([a for a in argv if not a.startswith("-")])
    cfg = request.cfg
    if "--print-config" in flags:
        if cfg.train.init_from:
            print(f"# the model keys not set explicitly will follow train.init_from {cfg.train.init_from}")
        print(to_yaml(cfg), end="")
        return None
    if "--dry-run" in flags:
        print(estimate.dry_run(request))
        return None
    if cfg.log.wandb:
        check_wandb_login()
    return request


def usage() -> str:
    configs = "\n".join(
        textwrap.fill(about, 110, initial_indent=f"  {name:<26}", subsequent_indent=" " * 28)
        for name, about in shipped_configs()
    )
    return f"""usage: python train.py [CONFIG] [section.key=value ...] [--print-config] [--dry-run] [--debug]
       torchrun --nproc_per_node=N train.py [CONFIG] [section.key=value ...]

Train a GPT on a dataset, writing checkpoints and metrics to train.out_dir.

CONFIG is a YAML file, or the name of one shipped in {CONFIG_DIR.name}/ (default: shakespeare_char):
{configs}

A config has the sections model, data, train, optim and log (and lora, for LoRA fine-tuning). Every key,
its type and its default is documented in runs/config_schema.py (model keys in model/config.py, lora keys in
model/lora.py); --print-config shows them resolved.
Any key can be overridden as section.key=value (YAML syntax):

  python train.py shakespeare_char model.n_layer=6 optim.lr=1e-3 train.max_iters=5e3
  python train.py shakespeare_char train.device=cpu train.max_time=60 log.wandb=true
  python train.py shakespeare_char train.resume=true        # continue out_dir's last checkpoint

options:
  -h, --help        show this help and exit
  --print-config    print the resolved config and exit
  --dry-run         print what the run will cost (parameters, tokens, memory, time) and exit
  --debug           show the traceback of an error (also TINYGPT_DEBUG=1)"""


def check_and_describe(run: Run) -> None:
    """Check the out_dir before training (rank 0, the others wait) and the sample prompt; describe the run."""
    cfg, rt, model = run.cfg, run.rt, run.model
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if rt.is_main:
        check_out_dir(run.out_dir, cfg, trained)
    distributed.barrier(rt)
    if cfg.log.sample_every:  # a prompt the vocabulary cannot encode stops here, not at the first sample
        sample_prompt(run)
    if not rt.is_main:
        return
    mc, meta, every = (
        cfg.model,
        run.dataset.meta,
        model.num_params(non_embedding=False),
    )  # as --dry-run counts
    print(
        f"model: {every / 1e6:.2f}M parameters ({mc.describe()}); dataset {cfg.data.dataset}: "
        f"{meta.train_tokens:,} train / {meta.val_tokens:,} val tokens"
    )
    print(
        f"device {rt.device}, precision {rt.precision}, compile {'on' if run.compiled else 'off'}, "
        f"{torch.get_num_threads()} threads; batch {cfg.train.batch_size} x {mc.block_size} tokens x "
        f"{run.micro_steps} micro-step(s) x {rt.world_size} process(es) = {cfg.tokens_per_iter:,} "
        "tokens/iteration"
    )
    if schedule_warning(cfg.optim, cfg.train):
        print(f"warning: {schedule_warning(cfg.optim, cfg.train)}", file=sys.stderr)
    if cfg.train.init_from and not cfg.train.resume:
        print(f"starting from the weights of {cfg.train.init_from} (fresh optimizer, iteration 0)")
    if cfg.train.resume:
        p = run.progress
        print(
            f"resuming at iteration {p.iter:,} of {cfg.train.max_iters:,} from {run.out_dir / 'last'} "
            f"({p.elapsed_s:.1f}s of training so far, best val loss {p.best_val_loss:.4f})"
        )
    if cfg.lora is not None:
        total, lc = model.num_params(non_embedding=False), cfg.lora
        print(
            f"LoRA: rank {lc.rank}, alpha {lc.alpha:g} on {', '.join(lc.targets)}: {trained / 1e6:.3f}M "
            f"parameters train ({100 * trained / total:.2f}% of {total / 1e6:.2f}M); the base is frozen, "
            "checkpoints hold the adapters alone"
        )


def run_eval(run: Run, log: Tracker, last: bool) -> tuple[dict, bool, bool]:
    """This eval's metrics record, printed: the loss estimate, head scores (log.head_scores) and, at the end,
    the exact val loss (train.final_eval); whether val improved (the checkpoint becomes best/); and whether
    the losses are finite (if not, the model diverged: no scores, no exact loss, no checkpoint)."""
    cfg, p = run.cfg, run.progress
    losses = estimate_loss(run)
    finite = math.isfinite(losses["train"]) and math.isfinite(losses["val"])
    improved = finite and losses["val"] <= p.best_val_loss
    p.evaluated_at = p.iter
    if finite:
        p.best_val_loss = min(p.best_val_loss, losses["val"])
    record = {
        "iter": p.iter,
        "train_loss": round(losses["train"], 5),
        "val_loss": round(losses["val"], 5),
        **({"val_bpb": round(losses["val_bpb"], 5)} if "val_bpb" in losses else {}),
        "lr": run.optimizers[0].param_groups[0]["lr"],
        "tokens": p.iter * cfg.tokens_per_iter,
        "elapsed_s": round(p.elapsed_s, 3),
    }
    if finite and cfg.log.head_scores and forwards_here(run):
        record["heads"] = score_heads(run.model, run.splits["val"])
        log.log(p.iter, flat_scores(record["heads"]))
    if finite and last and final_eval_wanted(cfg.train.final_eval, run.dataset.meta.val_tokens):
        record |= exact_val_loss(run)
    bpb = f", val bpb {record['val_bpb']:.3f}" if "val_bpb" in record else ""
    log.write(
        f"iter {p.iter}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}{bpb} "
        f"({p.elapsed_s:.1f}s)"
    )
    if "heads" in record:
        log.write(f"  heads: {strongest_heads(record['heads'])}")
    return record, improved, finite


def forwards_here(run: Run) -> bool:
    """Whether this process runs the extra forward passes of an eval (head scores, samples): rank 0, or every
    rank under FSDP, where each forward gathers the weights from all of them."""
    return run.rt.is_main or run.cfg.train.parallel == "fsdp"


def exact_val_loss(run: Run) -> dict:
    """The loss over every token of the val split (training/evaluation.py), all ranks together."""
    cfg = run.cfg
    batch = default_batch_size(cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size)
    byte_lengths = run.byte_lengths if run.byte_lengths is not None else torch.zeros(cfg.model.vocab_size)
    result = evaluate_tokens(run.model, run.dataset.split("val"), byte_lengths, batch, rt=run.rt)
    out = {"final_val_loss": round(result.loss, 5), "final_val_tokens": result.tokens}
    return out | ({"final_val_bpb": round(result.bpb, 5)} if result.bytes else {})


def sample_prompt(run: Run) -> list[int]:
    """The ids of log.sample_prompt (default: a newline, or <|endoftext|> for BPE), as sample.py has them."""
    tokenizer = run.dataset.tokenizer
    return encode_prompt(
        read_prompt(run.cfg.log.sample_prompt, None, tokenizer), tokenizer, run.cfg.model.context_limit
    )


def draw_sample(run: Run, log: Tracker) -> str | None:
    """log.sample_tokens tokens from the model as it is now, printed: temperature 0.8, seeded by train.seed,
    in fp32 (as sample.py), after log.sample_prompt. None on ranks that run no forward (forwards_here)."""
    if not forwards_here(run):
        return None
    cfg, model, tokenizer = run.cfg, run.model, run.dataset.tokenizer
    generator = torch.Generator(device=run.rt.device).manual_seed(cfg.train.seed)
    idx = torch.tensor([sample_prompt(run)], device=run.rt.device)
    model.eval()
    tuner = run.rt.thread_tuner(tries=8)  # keeps train.threads
    tokens = generate(model, idx, cfg.log.sample_tokens, 0.8, None, None, generator, tuner=tuner)
    tokens = [t.item() for t in tokens]
    model.train()
    text = tokenizer.decode(idx[0].tolist()) + tokenizer.decode(tokens)
    log.write(f"sample at iteration {run.progress.iter} (temperature 0.8, seed {cfg.train.seed}):")
    log.write(text.strip("\n") + "\n")
    return text


NONFINITE_FIX = (
    "Lower optim.lr, raise optim.warmup_iters, or set train.skip_nonfinite=N to skip up to N such steps"
)


def last_good(run: Run) -> str:
    """The checkpoint a run that diverged can go back to: last/ (never written from a non-finite eval)."""
    last = run.out_dir / "last"
    return str(last) if (last / checkpoint.WEIGHTS).is_file() else "none"


def count_nonfinite(run: Run, log: Tracker) -> None:
    """Count the steps since the last look that were not applied for a non-finite loss or gradient; past
    train.skip_nonfinite, stop (their results are read back at log steps, evals and stops only)."""
    p, allowed = run.progress, run.cfg.train.skip_nonfinite
    for it, loss, grad_norm in log.nonfinite_steps():
        p.skipped_steps += 1
        if p.skipped_steps > allowed:
            raise UserError(
                f"non-finite loss or gradient at iteration {it} (loss {loss:.4g}, gradient norm "
                f"{grad_norm:.4g}); that step was skipped and training stopped at iteration {p.iter}. Last "
                f"good checkpoint: {last_good(run)}. {NONFINITE_FIX}"
            )
        log.write(f"iteration {it}: non-finite loss, step skipped ({p.skipped_steps}/{allowed})")


def count_nonfinite_eval(run: Run, log: Tracker, record: dict, last: bool) -> None:
    """An eval that is not finite (the weights diverged): no checkpoint; it counts as a skipped step, and
    past train.skip_nonfinite, or at the end of the run, training stops."""
    p, allowed = run.progress, run.cfg.train.skip_nonfinite
    p.skipped_steps += 1
    losses = f"train loss {record['train_loss']:.4g}, val loss {record['val_loss']:.4g}"
    if p.skipped_steps > allowed or last:
        ended = "the run ended on it" if p.skipped_steps <= allowed else "training stopped"
        raise UserError(
            f"the eval at iteration {p.iter} is not finite ({losses}): the model diverged, so no "
            f"checkpoint was written and {ended}. Last good checkpoint: {last_good(run)}. {NONFINITE_FIX}"
        )
    log.write(
        f"iteration {p.iter}: eval not finite ({losses}), no checkpoint written ({p.skipped_steps}/{allowed})"
    )


def weights_finite(run: Run) -> bool:
    """Whether every weight is finite, on every rank (one read-back)."""
    local = [w.to_local() if hasattr(w, "to_local") else w for w in run.model.parameters()]
    flag = torch.stack([w.detach().isfinite().all() for w in local]).all()
    return bool(distributed.on_every_rank(flag, run.rt).item())


def stop_with_checkpoint(run: Run, log: Tracker, clock: Clock, argv: list[str], signum: int) -> int:
    """A stop signal: write OUT_DIR/last (unless the weights diverged since the last eval), say how to
    resume, exit with 128 + the signal's number."""
    if not weights_finite(run):
        log.write(
            f"stopped at iteration {run.progress.iter}; the weights are no longer finite (the run diverged "
            f"since its last eval), so no checkpoint was written. Last good checkpoint: {last_good(run)}",
            sys.stderr,
        )
        return 128 + signum
    with clock.paused():
        run.progress.elapsed_s = clock.elapsed()
        path = save_checkpoint(run, improved=False)
    log.write(f"stopped at iteration {run.progress.iter}; checkpoint in {path}", sys.stderr)
    log.write(f"resume with: {resume_command(argv, run)}", sys.stderr)
    return 128 + signum


def finish(run: Run, log: Tracker) -> None:
    """The curves of the head scores (log.head_scores) and the line that says how the run ended."""
    p, out_dir, last = run.progress, run.out_dir, log.last_record
    if not run.rt.is_main:
        return
    if run.cfg.log.head_scores:
        from interp.plots import plot_training_curves  # matplotlib only when plotting

        plot_training_curves(read_metrics(log.metrics_path), out_dir / "heads_training.png")
    exact, n_val = "", run.dataset.meta.val_tokens
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
    here, wall = p.iter - log.first[0], f"{log.wall():.1f}s wall"
    if run.cfg.train.resume:  # the totals are the run's; what this process did is its part since then
        wall = (
            f"resumed at iteration {log.first[0]}: {here} here in {p.elapsed_s - log.first[1]:.1f}s, {wall}"
        )
    log.write(
        f"done: {p.iter} iterations in {p.elapsed_s:.1f}s of training ({wall}), best val "
        f"loss {p.best_val_loss:.4f} (estimated){exact}{where}"
    )


def resume_command(argv: list[str], run: Run) -> str:
    args = [a for a in argv if not a.startswith(("train.resume=", "train.overwrite="))] + [
        "train.resume=true"
    ]
    launcher = f"torchrun --nproc_per_node={run.rt.world_size}" if run.rt.distributed else "python"
    return f"{launcher} train.py {shlex.join(args)}"


if __name__ == "__main__":
    interrupted = "interrupted before training began; no checkpoint was written or changed"
    run_cli(distributed.explain_hangs(main), interrupted=interrupted, keep_going=True)
