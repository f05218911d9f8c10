"""The dry run's report (dry_run/estimate.py works its figures out): an `Estimate`, every figure
of a planned run, written as the lines `python train.py CONFIG --dry-run` prints: the model, its
compute, the tokens, the memory (training's and the final eval's), the checkpoint, the time, and the
warnings the real run would give.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from common.files import size_text
from data.dataset import Meta
from dry_run.hardware import PROJECTION_MFU, projected_seconds
from dry_run.measure import Timing
from dry_run.memory import Memory, Params
from runs.config import Config
from training.optim import schedule_warning
from training.run import NONFINITE_FIX
from training.tracking import millions

CHINCHILLA_TOKENS_PER_PARAM = 20
SMALLER_BATCH = "lower train.batch_size (raise train.grad_accum)"  # memory that does not fit
INDENT = " " * 12  # the report's values start in this column
# PyTorch code the first steps page in on a CPU (dry_run/measure.py)
CPU_RUNTIME_BYTES = 15 * 2**20


@dataclass
class Estimate:
    """What the dry run found, every figure worked out before the report is written."""

    name: str  # the config and its overrides, for the first line
    cfg: Config  # as training/plan.py settles it
    meta: Meta | None  # the dataset's; None: not prepared yet
    device: str  # cpu | cuda | mps
    precision: str
    params: Params
    # model/local_attention.py's block and reach for the window (reach 0: no blocks)
    blocks: tuple[int, int]
    memory: Memory
    other: Memory | None  # the other precision's (fp32 <-> bf16) on a CPU or CUDA
    plain: Memory | None  # with train.activation_checkpointing: the same run's without it
    recompute: float  # the FLOPs activation checkpointing adds over a step's (0 without it)
    compiled: bool  # torch.compile on
    # bytes of memory free on the device here (None: not this machine's, or unknown)
    free: float | None
    disk_free: float | None  # bytes free in train.out_dir, where it exists
    # what the real run will do with what train.out_dir holds (None: nothing to say)
    held: str | None
    checkpoint: tuple[float, float]  # bytes of a checkpoint on disk: in all, of the weights
    final_eval: bool  # an exact val eval at the end
    # bytes at the peak of that eval (0: none); the run's peak where it is the larger
    eval_peak: float
    timing: Timing | None
    why_not: str | None  # why there is no timing
    unprepared: str = ""  # where train.py will prepare the dataset ("": it is prepared)

    @property
    def iterations(self) -> int:
        """Iterations the run will take: max_iters, or fewer where train.max_time ends it first,
        when its training seconds (`training_s`, those the time line shows) reach it."""
        t = self.cfg.train
        timing = self.timing
        if not t.max_time or timing is None or self.training_s(t.max_iters) <= t.max_time:
            return t.max_iters
        before = self.training_s(timing.after)
        if before >= t.max_time:
            return max(1, int(t.max_time / before * timing.after))
        return timing.after + int((t.max_time - before) / (timing.step_s * t.grad_accum))

    def training_s(self, iters: int) -> float:
        """Seconds of training for `iters` iterations: the steps before those timed as they took
        (the first, and beside a busy process the stalls before the thread tuner's choice), then
        the timed steps' median each."""
        timing = self.timing
        accum = self.cfg.train.grad_accum
        after = max(1, timing.after)
        if iters <= after:
            return iters * timing.before_s * accum / after
        return timing.before_s * accum + (iters - after) * timing.step_s * accum


def _wrapped(text: str) -> list[str]:
    """A continuation of the report's line, wrapped under its values' column."""
    return textwrap.wrap(text, 110, initial_indent=INDENT, subsequent_indent=INDENT)


def _duration(s: float) -> str:
    if s < 1:
        return "under 1 s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h" if s < 72 * 3600 else f"{s / 86400:.1f} days"


def report_lines(e: Estimate) -> list[str]:
    """The dry run's lines: model, compute, tokens, memory, checkpoint, speed and time."""
    lines = [f"dry run of {e.name}: nothing is trained or written", ""]
    if e.unprepared:
        lines += [f"dataset     {e.cfg.data.dataset} is {e.unprepared}"]
    lines += _model_lines(e) + _token_lines(e) + _memory_lines(e) + _time_lines(e)
    return lines + _warning_lines(e)


def _warning_lines(e: Estimate) -> list[str]:
    """What the real run warns about (a warmup as long as the run: training/optim.py's
    `schedule_warning`) or would stop on (a timed step train_step did not apply: its loss or
    gradient not finite, at the peak learning rate)."""
    lines = []
    warning = schedule_warning(e.cfg.optim, e.cfg.train)
    if warning:
        lines.append(f"warning     {warning} (the real run warns too)")
    if e.timing is not None and e.timing.nonfinite is not None:
        o = e.cfg.optim
        lines.append(
            f"warning     timed step {e.timing.nonfinite} was not finite at the peak learning rate "
            f"optim.lr={o.lr:g} (the real run's warmup rises to it over optim.warmup_iters="
            f"{o.warmup_iters}): THE REAL RUN WILL LIKELY STOP on a non-finite "
            f"loss or gradient. {NONFINITE_FIX}"
        )
    return lines


def _model_lines(e: Estimate) -> list[str]:
    m = e.cfg.model
    params = e.params
    tied = ", the LM head tied to the token embedding" if m.tie_embeddings else ""
    attention = 12 * m.n_layer * m.n_embd * params.span  # GPT.flops_per_token's
    per_weight = "6 x" if e.cfg.lora is None else "6 per trained, 4 per frozen one of"
    block, reach = e.blocks
    local = [f"a window of {m.window} tokens, in blocks of {block}"] if reach else []
    local += ["within documents"] if m.doc_mask else []
    lines = [
        f"model       {millions(params.total)} parameters: {millions(params.non_embedding)} "
        f"non-embedding + {millions(params.embedding)} embedding{tied}",
        *_wrapped(f"{m.describe()}; vocabulary {m.vocab_size:,}"),
        f"compute     {params.flops_per_token / 1e6:,.1f} MFLOP per token trained: {per_weight} "
        f"{params.matmul / 1e6:,.2f}M weights in matrix products + {attention / 1e6:,.1f}M in "
        "attention",
    ]
    if local:
        lines.append(
            f"            {' and '.join(local)}: attention scores for {params.span:,.0f} keys per "
            "query"
        )
    if e.cfg.lora is not None:
        lc = e.cfg.lora
        lines.append(
            f"lora        rank {lc.rank} on {', '.join(lc.targets)}: {params.trained / 1e6:,.3f}M "
            f"parameters train ({params.trained / params.total:.2%}); the base is frozen: no "
            "gradients or optimizer state, and 4 FLOPs per frozen weight instead of 6 (no weight "
            "gradient)"
        )
    return lines


def _token_lines(e: Estimate) -> list[str]:
    t = e.cfg.train
    meta = e.meta
    iters = e.iterations
    per_iter = e.cfg.tokens_per_iter
    total = per_iter * iters
    by = f"{iters:,} iterations" + (
        " (train.max_time ends it first)" if iters < t.max_iters else ""
    )
    if t.max_time and e.timing is None:
        by += f", or fewer: train.max_time={t.max_time:g}s"
    epochs = ""
    if meta is not None:
        epochs = (
            f" = {total / meta.train_tokens:,.2f} epochs of the {meta.train_tokens:,}-token train "
            "split"
        )
    return [
        f"tokens      {per_iter:,} per iteration x {by} = {total:,} tokens{epochs}",
        f"            {total / e.params.total:,.1f} tokens per parameter (Chinchilla-optimal is "
        "about "
        f"{CHINCHILLA_TOKENS_PER_PARAM})",
    ]


def _memory_lines(e: Estimate) -> list[str]:
    mem = e.memory
    cfg = e.cfg
    optimizer = "AdamW + Muon state" if e.params.muon else "AdamW state"
    lines = [
        f"memory      peak {size_text(mem.peak)} training on {mem.device} in {mem.precision}: "
        f"weights {size_text(mem.weights)} + gradients {size_text(mem.gradients)} + {optimizer} "
        f"{size_text(mem.optimizer)}",
        f"            + activations {size_text(mem.activations)} (micro-batch "
        f"{cfg.train.batch_size} x {cfg.model.block_size} tokens) + backward working set "
        f"{size_text(mem.backward)}"
        + (
            f"; plus ~{size_text(CPU_RUNTIME_BYTES)} of PyTorch code paged in"
            if mem.device == "cpu"
            else ""
        ),
    ]
    if e.other is not None:
        lines.append(f"            in {e.other.precision} instead: {size_text(e.other.peak)}")
    if e.compiled:
        lines.append(
            "            torch.compile on: counted as eager (compiled peaks measured within a few "
            "percent of eager on a CPU, plus the compiler's own memory)"
        )
    if e.plain is not None:
        lines.append(_checkpointing_line(e))
    if e.eval_peak:
        lines.append(_final_eval_line(e))
    if e.free is not None:
        fits = "fits" if max(mem.peak, e.eval_peak) < e.free else f"DOES NOT FIT: {SMALLER_BATCH}"
        if mem.peak < e.free <= e.eval_peak:
            fits = "DOES NOT FIT: the exact val eval at the end; set train.final_eval=false"
        if mem.peak >= e.free and not cfg.train.activation_checkpointing:
            fits += " or set train.activation_checkpointing=true"
        lines.append(f"            {size_text(e.free)} free here: {fits}")
    size, weights = e.checkpoint
    lines.append(
        f"checkpoint  {size_text(size)} on disk (weights {size_text(weights)} + optimizer state "
        f"{size_text(size - weights)}); best/ shares last/'s files"
    )
    if e.disk_free is not None:
        lines[-1] += f"; {size_text(e.disk_free)} free in {cfg.train.out_dir}"
    if e.held is not None:
        lines.append(f"out_dir     {e.held}")
    return lines


def _final_eval_line(e: Estimate) -> str:
    """The exact val eval at the end (train.final_eval): its peak, and whether it is the run's."""
    said = "the run's peak" if e.eval_peak > e.memory.peak else "below training's"
    return (
        "            the exact val eval at the end (train.final_eval): peak "
        f"{size_text(e.eval_peak)}, {said} (its tensors: glibc's malloc can keep up to as much "
        "again of what they freed, docs/training.md)"
    )


def _checkpointing_line(e: Estimate) -> str:
    """With train.activation_checkpointing: what it saves (against the same run without it) and
    costs."""
    saved = e.plain.peak - e.memory.peak
    share = e.recompute
    return (
        f"            activation checkpointing: {size_text(saved)} less than without it "
        f"({size_text(e.plain.peak)}); backward computes the blocks' forward again: +{share:.0%} "
        "FLOPs, counted in the time below"
    )


def _time_lines(e: Estimate) -> list[str]:
    m = e.cfg.model
    t = e.cfg.train
    timing = e.timing
    iters = e.iterations
    if timing is None:
        return [f"time        not measured: {e.why_not}", _gpu_line(e)]
    step = timing.step_s * t.grad_accum
    train_s = e.training_s(iters)
    evals = iters // t.eval_interval + 1 + (1 if iters % t.eval_interval else 0)
    eval_s = 2 * t.eval_iters * timing.forward_s
    exact = ""
    total = train_s + evals * eval_s
    if e.final_eval:
        final_s = e.meta.val_tokens * timing.forward_s / (t.batch_size * m.block_size)
        exact, total = f" + exact val eval {_duration(final_s)}", total + final_s
    per = f" ({t.grad_accum} micro-steps)" if t.grad_accum > 1 else ""
    threads = (
        f", {timing.threads} CPU thread{'s' if timing.threads > 1 else ''}"
        if e.device == "cpu"
        else ""
    )
    lines = [
        f"speed       {step * 1e3:,.1f} ms per iteration{per} on {e.device} in {e.precision} "
        f"(median of {timing.steps} steps after {timing.after}{threads}; the first took "
        f"{timing.first_s:.2f} s) = "
        f"{e.cfg.tokens_per_iter / step:,.0f} tokens/s",
        f"time        training {_duration(train_s)} + {evals} evals x {eval_s:.1f} s{exact} = "
        f"about {_duration(total)} (checkpoint writes not counted)",
    ]
    if e.compiled and e.device == "cpu":
        lines.append(
            f"{INDENT}torch.compile: the first step compiles (not training time); on a CPU "
            "compiled steps measured 0.95x eager's speed for the default model and 1.09x for 6 x "
            "384 x 256 (docs/training.md, Speed on a CPU): it pays for wide models over long runs"
        )
    if e.device != "cuda" and iters * step > 3600:  # a long run here: what a GPU would take
        lines.append(_gpu_line(e))
    return lines


def _gpu_line(e: Estimate) -> str:
    """The run's time on common GPUs (dry_run/hardware.py's `projected_seconds`)."""
    # activation checkpointing computes the blocks' forward again: time the MFU does not count
    flops = e.iterations * e.cfg.tokens_per_iter * e.params.flops_per_token * (1 + e.recompute)
    projected = [f"{gpu} {_duration(s)}" for gpu, s in projected_seconds(flops).items()]
    at = f"{flops:.2g} FLOPs at {PROJECTION_MFU:.0%} MFU of the bf16 peak"
    return f"on a GPU    {at}: " + ", ".join(projected)
