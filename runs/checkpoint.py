"""Checkpoints you can trust: written and read in this one module, whole, and without unpickling.

OUT_DIR/last/ and OUT_DIR/best/ each hold model.safetensors (the weights, whole; a tied LM head left
out) or for a LoRA run adapters.safetensors (the adapters, their base in its metadata), config.yaml,
the tokenizer's tinygpt_tokenizer.json, and state.pt: what a run needs to go on (`TrainState`).
`save` writes a run's checkpoint: common/files.py's `atomic_folder` swaps a flushed temporary folder
in by renames, so a crash leaves NAME or .NAME.old complete, and `find` takes either; best/ shares
last/'s files by hard links. One format for one process, DDP and FSDP (gathered whole; rank 0
writes), so a run saved on 8 GPUs resumes on 1. Reading: `find` gives a `Checkpoint` whose files are
read on demand, each checked first (runs/weight_checks.py, runs/state_checks.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shutil
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from common.errors import UserError, first_line
from data.tokenizers import METADATA_FILE, check_meta
from runs.config_schema import Config, config_from_data, problems, to_yaml

WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"
TOKENIZER = METADATA_FILE
# a LoRA run's checkpoint: the adapters alone, and where its base is
ADAPTERS = "adapters.safetensors"
STATE = "state.pt"
OUT_DIR_ADVICE = "choose another train.out_dir"
KEPT = "iter_"  # OUT_DIR/iter_N: the checkpoint of iteration N, kept (train.keep_iters)


# --- what state.pt holds ---


@dataclass
class Progress:
    """How far a run has come: what a checkpoint's state.pt records besides optimizer and RNG
    state."""

    iter: int = 0
    best_val_loss: float = math.inf
    elapsed_s: float = 0.0  # training seconds (evals and checkpoints excluded)
    skipped_steps: int = 0  # steps skipped for a non-finite loss (train.skip_nonfinite)
    evaluated_at: int = -1  # the iteration of the last eval, so a resumed run does not repeat it
    wandb_id: str | None = None
    # the CPU thread count the steps ran at (common/threads.py): a resumed run goes on there
    threads: int = 0
    # where a run resumed with another budget took its schedule up (training/resume.py's
    # `schedule_note`): the iteration, the training seconds and the share of the schedule done there
    # (0, 0, 0: from the start)
    schedule_iter: int = 0
    schedule_elapsed: float = 0.0
    schedule_done: float = 0.0


@dataclass
class TrainState:
    """A run's state.pt (see the module docstring)."""

    progress: Progress
    rng: dict[str, Any]  # `rng_state`
    optimizer: dict  # the optimizers' state keyed by parameter name, whole
    scaler: dict | None = None  # GradScaler's (fp16 runs)
    tokens: int = 0  # iterations x tokens per iteration: for people reading the file

    @classmethod
    def capture(
        cls,
        progress: Progress,
        tokens_per_iter: int,
        model: torch.nn.Module,
        optimizers: list[torch.optim.Optimizer],
        scaler: torch.amp.GradScaler,
    ) -> TrainState:
        """The state of a run now (a copy of its progress). Every rank calls it (training/run.py's
        `save_checkpoint` says in which order under FSDP)."""
        return cls(
            dataclasses.replace(progress),
            rng_state(),
            optimizer_state(model, optimizers),
            scaler.state_dict() if scaler.is_enabled() else None,
            progress.iter * tokens_per_iter,
        )

    def to_dict(self) -> dict[str, Any]:
        """What state.pt holds."""
        return {
            **dataclasses.asdict(self.progress),
            "tokens": self.tokens,
            "rng": self.rng,
            "scaler": self.scaler,
            "optimizer": self.optimizer,
        }


# --- writing ---


def save(
    out_dir: Path,
    cfg: Config,
    tokenizer_meta: dict,
    model: torch.nn.Module,
    optimizers: list[torch.optim.Optimizer],
    scaler: torch.amp.GradScaler,
    progress: Progress,
    lora_base: dict[str, str] | None = None,
    best: bool = False,
    keep: bool = False,
    writer: bool = True,
) -> Path:
    """Write OUT_DIR/last with everything a run needs to resume, and copy it to OUT_DIR/best when
    `best`, to OUT_DIR/iter_N when `keep`. Under torchrun every rank calls it and helps gather the
    full state; rank 0 (`writer`) writes. FSDP gathers the weights first: that leaves the
    parameters resharded, which gathering the optimizer state needs (torch's get_state_dict orders
    them so too)."""
    weights = model_weights(model)
    state = TrainState.capture(progress, cfg.tokens_per_iter, model, optimizers, scaler)
    if writer:
        write_checkpoint(out_dir, "last", weights, cfg, tokenizer_meta, state, lora_base)
        if best:
            copy_checkpoint(out_dir, "last", "best")
        if keep:
            copy_checkpoint(out_dir, "last", f"{KEPT}{progress.iter}")
    return Path(out_dir) / "last"


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights to save, whole, as contiguous CPU tensors named as in GPT (no wrapper prefixes),
    without the tied copy of the embedding. Under FSDP every rank must call it; only rank 0 gets the
    tensors."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=whole_state_options())
    # a tied head is the embedding itself: safetensors refuses two names for one storage, and
    # loading ties them again
    if getattr(getattr(model, "config", None), "tie_embeddings", True):
        state.pop("lm_head.weight", None)
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def write_checkpoint(
    out_dir: Path | str,
    name: str,
    weights: dict[str, torch.Tensor],
    cfg: Config,
    tokenizer_meta: dict,
    train_state: TrainState | None = None,
    base: dict[str, str] | None = None,
) -> Path:
    """Write checkpoint OUT_DIR/NAME atomically: the weights (`model_weights`), config and tokenizer
    metadata, and with a train_state (`TrainState.capture`) state.pt. With `base` (`lora_base`: a
    LoRA run) the adapters alone, with their base recorded. Under torchrun rank 0 alone calls it,
    once every rank has helped gather the weights and the train state."""
    out_dir = Path(out_dir)
    saved = weights
    if base is not None:  # a LoRA run: its adapters alone
        from model.lora import adapter_weights

        saved = adapter_weights(weights)
    # asked of the disk before anything is written: a full disk fails here, last/ untouched
    need = _tensor_bytes([saved, train_state.to_dict() if train_state is not None else None])
    from common import json_text  # writing only: reading a model needs none of it
    from common.files import atomic_folder, save_tensors

    with atomic_folder(out_dir, name, "checkpoint", OUT_DIR_ADVICE, need) as tmp:
        tmp.mkdir()
        if base is not None:
            save_tensors(saved, tmp / ADAPTERS, metadata={"format": "pt", **base})
        else:
            save_tensors(saved, tmp / WEIGHTS, metadata={"format": "pt"})
        (tmp / CONFIG).write_text(to_yaml(cfg))
        (tmp / TOKENIZER).write_text(json_text.dumps(tokenizer_meta, indent=1))
        if train_state is not None:
            save_state(train_state.to_dict(), tmp / STATE)
    return out_dir / name


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in a nest of dicts, lists and tuples (what a checkpoint takes on
    disk)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(map(_tensor_bytes, obj.values()))
    if isinstance(obj, (list, tuple)):
        return sum(map(_tensor_bytes, obj))
    return 0


def copy_checkpoint(out_dir: Path | str, src: str, dst: str) -> Path:
    """Make checkpoint DST a copy of SRC (hard links where the filesystem allows), atomically."""
    out_dir = Path(out_dir)
    from common.files import atomic_folder

    with atomic_folder(out_dir, dst, "checkpoint", OUT_DIR_ADVICE) as tmp:
        # linked, best/ costs no disk while it is last/; last/ is replaced, never written in place
        shutil.copytree(out_dir / src, tmp, copy_function=_link_or_copy)
    return out_dir / dst


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def save_state(state: dict, path: Path) -> None:
    """torch.save(state, path), failing with the OSError of the write that failed."""
    with open(path, "wb") as f:
        recorded = _Recorded(f)
        try:
            torch.save(state, recorded)
        except RuntimeError:
            if recorded.error is None:
                raise
            raise recorded.error from None


class _Recorded:
    """A file for torch.save that keeps the OSError of a failed write: torch reports it only as a
    RuntimeError ("unexpected pos ...") without the reason."""

    def __init__(self, f):
        self.f = f
        self.error = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def optimizer_state(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict:
    """The optimizers' state keyed by parameter name, whole (FSDP: gathered; every rank calls
    it)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizers, options=whole_state_options())


def whole_state_options():
    """torch.distributed.checkpoint's options for full (unsharded) state dicts, weights' or
    optimizers': under torchrun gathered to rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return StateDictOptions(full_state_dict=True, cpu_offload=distributed)


def rng_state() -> dict[str, Any]:
    """Every random generator training touches, as tensors and plain numbers
    (weights_only-loadable). On CUDA, the generator of this process's device only: every rank seeds
    its device alike and draws alike, and a run resumed where fewer GPUs are visible has no
    generators for the others."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    # the key array as a tensor: weights_only loading takes tensors and plain numbers, not arrays
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return state


# --- reading ---


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder (OUT_DIR/last, OUT_DIR/best, or a copy elsewhere); its files are read on
    demand."""

    folder: Path

    def __str__(self) -> str:
        return str(self.folder)

    # a path wherever one is taken: Path(ckpt), open(ckpt / ...) through .folder
    def __fspath__(self) -> str:
        return str(self.folder)

    @property
    def is_lora(self) -> bool:
        return (self.folder / ADAPTERS).is_file()

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights, their shapes checked against config.yaml's model (from the header) first."""
        model = self.config().model
        if (self.folder / WEIGHTS).is_file():
            from runs.weight_checks import check_weights_file

            check_weights_file(self.folder / WEIGHTS, model)
        return self._read(WEIGHTS, lambda path: load_file(str(path)), *_DAMAGED_WEIGHTS)

    def adapters(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """A LoRA checkpoint's adapters, their names and shapes checked against config.yaml's lora
        section, and what it records of their base (runs/pretrained.py's `lora_base`)."""
        cfg = self.config()
        if cfg.lora is None:
            raise UserError(
                f"{self.folder / CONFIG} has no lora section, but the checkpoint holds LoRA "
                "adapters"
            )

        def read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
            with safe_open(str(path), framework="pt") as f:
                base = f.metadata() or {}
                if not {"base", "base_sha256"} <= set(base):
                    raise ValueError(
                        "its metadata does not say which base model the adapters belong to"
                    )
                return {k: f.get_tensor(k) for k in f.keys()}, base  # noqa: SIM118 (not a dict)

        adapters, base = self._read(ADAPTERS, read, *_DAMAGED_WEIGHTS)
        from runs.weight_checks import check_adapter_shapes

        check_adapter_shapes(adapters, cfg.model, cfg.lora, self.folder / ADAPTERS)
        return adapters, base

    def config(self) -> Config:
        """config.yaml as data: typed field by field, never interpolated, its values checked."""

        def parse(path: Path) -> Config:
            cfg = config_from_data(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
            found = problems(cfg, setup=False)
            if cfg.model.vocab_size is None:
                found.insert(0, ("model.vocab_size", "is not set"))
            if found:
                raise ValueError(f"{found[0][0]} {found[0][1]}")
            return cfg

        return self._read(CONFIG, parse, (yaml.YAMLError, ValueError, TypeError))

    def tokenizer_meta(self) -> dict:
        """tinygpt_tokenizer.json: the tokenizer's metadata (data/tokenizers.py), checked."""

        def parse(path: Path) -> dict:
            tokenizer_meta = json.loads(path.read_text(encoding="utf-8"))
            check_meta(tokenizer_meta)
            return tokenizer_meta

        return self._read(TOKENIZER, parse, (ValueError,))

    def train_state(self) -> TrainState:
        """state.pt, read without unpickling code and checked (runs/state_checks.py), but for
        the optimizer state, which only the live optimizers can check (training/resume.py)."""
        from runs.state_checks import check_state, progress_fields

        path = self.folder / STATE
        if not path.is_file():
            raise UserError(
                f"{path} is missing: this checkpoint holds weights only and cannot resume training"
            )
        try:
            # weights_only: tensors and plain values only; a crafted pickle's code never runs
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # UnpicklingError for code, anything for a damaged file
            raise UserError(
                f"{path} is damaged or holds something other than tensors and numbers (refused to "
                f"load it: {first_line(e)})"
            ) from None
        check_state(state, path)
        progress = Progress(**progress_fields(state, typing.get_type_hints(Progress), path))
        # scaler: fp16 runs only; tokens: for people reading the file, 0 where it is missing
        scaler = state.get("scaler")
        tokens = state.get("tokens", 0)
        return TrainState(progress, state["rng"], state["optimizer"], scaler, tokens)

    def _read(self, name: str, parse, damage: tuple[type[Exception], ...], damaged: str = " ({})"):
        """parse(folder / name); a missing file, or one that fails with a `damage` exception, is one
        line."""
        path = self.folder / name
        if not path.is_file():
            raise UserError(f"{path} is missing; the checkpoint is incomplete")
        try:
            return parse(path)
        except damage as e:
            raise UserError(f"{path} is damaged" + damaged.format(first_line(e))) from None


_DAMAGED_WEIGHTS = (
    (SafetensorError, OSError, ValueError),
    " or not a safetensors file ({}); use another checkpoint (e.g. last/ instead of best/) or "
    "train again",
)


def is_checkpoint(folder: Path) -> bool:
    """Whether `folder` holds a checkpoint's weights: the model's, or a LoRA run's adapters."""
    return (folder / WEIGHTS).is_file() or (folder / ADAPTERS).is_file()


def find(path: Path | str, prefer: tuple[str, ...] = ("best", "last")) -> Checkpoint:
    """The checkpoint at `path`: path itself, else its best (or last) checkpoint."""
    path = Path(path)
    if is_checkpoint(path):
        return Checkpoint(path)
    if path.is_file():
        raise UserError(
            f"{path} is a file, not a checkpoint: give a training run's folder (train.out_dir) or "
            f"one checkpoint folder in it (holding {WEIGHTS})"
        )
    if not path.is_dir():
        raise UserError(
            f"no checkpoint at {path}: the folder does not exist; train one with python train.py "
            "(it writes to train.out_dir), or check the path"
        )
    for name in prefer:
        # .old: a swap interrupted by a crash
        for candidate in (path / name, path / f".{name}.old"):
            if is_checkpoint(candidate):
                return Checkpoint(candidate)
    raise _none_in(path, prefer)


def run_of(folder: Path) -> Path | None:
    """The training run (out_dir) that checkpoint `folder` is one of (its best/ or last/), else
    None: a checkpoint folder standing alone, or a Hugging Face model folder."""
    return folder.parent if folder.name in ("best", "last", ".best.old", ".last.old") else None


def find_last(out_dir: Path | str) -> Checkpoint:
    """The checkpoint a resumed run continues: OUT_DIR/last (or the .last.old that a crash left)."""
    if not Path(out_dir).is_dir():
        raise _none_in(out_dir, ("last",))
    return find(out_dir, prefer=("last",))


def _none_in(path: Path | str, names: tuple[str, ...]) -> UserError:
    return UserError(
        f"no checkpoint in {path} (expected {' or '.join(names)}/{WEIGHTS}); has training reached "
        "its first eval?"
    )
