"""A training run: built from its plan, then its loop, phase by phase: a step, an eval, a
checkpoint, a stop.

Read `train` first: the loop with its phases headed, as in nanoGPT's train.py; each phase is a
function below. A step reads nothing back (the GPU never waits for the host): a step whose loss or
gradient is not finite is skipped on the device, and its flag is read back with the losses at log
steps, evals and stops, where `read_back` counts it against train.skip_nonfinite.
training/tracking.py shows and records; this decides.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.errors import UserError
from common.threads import ThreadTuner
from data.dataset import Dataset
from data.loader import TokenWindows
from model import GPT
from runs import checkpoint
from runs.checkpoint import Progress
from runs.config import Config
from runs.runtime import Runtime
from training.evaluation import draw_sample, estimate_loss, final_eval_wanted, sample_prompt
from training.optim import lr_factor, make_optimizers, schedule_progress, set_lr, step_unless
from training.plan import Plan, compile_enabled, inductor_cache_per_cpu_kind
from training.stopping import Clock, StopRequest, SyncedStop, resume_command
from training.tracking import Tracker, describe_run


@dataclass
class Run:
    cfg: Config  # final (training/plan.py)
    rt: Runtime
    dataset: Dataset
    splits: dict[str, TokenWindows]
    model: GPT  # the network (sharded in place under FSDP)
    # what forward passes call: the model or its DDP wrapper, compiled when asked
    forward: torch.nn.Module
    optimizers: list[torch.optim.Optimizer]
    scaler: torch.amp.GradScaler  # enabled for fp16 only; a pass-through otherwise
    progress: Progress
    byte_lengths: torch.Tensor | None = None  # UTF-8 bytes of each token id, for bits per byte
    lora_base: dict[str, str] | None = None  # a LoRA run: its base, as checkpoints record it
    # the CPU thread count of the training steps, timed as they run
    tuner: ThreadTuner | None = None
    # (iteration, [loss, gradient norm, applied]) not read back
    unread: list = field(default_factory=list)
    # a resumed run: what its config changes (training/resume.py's `resumed`), in words
    changed: str = ""
    # what the script plugged in (train.py: head scores, circuits through training), called in order
    callbacks: list[Callback] = field(default_factory=list)

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.train.out_dir)

    @property
    def micro_steps(self) -> int:
        return self.cfg.train.grad_accum // self.rt.world_size

    @property
    def compiled(self) -> bool:
        return hasattr(self.forward, "_orig_mod")  # torch.compile's wrapper


class Callback:
    """What a script plugs into the loop, as Lightning's callbacks: the core names none (train.py
    plugs in interp/'s head scores and circuits through training when the config asks). Each
    method does nothing unless a subclass overrides it; `log` shows and records (tracking.py)."""

    def on_eval(self, run: Run, log: Tracker, record: dict, last: bool) -> None:
        """After a finite eval's losses are printed, before its sample: add to `record` (its
        metrics.jsonl line), write lines, log to wandb."""

    def on_end(self, run: Run, log: Tracker) -> None:
        """After the last step and its eval, before the line that says how the run ended."""


# --- the loop ---


def train(run: Run, argv: list[str]) -> int:
    """Train until train.max_iters, train.max_time or a stop signal; returns the exit code."""
    cfg = run.cfg
    t = run.cfg.train
    p = run.progress
    check_before_training(run)
    describe_run(cfg, run.rt, run.model, run.dataset.meta, p, run.compiled, run.changed)
    log = Tracker(cfg, run.rt, p)
    clock = Clock(p.elapsed_s)
    # Ctrl-C and the other signals that end a job, and the clock, the same on every rank
    stop = StopRequest(verbose=run.rt.is_main)
    synced = SyncedStop(run.rt, stop, clock, sync_every=(cfg.log.interval, t.eval_interval))
    try:
        while True:
            # termination, the same on every rank: a signal, train.max_iters, train.max_time
            signum, elapsed = synced.now(p.iter)
            last = p.iter >= t.max_iters or elapsed >= (t.max_time or math.inf)
            evaluating = (last or p.iter % t.eval_interval == 0) and p.evaluated_at != p.iter

            # the steps' results read back at once: losses shown, non-finite steps counted
            if evaluating or signum or last or p.iter % cfg.log.interval == 0:
                read_back(run, log, elapsed)

            # the learning rate
            set_lr(run.optimizers, lr_factor(p.iter, schedule_progress(p, elapsed, t), cfg.optim))

            # once in a while: evaluate, write checkpoints, draw loss.png (the clock paused)
            if evaluating:
                with clock.paused():
                    p.elapsed_s = elapsed
                    record, improved, finite = evaluate(run, log, last)
                    if not finite:  # a diverged model never replaces a checkpoint
                        count_nonfinite_eval(run, log, record, last)
                    elif t.save:
                        save_checkpoint(run, log, improved)
                    log.plot(last)

            # a signal (Ctrl-C, SIGTERM): write a checkpoint, say how to resume, stop
            if signum:
                return stop_with_checkpoint(run, log, clock, argv, signum)
            if last:
                break

            # forward, backward, update, its results read back later
            run.unread.append((p.iter, timed_step(run, log, clock)))
            p.iter += 1
            log.step()
        for callback in run.callbacks:
            callback.on_end(run, log)
        log.finish(run.dataset.meta.val_tokens)
        return 0
    finally:
        log.close()


# --- building the run ---


def start_run(plan: Plan, callbacks: list[Callback] | None = None) -> Run:
    """Everything a run needs, built from its plan (see the module docstring), with the callbacks
    a script plugs in."""
    cfg = plan.cfg
    rt = plan.rt
    t = plan.cfg.train
    torch.manual_seed(t.seed)
    inductor_cache_per_cpu_kind()  # before torch's optimizers import the compiler, which reads it
    model = build_model(plan)
    base = None
    if cfg.lora is not None:  # what its checkpoints record of the base
        from runs.pretrained import lora_base

        base = lora_base(plan.pretrained)
    forward = model
    if rt.distributed:  # DDP's wrapper, or FSDP's shards in place
        from training.torchrun import wrap

        forward = wrap(model, cfg, rt)
    optimizers = make_optimizers(model, cfg.optim, rt.device)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.precision == "fp16")
    if compile_enabled(t.compile, rt.device):
        forward = torch.compile(forward, mode=t.compile_mode)
    lengths = plan.dataset.byte_lengths()
    lengths = torch.from_numpy(lengths).to(rt.device) if lengths is not None else None
    # the dry run's check too
    splits = plan.dataset.all_windows(cfg.model.block_size, rt.device, t.seed)
    run = Run(
        cfg, rt, plan.dataset, splits, model, forward, optimizers, scaler, Progress(), lengths, base
    )
    run.callbacks = list(callbacks or [])
    # optimizer and scaler state, progress and random generators (state.pt)
    if plan.resume is not None:
        # resumed runs only: what changed, the schedule over a new budget
        from training.resume import resumed

        run.progress, run.changed = resumed(plan, model, optimizers, scaler)
    # same bits each run
    run.tuner = rt.thread_tuner(start=run.progress.threads, steady_when_quiet=True)
    return run


def check_before_training(run: Run) -> None:
    """Check the out_dir (rank 0, the others wait) and the sample prompt before anything is
    written."""
    from runs.out_dir import check_out_dir

    if run.rt.is_main:
        trained = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
        check_out_dir(run.out_dir, run.cfg, trained)
    run.rt.barrier()  # the other ranks wait for rank 0's check
    # a prompt the vocabulary cannot encode stops here, not at the first sample
    if run.cfg.log.sample_every:
        sample_prompt(run.cfg, run.dataset.tokenizer)


def build_model(plan: Plan) -> GPT:
    """The network with its starting weights, whole (before FSDP shards it): the resumed
    checkpoint's, else train.init_from's, else initialised; with LoRA, the base's weights and
    adapters (model/lora.py)."""
    cfg = plan.cfg
    resume = plan.resume
    pretrained = plan.pretrained
    # read (their shapes checked) before any model is built
    weights = None
    where = None
    if resume is not None and cfg.lora is None:
        weights = resume.weights()
        where = resume.folder
    elif pretrained is not None:  # a fresh run's init_from, or a LoRA run's base
        weights = pretrained.weights_for(cfg.model)
        where = pretrained.where
    model = GPT(cfg.model).to(plan.rt.device)
    model.activation_checkpointing = cfg.train.activation_checkpointing
    if weights is not None:  # checked against the model as they load
        from runs.weight_checks import load_into

        load_into(model, weights, where)
    if cfg.lora is not None:
        from model.lora import add_lora  # LoRA runs only
        from runs.weight_checks import load_into

        add_lora(model, cfg.lora)
        if resume is not None:
            load_into(model, resume.adapters()[0], resume.folder, adapters=True)
    return model


# --- a step ---


def train_step(run: Run, it: int) -> torch.Tensor:
    """One iteration at the learning rates already set: [mean loss, gradient norm, counted] on the
    device, read back later (`read_back`). A step whose loss or gradient is not finite is not
    applied, on every rank alike, and counts as skipped (fp16: only for its loss; overflowing
    gradients are the loss scaler's)."""
    cfg = run.cfg
    rt = run.rt
    scaler = run.scaler
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(run.micro_steps):
        # micro-batch keys number the global sequence of micro-batches: the same data for any world
        # size
        key = it * cfg.train.grad_accum + micro * rt.world_size + rt.rank
        x, y = run.splits["train"].batch(key, cfg.train.batch_size)
        with (
            # gradients all-reduced over the ranks in the last micro-step's backward only
            rt.sync_gradients(run.forward, sync=micro == run.micro_steps - 1),
            rt.autocast(),
        ):
            loss = run.forward(x, y)[1] / run.micro_steps  # logits not kept: freed before backward
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    for opt in run.optimizers:
        scaler.unscale_(opt)
    grad_norm = torch.nn.utils.clip_grad_norm_(
        run.model.parameters(), cfg.optim.grad_clip or math.inf
    )
    # FSDP: a DTensor
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    # each rank's loss is its own (the gradients, all-reduced, are the same on all): applied on
    # every rank or on none
    loss_finite = rt.on_every_rank(torch.isfinite(loss_sum))
    apply = loss_finite & torch.isfinite(grad_norm)
    for opt in run.optimizers:
        step_unless(opt, ~apply)
    # every step: fp16 lowers its scale after non-finite gradients, and unscale_ needs it
    scaler.update()
    for opt in run.optimizers:
        opt.zero_grad(set_to_none=True)
    counted = loss_finite if scaler.is_enabled() else apply
    return torch.stack([loss_sum, grad_norm.float(), counted.float()])


def timed_step(run: Run, log: Tracker, clock: Clock) -> torch.Tensor:
    """`train_step` at this iteration, on a CPU at the thread count common/threads.py chooses; a
    compiled model's first step compiles it, timed apart."""
    if run.compiled and run.progress.iter == log.first[0]:
        return first_compiled_step(run, log, clock)
    with run.tuner.timed(run.progress.iter):
        return train_step(run, run.progress.iter)


def first_compiled_step(run: Run, log: Tracker, clock: Clock) -> torch.Tensor:
    """A compiled model's first step, which compiles it: timed on its own line, outside training
    time."""
    with clock.paused():
        start = time.perf_counter()
        results = train_step(run, run.progress.iter)
        run.rt.synchronize()
        seconds = time.perf_counter() - start
    log.write(
        f"compiled the model in {seconds:.1f}s (the first step; not counted as training time)"
    )
    log.last_log = (run.progress.iter + 1, clock.elapsed())
    return results


# --- non-finite steps: read back, counted against train.skip_nonfinite ---

NONFINITE_FIX = (
    "Lower optim.lr, raise optim.warmup_iters, or set train.skip_nonfinite=N to skip up to N such "
    "steps"
)


def read_back(run: Run, log: Tracker, elapsed: float) -> None:
    """Read the unread steps' results (one read-back); show the mean loss; count each step that was
    not applied, and past train.skip_nonfinite stop with one line."""
    if not run.unread:
        return
    its, values = zip(*run.unread)
    run.unread = []
    rows = torch.stack(values)
    loss_sum = run.rt.all_sum(rows[:, 0].sum()).item()  # over the ranks
    log.losses(its[-1] + 1, loss_sum, len(its), elapsed, run.optimizers[0].param_groups[0]["lr"])
    p = run.progress
    allowed = run.cfg.train.skip_nonfinite
    for it, (loss, grad_norm, counted) in zip(its, rows.tolist()):
        if counted:
            continue
        p.skipped_steps += 1
        if p.skipped_steps > allowed:
            raise UserError(
                f"non-finite loss or gradient at iteration {it} (loss {loss:.4g}, gradient norm "
                f"{grad_norm:.4g}); that step was skipped and training stopped at iteration "
                f"{p.iter}. Last good checkpoint: {last_good(run)}. {NONFINITE_FIX}"
            )
        log.write(f"iteration {it}: non-finite loss, step skipped ({p.skipped_steps}/{allowed})")


def count_nonfinite_eval(run: Run, log: Tracker, record: dict, last: bool) -> None:
    """An eval that is not finite (the weights diverged): no checkpoint, a skipped step; past
    train.skip_nonfinite, or at the end of the run, training stops."""
    p = run.progress
    allowed = run.cfg.train.skip_nonfinite
    p.skipped_steps += 1
    losses = f"train loss {record['train_loss']:.4g}, val loss {record['val_loss']:.4g}"
    if p.skipped_steps > allowed or last:
        ended = "the run ended on it" if p.skipped_steps <= allowed else "training stopped"
        raise UserError(
            f"the eval at iteration {p.iter} is not finite ({losses}): the model diverged, so no "
            f"checkpoint was written and {ended}. Last good checkpoint: {last_good(run)}. "
            f"{NONFINITE_FIX}"
        )
    log.write(
        f"iteration {p.iter}: eval not finite ({losses}), no checkpoint written "
        f"({p.skipped_steps}/{allowed})"
    )


def last_good(run: Run) -> str:
    """The checkpoint a run that diverged can go back to: last/ (never written from a non-finite
    eval)."""
    last = run.out_dir / "last"
    return str(last) if checkpoint.is_checkpoint(last) else "none"


# --- an eval ---


def evaluate(run: Run, log: Tracker, last: bool) -> tuple[dict, bool, bool]:
    """This eval, printed and recorded: the loss estimate, at the end the exact val loss
    (train.final_eval), what the callbacks add, a sample (log.sample_every); whether val improved
    (best/) and whether the losses are finite (if not, the model diverged: nothing more, and no
    checkpoint)."""
    cfg = run.cfg
    p = run.progress
    losses = estimate_loss(run.forward, run.splits, cfg, run.rt, run.byte_lengths)
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
    if finite and last and final_eval_wanted(cfg.train.final_eval, run.dataset.meta.val_tokens):
        record |= exact_val_loss(run)
    bpb = f", val bpb {record['val_bpb']:.3f}" if "val_bpb" in record else ""
    train_loss = losses["train"]
    val_loss = losses["val"]
    at = p.elapsed_s
    log.write(
        f"iter {p.iter}: train loss {train_loss:.4f}, val loss {val_loss:.4f}{bpb} ({at:.1f}s)"
    )
    for callback in run.callbacks if finite else []:
        callback.on_eval(run, log, record, last)
    sampling = cfg.log.sample_every and p.iter > 0 and (last or p.iter % cfg.log.sample_every == 0)
    if finite and sampling and runs_extra_forwards(run):
        record["sample"] = draw_sample(run.model, run.dataset.tokenizer, cfg, run.rt)
        log.write(f"sample at iteration {p.iter} (temperature 0.8, seed {cfg.train.seed}):")
        log.write(record["sample"].strip("\n") + "\n")
    log.eval(record)
    return record, improved, finite


def runs_extra_forwards(run: Run) -> bool:
    """Whether this process runs an eval's extra forwards (head scores, samples): rank 0; all under
    FSDP."""
    return run.rt.is_main or run.cfg.train.parallel == "fsdp"


def exact_val_loss(run: Run) -> dict:
    """The loss over every token of the val split (training/evaluation.py), all ranks together."""
    from training.evaluation import default_batch_size, evaluate_tokens

    cfg = run.cfg
    batch = default_batch_size(cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size)
    byte_lengths = (
        run.byte_lengths if run.byte_lengths is not None else torch.zeros(cfg.model.vocab_size)
    )
    result = evaluate_tokens(run.model, run.dataset.split("val"), byte_lengths, batch, rt=run.rt)
    out = {"final_val_loss": round(result.loss, 5), "final_val_tokens": result.tokens}
    return out | ({"final_val_bpb": round(result.bpb, 5)} if result.bytes else {})


# --- a checkpoint ---


def save_checkpoint(run: Run, log: Tracker, improved: bool) -> Path:
    """Write OUT_DIR/last with everything needed to resume, OUT_DIR/best when `improved`, and
    OUT_DIR/iter_N at an iteration of train.keep_iters (runs/checkpoint.py), saying so. Every rank
    calls it; rank 0 writes while the others wait."""
    # a resumed run goes on at the thread count the steps ran at
    run.progress.threads = run.tuner.count if run.tuner.enabled else 0
    keep = run.progress.iter in run.cfg.train.keep_iters
    path = checkpoint.save(
        run.out_dir,
        run.cfg,
        run.dataset.meta.tokenizer_meta,
        run.model,
        run.optimizers,
        run.scaler,
        run.progress,
        lora_base=run.lora_base,
        best=improved,
        keep=keep,
        writer=run.rt.is_main,
    )
    run.rt.barrier()  # no rank goes on before rank 0 has written it
    if keep:
        kept = run.out_dir / f"{checkpoint.KEPT}{run.progress.iter}"
        log.write(f"kept checkpoint {kept} (train.keep_iters)")
    return path


# --- a stop ---


def stop_with_checkpoint(run: Run, log: Tracker, clock: Clock, argv: list[str], signum: int) -> int:
    """A stop signal: write OUT_DIR/last (unless the weights diverged since the last eval), say how
    to resume, exit with 128 + the signal's number."""
    if not run.rt.all_finite(run.model.parameters()):
        log.write(
            f"stopped at iteration {run.progress.iter}; the weights are no longer finite (the run "
            "diverged since its last eval), so no checkpoint was written. Last good checkpoint: "
            f"{last_good(run)}",
            sys.stderr,
        )
        return 128 + signum
    with clock.paused():
        run.progress.elapsed_s = clock.elapsed()
        path = save_checkpoint(run, log, improved=False)
    log.write(f"stopped at iteration {run.progress.iter}; checkpoint in {path}", sys.stderr)
    log.write(f"resume with: {resume_command(argv, run.rt)}", sys.stderr)
    return 128 + signum
