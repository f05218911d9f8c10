"""Checkpoints you can trust: the format, written atomically and read back without unpickling, in one place.

OUT_DIR/last/ and OUT_DIR/best/ each hold model.safetensors (the weights, whole; a tied LM head left out),
config.yaml (the run's final config), tinygpt_tokenizer.json (data/tokenizers.py's metadata) and state.pt
(optimizer state keyed by parameter name, progress, RNG states: tensors and numbers only, read with
torch.load(weights_only=True), which refuses anything else).
- Atomic: `atomic_folder` writes a temporary folder, flushes it, and swaps it in by renames (the old one moves
  to .NAME.old first): a crash at any moment leaves NAME or .NAME.old complete, and `find` takes either.
  best/ shares last/'s files by hard links (files are replaced, never modified in place).
- One format for one process, DDP and FSDP: under FSDP every rank helps gather the full state and rank 0
  writes it, so a run saved on 8 GPUs resumes on 1 (torch.distributed.checkpoint's metadata is a pickle).
- Reading: `find` gives a `Checkpoint`, whose files are read on demand; `load_pretrained` reads the weights a
  run starts from or a script runs: a checkpoint, or a Hugging Face model folder or hub name (via hf/).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from common.errors import UserError
from data.tokenizers import METADATA_FILE
from hf import folders, tokenizer_files
from model import GPT, GPTConfig
from runs.config import Config, DataConfig, to_yaml

WEIGHTS, CONFIG, TOKENIZER, STATE = "model.safetensors", "config.yaml", METADATA_FILE, "state.pt"


# --- writing ---


def _fsync(path: Path) -> None:
    """Flush a file or a folder's entries to disk (best effort: some systems refuse it for folders)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _recover(out_dir: Path, name: str) -> None:
    """Finish a swap that a crash interrupted, and drop leftovers of unfinished writes."""
    final, old = out_dir / name, out_dir / f".{name}.old"
    if old.exists():
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(old, final)
    for tmp in out_dir.glob(f".{name}.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_folder(
    out_dir: Path, name: str, what: str = "checkpoint", advice: str = "choose another train.out_dir"
) -> Iterator[Path]:
    """Yield an empty temporary folder's path; when the block ends, it becomes out_dir/name in one swap.
    If the block fails, the temporary folder is deleted and out_dir/name is untouched."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _recover(out_dir, name)
    tmp = out_dir / f".{name}.tmp-{uuid.uuid4().hex[:8]}"
    final, old = out_dir / name, out_dir / f".{name}.old"
    try:
        yield tmp
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"could not write {what} {final} ({e.strerror or e}); the previous one is untouched. "
            f"Free disk space or {advice}"
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights to save, whole, as contiguous CPU tensors named as in GPT (no wrapper prefixes), without
    the tied copy of the embedding. Under FSDP every rank must call it; only rank 0 gets the tensors."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_whole())
    if getattr(getattr(model, "config", None), "tie_embeddings", True):
        state.pop("lm_head.weight", None)
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def optimizer_state(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict:
    """The optimizers' state keyed by parameter name, whole (FSDP: gathered; every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizers, options=_whole())


def _whole():
    """Full (unsharded) state dicts; under torchrun gathered to rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return StateDictOptions(full_state_dict=True, cpu_offload=distributed)


def write_checkpoint(
    out_dir: Path | str,
    name: str,
    model: torch.nn.Module,
    cfg: Config,
    tokenizer_meta: dict,
    train_state: dict[str, Any] | None = None,
    optimizers: list[torch.optim.Optimizer] = (),
    is_main: bool = True,
) -> Path:
    """Write checkpoint OUT_DIR/NAME atomically: the model's weights, config and tokenizer, and with a
    train_state also the optimizer state (state.pt). Every rank calls it; rank 0 (`is_main`) writes."""
    out_dir = Path(out_dir)
    weights = model_weights(model)
    if train_state is not None and optimizers:
        train_state = {**train_state, "optimizer": optimizer_state(model, list(optimizers))}
    if not is_main:
        return out_dir / name
    with atomic_folder(out_dir, name) as tmp:
        tmp.mkdir()
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(to_yaml(cfg))
        (tmp / TOKENIZER).write_text(json.dumps(tokenizer_meta, indent=1))
        if train_state is not None:
            torch.save(train_state, tmp / STATE)
    return out_dir / name


def copy_checkpoint(out_dir: Path | str, src: str, dst: str) -> Path:
    """Make checkpoint DST a copy of SRC (hard links where the filesystem allows), atomically."""
    out_dir = Path(out_dir)
    with atomic_folder(out_dir, dst) as tmp:
        shutil.copytree(out_dir / src, tmp, copy_function=_link_or_copy)
    return out_dir / dst


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def check_out_dir(out_dir: Path, cfg: Config, n_params: int) -> None:
    """Fail before training on an out_dir that cannot hold the checkpoints, or whose run would be lost;
    with train.overwrite, delete the run it holds."""
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
    has_run = any((out_dir / n / WEIGHTS).is_file() for n in ("last", "best", ".last.old"))
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


# --- reading ---


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder (OUT_DIR/last, OUT_DIR/best, or a copy elsewhere); its files are read on demand."""

    folder: Path

    def __str__(self) -> str:
        return str(self.folder)

    def __fspath__(self) -> str:  # a path wherever one is taken: Path(ckpt), open(ckpt / ...) through .folder
        return str(self.folder)

    def weights(self) -> dict[str, torch.Tensor]:
        return self._read(
            WEIGHTS,
            lambda path: load_file(str(path)),
            (SafetensorError, OSError, ValueError),
            " or not a safetensors file ({}); use another checkpoint (e.g. last/ instead of best/) or train "
            "again",
        )

    def config(self) -> Config:
        def parse(path: Path) -> Config:
            data = yaml.safe_load(path.read_text())
            return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), data or {}))

        return self._read(CONFIG, parse, (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError))

    def tokenizer(self) -> dict:
        return self._read(TOKENIZER, lambda path: json.loads(path.read_text()), (ValueError,))

    def train_state(self) -> dict[str, Any]:
        """state.pt, never unpickling code: weights_only refuses it (UnpicklingError)."""
        return self._read(
            STATE,
            lambda path: torch.load(path, map_location="cpu", weights_only=True),
            (Exception,),
            " or holds something other than tensors and numbers (refused to load it: {})",
        )

    def _read(self, name: str, parse, damage: tuple[type[Exception], ...], damaged: str = " ({})"):
        """parse(folder / name); a missing file, or one that fails with a `damage` exception, is one line."""
        path = self.folder / name
        if not path.is_file():
            if name == STATE:
                raise UserError(
                    f"{path} is missing: this checkpoint holds weights only and cannot resume training"
                )
            raise UserError(f"{path} is missing; the checkpoint is incomplete")
        try:
            return parse(path)
        except damage as e:
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise UserError(f"{path} is damaged" + damaged.format(first)) from None


def find(path: Path | str, prefer: tuple[str, ...] = ("best", "last")) -> Checkpoint:
    """The checkpoint at `path`: path itself, else its best (or last) checkpoint."""
    path = Path(path)
    if (path / WEIGHTS).is_file():
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
            if (candidate / WEIGHTS).is_file():
                return Checkpoint(candidate)
    raise _none_in(path, prefer)


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


def load_into(model: GPT, weights: dict[str, torch.Tensor], where: Path) -> None:
    """Load whole weights into a model that is not sharded yet (FSDP shards it afterwards)."""
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # shape mismatch
        last = str(e).splitlines()[-1].strip()
        raise UserError(f"the weights in {where} do not fit its config: {last}") from None
    if model.config.tie_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise UserError(
            f"the weights in {where} do not match its config (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); the checkpoint is inconsistent"
        )


def load_optimizers(
    model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], state: dict, ckpt: Checkpoint
) -> None:
    """Restore the optimizer state written by `write_checkpoint` (sharding it again under FSDP, for any
    number of ranks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    mismatch = UserError(
        f"checkpoint {ckpt} holds state for a different optimizer setup; resume with the optim.name it "
        "was trained with"
    )
    if "optimizer" not in state:
        raise mismatch
    options = StateDictOptions(full_state_dict=True)
    try:
        set_optimizer_state_dict(model, optimizers, state["optimizer"], options=options)
    except (KeyError, ValueError, RuntimeError):
        raise mismatch from None


@dataclass
class Pretrained:
    """Weights to start from or to run: a checkpoint of ours, or a Hugging Face model converted by hf/."""

    where: Path  # the checkpoint or model folder
    model: GPTConfig
    weights: dict[str, torch.Tensor]  # ours, by name
    tokenizer: dict | None  # our tokenizer metadata; None: a tokenizer tinygpt cannot run
    tokenizer_about: str  # what the tokenizer is, in a few words
    config: Config | None = None  # the training config of a checkpoint of ours

    def weights_for(self, model: GPTConfig) -> dict[str, torch.Tensor]:
        """The weights for `model`, which may have a shorter context: learned positions are cropped."""
        if "pos_emb.weight" not in self.weights:
            return self.weights
        return {**self.weights, "pos_emb.weight": self.weights["pos_emb.weight"][: model.block_size]}


def load_pretrained(name: Path | str, hub: bool = False) -> Pretrained:
    """The model at `name`: a training run's folder (its best checkpoint, else its last), a checkpoint
    folder, a Hugging Face model folder (config.json), or with `hub` a Hugging Face hub name (gpt2)."""
    path = Path(name)
    if hub and not path.exists() and folders.is_hub_name(str(name)):
        path = folders.download(str(name))
    if folders.is_model_folder(path):
        model, weights, tokenizer, about = folders.read_model(path)
        return Pretrained(path, model, weights, tokenizer, about)
    try:
        ckpt = find(path)
    except UserError:
        if not path.is_dir():  # missing, or a file: find says which
            raise
        raise UserError(
            f"{path} holds no checkpoint ({WEIGHTS} with {CONFIG}, or a run's best/ or last/) and no Hugging "
            f"Face model (it has no {folders.CONFIG}); give a run's folder, a checkpoint or a model folder"
        ) from None
    cfg, tokenizer = ckpt.config(), ckpt.tokenizer()
    return Pretrained(
        ckpt.folder, cfg.model, ckpt.weights(), tokenizer, tokenizer_files.describe(tokenizer), cfg
    )


def load_model(path: Path | str, device: torch.device | str = "cpu") -> tuple[GPT, Config, dict, Path]:
    """(model in eval mode, its training config, tokenizer metadata, checkpoint folder) for sampling. For a
    Hugging Face model folder the config is made up: its model, and a shipped dataset with its tokenizer."""
    source = load_pretrained(path)
    if source.tokenizer is None:
        raise UserError(
            f"{source.where} uses a tokenizer tinygpt cannot run: {source.tokenizer_about}; tinygpt runs "
            "char, GPT-2 BPE and its own bpe:N models"
        )
    cfg = source.config
    if cfg is None:
        dataset = "shakespeare_char" if source.tokenizer["kind"] == "char" else "shakespeare"
        cfg = Config(model=source.model, data=DataConfig(dataset=dataset))
    model = GPT(source.model)
    load_into(model, source.weights, source.where)
    return model.to(device).eval(), cfg, source.tokenizer, source.where


# --- random generators ---


def rng_state() -> dict[str, Any]:
    """Every random generator training touches, as tensors and plain numbers (weights_only-loadable). On CUDA,
    the generator of this process's device only: every rank seeds its device alike and draws alike, and a
    run resumed where fewer GPUs are visible has no generators for the others."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # on the current device
