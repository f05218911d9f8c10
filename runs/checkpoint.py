"""Checkpoints you can trust: the format, written atomically and read back without unpickling, in one place.

OUT_DIR/last/ and OUT_DIR/best/ each hold model.safetensors (the weights, whole; a tied LM head left out), or
for a LoRA run adapters.safetensors (the adapters, their base in its metadata), config.yaml, the tokenizer's
tinygpt_tokenizer.json and state.pt (runs/train_state.py). Written whole: common/files.py's `atomic_folder`
swaps a flushed temporary folder in by renames, so a crash leaves NAME or .NAME.old complete, and `find`
takes either; best/ shares last/'s files by hard links. One format for one process, DDP and FSDP (gathered
whole; rank 0 writes), so a run saved on 8 GPUs resumes on 1. Reading: `find` gives a `Checkpoint` whose
files are read on demand, each checked first (runs/verify.py: the weights' shapes before any model is built).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from common import json_text
from common.errors import UserError, first_line
from common.files import atomic_folder, save_tensors
from data.tokenizers import METADATA_FILE, check_meta
from runs.config import Config, config_from_data, problems, to_yaml

if TYPE_CHECKING:  # state.pt: training writes and resumes it; reading a model to run needs none of it
    from runs.train_state import TrainState

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.yaml", METADATA_FILE
ADAPTERS = "adapters.safetensors"  # a LoRA run's checkpoint: the adapters alone, and where its base is
OUT_DIR_ADVICE = "choose another train.out_dir"


# --- writing ---


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights to save, whole, as contiguous CPU tensors named as in GPT (no wrapper prefixes), without
    the tied copy of the embedding. Under FSDP every rank must call it; only rank 0 gets the tensors."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from runs.train_state import whole_state_options

    state = get_model_state_dict(model, options=whole_state_options())
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
    metadata, and with a train_state (`TrainState.capture`) state.pt. With `base` (`lora_base`: a LoRA run)
    the adapters alone, with their base recorded. Under torchrun rank 0 alone calls it, once every rank has
    helped gather the weights and the train state."""
    out_dir = Path(out_dir)
    saved = weights
    if base is not None:  # a LoRA run: its adapters alone
        from model.lora import adapter_weights

        saved = adapter_weights(weights)
    need = _tensor_bytes([saved, train_state.to_dict() if train_state is not None else None])
    with atomic_folder(out_dir, name, "checkpoint", OUT_DIR_ADVICE, need) as tmp:
        tmp.mkdir()
        if base is not None:
            save_tensors(saved, tmp / ADAPTERS, metadata={"format": "pt", **base})
        else:
            save_tensors(saved, tmp / WEIGHTS, metadata={"format": "pt"})
        (tmp / CONFIG).write_text(to_yaml(cfg))
        (tmp / TOKENIZER).write_text(json_text.dumps(tokenizer_meta, indent=1))
        if train_state is not None:
            from runs.train_state import STATE

            train_state.save(tmp / STATE)
    return out_dir / name


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in a nest of dicts, lists and tuples (what a checkpoint takes on disk)."""
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
    with atomic_folder(out_dir, dst, "checkpoint", OUT_DIR_ADVICE) as tmp:
        shutil.copytree(out_dir / src, tmp, copy_function=_link_or_copy)
    return out_dir / dst


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# --- reading ---


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder (OUT_DIR/last, OUT_DIR/best, or a copy elsewhere); its files are read on demand."""

    folder: Path

    def __str__(self) -> str:
        return str(self.folder)

    def __fspath__(self) -> str:  # a path wherever one is taken: Path(ckpt), open(ckpt / ...) through .folder
        return str(self.folder)

    @property
    def is_lora(self) -> bool:
        return (self.folder / ADAPTERS).is_file()

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights, their shapes checked against config.yaml's model (from the header) first."""
        model = self.config().model
        if (self.folder / WEIGHTS).is_file():
            from runs.verify import check_weights_file  # reading a model only

            check_weights_file(self.folder / WEIGHTS, model)
        return self._read(WEIGHTS, lambda path: load_file(str(path)), *_DAMAGED_WEIGHTS)

    def adapters(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """A LoRA checkpoint's adapters, their names and shapes checked against config.yaml's lora section,
        and what it records of their base (runs/pretrained.py's `lora_base`)."""
        cfg = self.config()
        if cfg.lora is None:
            raise UserError(
                f"{self.folder / CONFIG} has no lora section, but the checkpoint holds LoRA adapters"
            )

        def read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
            with safe_open(str(path), framework="pt") as f:
                base = f.metadata() or {}
                if not {"base", "base_sha256"} <= set(base):
                    raise ValueError("its metadata does not say which base model the adapters belong to")
                return {k: f.get_tensor(k) for k in f.keys()}, base  # noqa: SIM118 (not a dict)

        adapters, base = self._read(ADAPTERS, read, *_DAMAGED_WEIGHTS)
        from runs.verify import check_adapter_shapes

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
        """state.pt, read without unpickling code and checked (runs/train_state.py)."""
        from runs.train_state import STATE, TrainState

        path = self.folder / STATE
        if not path.is_file():
            raise UserError(
                f"{path} is missing: this checkpoint holds weights only and cannot resume training"
            )
        return TrainState.load(path)

    def _read(self, name: str, parse, damage: tuple[type[Exception], ...], damaged: str = " ({})"):
        """parse(folder / name); a missing file, or one that fails with a `damage` exception, is one line."""
        path = self.folder / name
        if not path.is_file():
            raise UserError(f"{path} is missing; the checkpoint is incomplete")
        try:
            return parse(path)
        except damage as e:
            raise UserError(f"{path} is damaged" + damaged.format(first_line(e))) from None


_DAMAGED_WEIGHTS = (
    (SafetensorError, OSError, ValueError),
    " or not a safetensors file ({}); use another checkpoint (e.g. last/ instead of best/) or train again",
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
            f"{path} is a file, not a checkpoint: give a training run's folder (train.out_dir) or one "
            f"checkpoint folder in it (holding {WEIGHTS})"
        )
    if not path.is_dir():
        raise UserError(
            f"no checkpoint at {path}: the folder does not exist; train one with "
            f"python train.py (it writes to train.out_dir), or check the path"
        )
    for name in prefer:
        for candidate in (path / name, path / f".{name}.old"):  # .old: a swap interrupted by a crash
            if is_checkpoint(candidate):
                return Checkpoint(candidate)
    raise _none_in(path, prefer)


def run_of(folder: Path) -> Path | None:
    """The training run (out_dir) that checkpoint `folder` is one of (its best/ or last/), else None: a
    checkpoint folder standing alone, or a Hugging Face model folder."""
    return folder.parent if folder.name in ("best", "last", ".best.old", ".last.old") else None


def find_last(out_dir: Path | str) -> Checkpoint:
    """The checkpoint a resumed run continues: OUT_DIR/last (or the .last.old that a crash left)."""
    if not Path(out_dir).is_dir():
        raise _none_in(out_dir, ("last",))
    return find(out_dir, prefer=("last",))


def _none_in(path: Path | str, names: tuple[str, ...]) -> UserError:
    return UserError(
        f"no checkpoint in {path} (expected {' or '.join(names)}/{WEIGHTS}); has training reached its "
        "first eval?"
    )
