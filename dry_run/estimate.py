"""What a run will cost, before it starts: parameters, FLOPs, tokens, memory, checkpoint size and
time.

`python train.py CONFIG --dry-run` prints `dry_run(cfg)`: parameters (embedding and the rest),
training FLOPs per token, tokens per iteration and in all, epochs, tokens per parameter against
Chinchilla's ~20, predicted peak training memory (dry_run/memory.py), checkpoint size, and the time
of a few real steps on this machine (dry_run/measure.py) projected over the run (or, for a CUDA
config on a machine without one, the time on common GPUs from FLOPs at a stated MFU). The run is
planned as training does it (`plan_dry_run`, with training/plan.py's functions), on the dataset
`dataset_for_dry_run` gives and on the device and in the precision
runs/runtime.py chooses, and `check_as_the_run_does` first makes the real run's checks with its
functions, so that what the run would refuse the dry run refuses in the same line. The memory is
training's and the final exact eval's, the larger the run's peak. `_estimate` works the figures
out, dry_run/report.py writes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from common import locks
from common.errors import UserError
from common.files import check_not_links
from data.dataset import LOCK, META_FILE, Dataset, dataset_folder
from data.recipes import recipe_vocab_size, recipes
from dry_run.measure import Timing, time_steps
from dry_run.memory import (
    checkpoint_bytes,
    count_params,
    final_eval_memory,
    memory,
    recompute_share,
    saved_params,
)
from dry_run.report import Estimate, report_lines
from model.local_attention import block_layout
from runs.checkpoint import OUT_DIR_ADVICE, Checkpoint
from runs.config import Config, Request
from runs.out_dir import check_room, held, held_advice, holds_run
from runs.pretrained import OtherFormat, Pretrained
from runs.runtime import Runtime, planned
from training.evaluation import default_batch_size, final_eval_wanted, sample_prompt
from training.plan import (
    Plan,
    compile_enabled,
    fit_to_data,
    one_count_when_compiled,
    requested_config,
    starting_point,
    with_vocabulary,
)
from training.run import start_run
from training.tracking import check_wandb_login


def dry_run(request: Request, other_format: OtherFormat | None = None) -> str:
    """The dry run's report: nothing is trained or written (`dataset_for_dry_run`,
    then `plan_dry_run`; `other_format` as training/plan.py's `plan_run` takes it)."""
    data = requested_config(request).data  # a resume's: its checkpoint's
    with dataset_for_dry_run(data.dataset, data.dir) as dataset:
        plan = plan_dry_run(request, dataset, other_format)
        check_as_the_run_does(plan)
        return "\n".join(report_lines(_estimate(request, plan)))


def check_as_the_run_does(plan: DryRunPlan) -> None:
    """The checks the real run makes before it trains, by the same functions, so that the dry run
    refuses what the run refuses in the same line: splits long enough for block_size, the sample
    prompt, the wandb login, symbolic links and room in the out_dir (what it holds is reported
    instead: `_held_run`; whether it is writable and free of another run's lock are not checked:
    that writes)."""
    cfg = plan.cfg
    out_dir = Path(plan.cfg.train.out_dir)
    if cfg.log.wandb:
        check_wandb_login()
    if out_dir.is_dir():  # the room for checkpoints where train.overwrite would not free some first
        check_not_links(out_dir, ("last", "best"), OUT_DIR_ADVICE)
        if not (cfg.train.overwrite and held(out_dir)):
            check_room(out_dir, cfg, count_params(cfg.model, cfg.optim.name, cfg.lora).trained)
    if plan.dataset is None:  # from the hub, not prepared: nothing to check it against yet
        return
    plan.dataset.all_windows(cfg.model.block_size, plan.rt.device, cfg.train.seed)
    if cfg.log.sample_every:
        sample_prompt(cfg, plan.dataset.tokenizer)


def _estimate(request: Request, plan: DryRunPlan) -> Estimate:
    """Count the planned run's parameters and memory, and time a few real steps where it can."""
    cfg = plan.cfg
    device = plan.rt.device.type
    precision = plan.rt.precision
    t = cfg.train
    meta = plan.dataset.meta if plan.dataset is not None else None
    params = count_params(cfg.model, cfg.optim.name, cfg.lora)
    mem = memory(cfg, precision, device, params)
    other = "fp32" if precision in ("bf16", "fp16") else "bf16"
    other_mem = memory(cfg, other, device, params) if device in ("cpu", "cuda") else None
    plain = None
    recompute = 0.0
    if t.activation_checkpointing:
        unchecked = dataclasses.replace(
            cfg, train=dataclasses.replace(t, activation_checkpointing=False)
        )
        plain = memory(unchecked, precision, device, params)
        recompute = recompute_share(cfg.model, params)
    blocks = block_layout(cfg.model.block_size, cfg.model.window)
    ckpt = checkpoint_bytes(cfg, params), 4 * saved_params(cfg, params)
    final_eval = meta is not None and final_eval_wanted(t.final_eval, meta.val_tokens)
    eval_peak = 0.0
    if final_eval:  # the batch training/run.py's exact_val_loss takes
        batch = default_batch_size(t.batch_size, cfg.model.block_size, cfg.model.vocab_size)
        eval_peak = final_eval_memory(cfg, precision, device, batch, params)
    free = _available_bytes(device) if plan.present else None
    out_dir = Path(t.out_dir)
    disk_free = shutil.disk_usage(out_dir).free if out_dir.exists() else None
    held_line = _held_run(out_dir, request.cfg.train.resume, t.overwrite)  # the plan starts afresh
    timing, why_not = _timed_steps(plan, fits=(free or float("inf")) >= max(mem.peak, eval_peak))
    return Estimate(
        _config_named(request),
        cfg,
        meta,
        device,
        precision,
        params,
        blocks,
        mem,
        other_mem,
        plain,
        recompute,
        plan.compiled,
        free,
        disk_free,
        held_line,
        ckpt,
        final_eval,
        eval_peak,
        timing,
        why_not,
        _unprepared(plan),
    )


def _config_named(request: Request) -> str:
    """The config the dry run is of, for its first line: the file, and the overrides given (listed
    where they are few, else counted: a model changed by eight of them is not "the default")."""
    given = [s for s in dict.fromkeys(request.origins.values()) if s.startswith("override ")]
    name = request.name
    if request.cfg.train.resume:  # the checkpoint's config, not the file's (training/resume.py)
        name = f"resuming {Path(request.cfg.train.out_dir) / 'last'}"
        given = [
            s
            for s in given
            if not s.startswith(("override train.resume=", "override train.out_dir="))
        ]
    listed = " ".join(s.removeprefix("override ") for s in given)
    if not given:
        return name
    if len(listed) <= 60:
        return f"{name} with {listed}"
    return f"{name} with {len(given)} overrides"


def _timed_steps(plan: DryRunPlan, fits: bool) -> tuple[Timing | None, str | None]:
    """A few real steps of the planned run (one micro-batch each, nothing saved), timed; or why
    they cannot run here."""
    cfg = plan.cfg
    t = plan.cfg.train
    if not plan.present:
        return None, f"train.device={t.device} but no CUDA GPU is visible here"
    if plan.dataset is None:
        return (
            None,
            f"dataset {cfg.data.dataset} is not prepared (train.py prepares it on first use)",
        )
    if not fits:
        return None, "the predicted memory does not fit in what is free here"
    steps = dataclasses.replace(cfg, train=dataclasses.replace(t, grad_accum=1, save=False))
    return time_steps(start_run(Plan(steps, plan.rt, plan.dataset, None, plan.pretrained))), None


def _held_run(out_dir: Path, resume: bool, overwrite: bool) -> str | None:
    """What the real run will do with what out_dir holds, where that matters (runs/out_dir.py
    decides it)."""
    if resume and holds_run(out_dir):
        return (
            f"{out_dir} holds a checkpoint: the real run continues it (this estimate is for the "
            "whole run)"
        )
    if resume:
        return (
            f"{out_dir} holds no checkpoint: THE REAL RUN WILL REFUSE train.resume=true; remove it"
        )
    what = held(out_dir)
    if what is None:
        return None
    if overwrite:
        return f"{out_dir} holds {what}: the real run deletes it first (train.overwrite=true)"
    return f"{out_dir} already holds {what}: THE REAL RUN WILL REFUSE IT; {held_advice(what)}"


def _unprepared(plan: DryRunPlan) -> str:
    """What the report says of a dataset that is not prepared yet ('' when it is):
    `dataset_for_dry_run` gave none (from the hub), or a copy in a temporary folder."""
    folder = dataset_folder(plan.cfg.data.dataset, plan.cfg.data.dir)
    if plan.dataset is not None and plan.dataset.folder == folder:
        return ""
    how = (
        "streamed from the hub"
        if plan.dataset is None
        else "measured here on a temporary copy, deleted"
    )
    return f"not prepared yet: train.py prepares it in {folder} on first use ({how})"


def _available_bytes(device: str) -> float | None:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# --- the dry run's plan ---


@dataclass
class DryRunPlan:
    """A run planned as `plan_run` plans it, without joining a process group or resuming (the dry
    run's): what it would train, on what, and where."""

    cfg: Config  # final where the dataset is prepared (else model.vocab_size must be set)
    # the device and precision runs/runtime.py chooses (`planned`: taken where it is here)
    rt: Runtime
    # `dataset_for_dry_run`: None when not prepared and from the hub
    dataset: Dataset | None
    pretrained: Pretrained | None  # train.init_from's model, read
    present: bool  # the device is here (a CUDA config on a machine without a GPU: False)
    compiled: bool  # torch.compile on (train.compile on this device)


def plan_dry_run(
    request: Request, dataset: Dataset | None, other_format: OtherFormat | None = None
) -> DryRunPlan:
    """The run `request` asks for, on `dataset` (`dataset_for_dry_run`), planned
    on the device runs/runtime.py chooses for it, where it is here: nothing is written. A resume
    is planned from its checkpoint's config and checked as the real run checks it
    (`starting_point`), then costed as a run from its start (the estimate is for the whole run)."""
    resume = request.cfg.train.resume and holds_run(Path(request.cfg.train.out_dir))
    # no checkpoint to resume: costed afresh (the dry run says the real run will refuse it)
    planned_as = request if resume else _fresh(request)
    cfg, ckpt, pretrained, _ = starting_point(planned_as, other_format)
    cfg = _fit_for_dry_run(cfg, dataset, pretrained, ckpt)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, resume=False))
    t = cfg.train
    rt, present = planned(t.device, t.precision, cfg.model.n_embd, t.threads)
    rt = one_count_when_compiled(rt, t)
    return DryRunPlan(cfg, rt, dataset, pretrained, present, compile_enabled(t.compile, rt.device))


def _fresh(request: Request) -> Request:
    """request with train.resume=false."""
    return dataclasses.replace(
        request,
        cfg=dataclasses.replace(
            request.cfg, train=dataclasses.replace(request.cfg.train, resume=False)
        ),
    )


def _fit_for_dry_run(
    cfg: Config, dataset: Dataset | None, pretrained: Pretrained | None, resume: Checkpoint | None
) -> Config:
    """The dry run's `fit_to_data` (a resume's tokenizer checked against the data's). Without a
    dataset (one from the hub, not prepared), the vocabulary is its recipe's tokenizer's (bpe:N,
    GPT-2's), else model.vocab_size, which must then be set."""
    if dataset is not None:
        return fit_to_data(cfg, dataset, resume, pretrained)
    vocab = recipe_vocab_size(cfg.data.dataset)
    if vocab is not None:
        cfg = with_vocabulary(cfg, vocab)
    elif cfg.model.vocab_size is None:
        raise UserError(
            f"dataset {cfg.data.dataset} is not prepared, so its vocabulary is unknown; set "
            "model.vocab_size for the dry run, or prepare the dataset first"
        )
    if cfg.model.doc_mask and cfg.model.doc_token is None:  # its id changes no cost: any will do
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, doc_token=0))
    return cfg


@contextlib.contextmanager
def dataset_for_dry_run(name: str, data_dir: str | Path | None = None) -> Iterator[Dataset | None]:
    """The dry run's `ready_dataset`, which writes nothing where the user looks: the prepared
    dataset; else, when its text is here (seconds), one prepared in a temporary folder deleted when
    the block ends (its `Dataset.folder` is then not `dataset_folder`'s: the caller says so); None
    when it is not prepared and would stream from the hub (hours: train.py prepares it on first use)
    or is not known."""
    if (dataset_folder(name, data_dir) / META_FILE).is_file():
        yield Dataset.open(name, data_dir)
        return
    from data.prepare import prepare_dataset
    from data.sources import HFText

    recipe = recipes().get(name)
    if recipe is None or isinstance(recipe.source, HFText):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="tinygpt-dry-run-") as temporary:
        print(f"preparing dataset {name} in a temporary folder for the dry run", file=sys.stderr)
        prepare_dataset(Path(temporary) / name, recipe)
        try:
            yield Dataset.open(name, temporary)
        finally:
            # the reader's lock, held for the process otherwise
            locks.release(Path(temporary) / name / LOCK)
