"""The plan of a run: its final config, where it runs and what it starts from, settled in one place.

`run_dataset` gets the run's dataset ready (prepared on first use, once per machine under torchrun);
`plan_run` settles what the command line's config leaves open, in the order the code reads: the
checkpoint to resume or the pretrained model to start from (whose shape the model section follows),
the runtime and the process group, the vocabulary, and the checks that the model fits the data;
`compile_enabled` whether it compiles. training/run.py builds the run from the `Plan`;
dry_run/estimate.py's `plan_dry_run` plans one for the dry run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from common.errors import ConfigError, UserError
from data.dataset import META_FILE, Dataset
from data.recipes import FirstUse, ready_dataset
from data.tokenizers import describe, same
from model import GPTConfig
from model.config import model_problem
from runs.checkpoint import Checkpoint, find_last
from runs.config import Config, Request, TrainConfig
from runs.out_dir import holds_run
from runs.runtime import Ranks, Runtime, setup, torchrun_ranks

if TYPE_CHECKING:  # a run from pretrained weights imports it where it reads them
    from runs.pretrained import OtherFormat, Pretrained


@dataclass
class Plan:
    cfg: Config  # final: the model's shape and vocabulary are set
    rt: Runtime
    dataset: Dataset
    resume: Checkpoint | None = None  # OUT_DIR/last, with train.resume
    # train.init_from's model for a fresh run; a LoRA run's base
    pretrained: Pretrained | None = None
    # resumed: (key, checkpoint's, ours)
    changed: list[tuple[str, Any, Any]] = field(default_factory=list)


def run_dataset(request: Request) -> Dataset:
    """The dataset of the run `request` asks for, ready before the run is planned
    (`_first_use_per_machine` says how a first use prepares it)."""
    data = requested_config(request).data
    return ready_dataset(data.dataset, data.dir, first_use=_first_use_per_machine(torchrun_ranks()))


def requested_config(request: Request) -> Config:
    """The config the command line asks for, before the run is planned: request's, or a resume's
    (its checkpoint's, with the command line's overrides: training/resume.py's `resume_config`)
    where train.out_dir holds a checkpoint."""
    t = request.cfg.train
    if not (t.resume and holds_run(Path(t.out_dir))):
        return request.cfg
    from training.resume import resume_config  # resumed runs only

    return resume_config(request, find_last(t.out_dir))


def plan_run(request: Request, dataset: Dataset, other_format: OtherFormat | None = None) -> Plan:
    """The final config of a run on `dataset` (`run_dataset`'s) and what it needs before anything is
    built (see the module docstring); `other_format` reads the models train.init_from may name that
    are not ours (train.py hands in hf/'s)."""
    cfg, resume, pretrained, changed = starting_point(request, other_format)
    t = cfg.train  # a resume's: its checkpoint's, with the command line's overrides
    rt = one_count_when_compiled(setup(t.device, t.precision, cfg.model.n_embd, t.threads), t)
    # once the dataset is there: its preparation outlasts any collective
    rt.join(t.dist_timeout)  # torchrun's process group (alone: nothing to join)
    return Plan(
        fit_to_data(cfg, dataset, resume, pretrained), rt, dataset, resume, pretrained, changed
    )


def one_count_when_compiled(rt: Runtime, t: TrainConfig) -> Runtime:
    """rt with one CPU thread count for the whole run where torch.compile is on, as train.threads
    keeps one (every tuner of the run leaves it): the count the other processes' load leaves free
    at the start (every core on a quiet machine). Inductor builds its CPU kernels for the count
    they are compiled at, and Dynamo compiles the model again for every other count a tuner moves
    to: 30-60 s inside a training step, counted as training (issue 48)."""
    if rt.threads or rt.device.type != "cpu" or not compile_enabled(t.compile, rt.device):
        return rt
    from common.threads import ThreadTuner  # compiled CPU runs only

    # set to what the load leaves free (all cores: quiet); a load that comes later is not followed
    return dataclasses.replace(rt, threads=ThreadTuner(by_load=True).count)


def starting_point(
    request: Request, other_format: OtherFormat | None = None
) -> tuple[Config, Checkpoint | None, Pretrained | None, list[tuple[str, Any, Any]]]:
    """(config, the checkpoint it resumes, the pretrained model it starts from, what the config
    changes of the checkpoint's: `resume_changes`): train.resume's OUT_DIR/last, else
    train.init_from's model (whose shape the model section follows), read; a LoRA run's base, read
    again from where its checkpoint says it was trained (checked against the fingerprint it
    recorded)."""
    cfg = request.cfg
    resume = find_last(cfg.train.out_dir) if cfg.train.resume else None
    if resume is not None:  # the rule for resuming with changed values: resumed runs only
        from training.resume import resume_changes, resume_config

        cfg = resume_config(request, resume)
    pretrained = None
    changed = []
    # a fresh run: shape and weights of a pretrained model
    if cfg.train.init_from and resume is None:
        from runs.pretrained import load_pretrained  # only runs that start from a model

        pretrained = load_pretrained(cfg.train.init_from, other_format=other_format)
        cfg = follow_model(
            cfg, pretrained.model, request.origins, f"train.init_from {pretrained.where}"
        )
    if resume is not None:
        changed = resume_changes(resume, cfg)
    if cfg.lora is not None:
        problem = model_problem(cfg.model, cfg.lora)
        if problem:
            raise UserError(f"{problem}; remove them from lora.targets")
        if resume is not None:  # the base of the adapters: from where they were trained, checked
            from runs.pretrained import base_of

            pretrained = base_of(resume, other_format)
    return cfg, resume, pretrained, changed


def fit_to_data(
    cfg: Config, dataset: Dataset, resume: Checkpoint | None, pretrained: Pretrained | None
) -> Config:
    """cfg with the dataset's vocabulary (and document token), once the model it starts from is
    checked to fit the data: the same tokenizer (the checkpoint it resumes, else train.init_from's
    model; a LoRA run resumed: its checkpoint's, which is its base's)."""
    wanted = cfg.model.doc_mask and cfg.model.doc_token is None
    doc_token = document_token(dataset) if wanted else None
    theirs = dataset.meta.tokenizer_meta
    ours = (
        resume.tokenizer_meta() if resume is not None else pretrained and pretrained.tokenizer_meta
    )
    if (resume is not None or pretrained is not None) and (ours is None or not same(ours, theirs)):
        raise _another_tokenizer(dataset, resume, pretrained, ours)
    cfg = with_vocabulary(cfg, dataset.meta.vocab_size)
    if doc_token is not None:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, doc_token=doc_token))
    return cfg


def follow_model(cfg: Config, source: GPTConfig, origins: dict[str, str], where: str) -> Config:
    """cfg with the model of `source` (train.init_from): keys left unset follow it; keys set
    explicitly (`origins`) may lower block_size and set dropout and doc_mask; any other that differs
    is an error."""
    model = dataclasses.asdict(source)
    for name, theirs in dataclasses.asdict(source).items():
        key = f"model.{name}"
        if key not in origins:
            continue
        ours = getattr(cfg.model, name)
        same = ours == theirs or (
            name == "n_kv_head" and (ours or cfg.model.n_head) == source.kv_heads
        )
        if same or name in ("dropout", "doc_mask") or (name == "block_size" and ours < theirs):
            model[name] = ours
            continue
        allowed = " (it may only be lowered)" if name == "block_size" else ""
        raise ConfigError(
            f"{key}={ours} (in {origins[key]}) contradicts {where}, which has "
            f"{name}={theirs}{allowed}; the model's shape comes from the weights: remove it, or "
            "use a config that leaves it unset (like finetune_shakespeare)"
        )
    return dataclasses.replace(cfg, model=GPTConfig(**model))


def with_vocabulary(cfg: Config, vocab_size: int) -> Config:
    """cfg with the dataset's `vocab_size` where model.vocab_size is null (a larger, padded one
    stays)."""
    vocab = cfg.model.vocab_size
    if vocab is not None and vocab < vocab_size:
        raise UserError(
            f"model.vocab_size={vocab} is smaller than the dataset's vocabulary ({vocab_size}); "
            "remove it to use the dataset's"
        )
    return dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab or vocab_size)
    )


def _first_use_per_machine(ranks: Ranks) -> FirstUse:
    """How a run prepares a known dataset on first use (data/recipes.py's `ready_dataset`): under
    torchrun by local rank 0 of the machine while its other ranks wait for the files, before the
    process group starts (preparing FineWeb-Edu takes hours, longer than any collective should
    wait). With several machines it must be prepared beforehand: two machines sharing a filesystem
    would write the same files at once."""

    def first_use(folder: Path, prepare: Callable[[], object]) -> None:
        name = folder.name
        if ranks.world_size > ranks.local_world_size:
            raise UserError(
                f"dataset {name} is not prepared in {folder}; with several machines, prepare it "
                "before starting torchrun, on each machine (or once on a shared filesystem): "
                f"python prepare.py {name}"
            )
        beat = folder.parent / f".{name}.preparing"  # local rank 0 touches it while it prepares
        from training.torchrun import once_per_machine  # a first use only

        once_per_machine(ranks, folder / META_FILE, prepare, f"dataset {name}", beat)

    return first_use


def document_token(dataset: Dataset) -> int:
    """The token the dataset puts between documents (<|endoftext|>), for model.doc_mask."""
    eot = dataset.tokenizer.eot_token
    if eot is None:
        kind = dataset.meta.tokenizer_meta["kind"]
        raise UserError(
            "model.doc_mask=true needs documents separated by <|endoftext|>, but dataset "
            f"{dataset.name} has a {kind} tokenizer without one; use a BPE dataset or "
            "model.doc_mask=false"
        )
    return eot


def _another_tokenizer(
    dataset: Dataset, resume: Checkpoint | None, pretrained: Pretrained | None, ours: dict | None
) -> UserError:
    """The line for a model that starts from another tokenizer than the dataset's, naming both."""
    theirs = dataset.meta.tokenizer_meta
    if resume is not None:
        diff = next(k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k))
        return UserError(
            f"checkpoint {resume} was trained with another tokenizer (its {diff} differs from the "
            "dataset's); resume on the dataset it was trained on"
        )
    return UserError(
        f"train.init_from {pretrained.where} uses tokenizer {pretrained.tokenizer_about}, but "
        f"data.dataset {dataset.name} has {describe(theirs)}; train on data prepared with the "
        "model's tokenizer (for GPT-2: data.dataset=shakespeare, or python prepare.py NAME "
        "--tokenizer gpt2)"
    )


# -- compiling: whether the run compiles, and where the compiler keeps a CPU's kernels


def inductor_cache_per_cpu_kind() -> None:
    """Give CPU kernels built for an emulated older CPU (ATEN_CPU_CAPABILITY=avx2) a cache of their
    own: Inductor's cache does not tell them from native ones, and a native run that reuses them
    crashes (torch 2.13: "free(): invalid pointer"). TORCHINDUCTOR_CACHE_DIR, if set, is kept."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}_{capability.lower()}"


def compile_enabled(setting: str, device: torch.device) -> bool:
    """train.compile: auto turns torch.compile on for CUDA where Triton works (on a CPU it gained
    little next to its compile time: BENCHMARKS.md, "CPU precision and kernels"); true without
    Triton is refused."""
    setting = str(setting).lower()
    if device.type != "cuda":
        return setting == "true"
    if setting == "false":
        return False
    if not triton_works():
        if setting == "true":
            raise UserError(
                "train.compile=true needs Triton, which does not work here (not installed, native "
                "Windows, or a GPU older than compute capability 7.0); set train.compile=false"
            )
        return False
    return True


def triton_works() -> bool:
    """Whether torch.compile can generate GPU kernels here (the check torch's inductor itself
    makes)."""
    import torch.utils._triton

    return torch.utils._triton.has_triton()
