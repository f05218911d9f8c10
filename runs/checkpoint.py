"""Checkpoints you can trust: the format, written atomically and read back without unpickling, in one place.

OUT_DIR/last/ and OUT_DIR/best/ each hold model.safetensors (the weights, whole; a tied LM head left out),
config.yaml (the run's final config), tinygpt_tokenizer.json (data/tokenizers.py's metadata) and state.pt
(optimizer state keyed by parameter name, progress, RNG states: tensors and numbers only, read with
torch.load(weights_only=True), which refuses anything else).
- LoRA runs (model/lora.py) hold adapters.safetensors instead of model.safetensors: the adapters alone, and in
  its metadata the base they adapt (the folder its weights were read from, absolute) and the sha256 of those
  weights (`fingerprint`: names, shapes and bytes, the same however the base is stored). Reading one loads
  the base again and refuses it, in one line, if it moved or changed; `load_pretrained` gives the adapters
  merged into the base's weights (sampling, evaluation, export: one function for every format), or apart.
- Atomic: common/files.py's `atomic_folder` writes a temporary folder, flushes it, and swaps it in by renames
  (the old one moves to .NAME.old first): a crash at any moment leaves NAME or .NAME.old complete, and `find`
  takes either.
  best/ shares last/'s files by hard links (files are replaced, never modified in place).
- One format for one process, DDP and FSDP: under FSDP every rank helps gather the full state and rank 0
  writes it, so a run saved on 8 GPUs resumes on 1 (torch.distributed.checkpoint's metadata is a pickle).
- Reading: `find` gives a `Checkpoint`, whose files are read on demand, each checked before it is used
  (runs/verify.py: the weights' shapes against the config before any model is built, every tensor of
  state.pt against what it will be used for; config.yaml is data, never interpolated); `load_pretrained`
  reads the weights a run starts from or a script runs: a checkpoint, or a Hugging Face model folder or hub
  name (via hf/).
- An out_dir has one writer: train.py holds OUT_DIR/.lock for its whole run (common/locks.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from common import locks
from common.errors import UserError
from common.files import atomic_folder, check_not_links, save_tensors
from data.tokenizers import METADATA_FILE, check_meta
from hf import folders, tokenizer_files
from model import GPT, GPTConfig, lora
from runs import verify
from runs.config import Config, DataConfig, config_from_data, problems, to_yaml

WEIGHTS, CONFIG, TOKENIZER, STATE = "model.safetensors", "config.yaml", METADATA_FILE, "state.pt"
ADAPTERS = "adapters.safetensors"  # a LoRA run's checkpoint: the adapters alone, and where its base is
LOCK = ".lock"  # in an out_dir: held by the train.py that writes into it
OUT_DIR_ADVICE = "choose another train.out_dir"


# --- writing ---


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
    base: dict[str, str] | None = None,
) -> Path:
    """Write checkpoint OUT_DIR/NAME atomically: the model's weights, config and tokenizer, and with a
    train_state also the optimizer state (state.pt). With `base` (`lora_base`: a LoRA run) the adapters
    alone, with their base recorded. Every rank calls it; rank 0 (`is_main`) writes."""
    out_dir = Path(out_dir)
    weights = model_weights(model)
    if train_state is not None and optimizers:
        train_state = {**train_state, "optimizer": optimizer_state(model, list(optimizers))}
    if not is_main:
        return out_dir / name
    saved = lora.adapter_weights(weights) if base is not None else weights
    need = _tensor_bytes([saved, train_state])
    with atomic_folder(out_dir, name, "checkpoint", OUT_DIR_ADVICE, need) as tmp:
        tmp.mkdir()
        if base is not None:
            save_tensors(saved, tmp / ADAPTERS, metadata={"format": "pt", **base})
        else:
            save_tensors(saved, tmp / WEIGHTS, metadata={"format": "pt"})
        (tmp / CONFIG).write_text(to_yaml(cfg))
        (tmp / TOKENIZER).write_text(json.dumps(tokenizer_meta, indent=1))
        if train_state is not None:
            _save_state(train_state, tmp / STATE)
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


class _Recorded:
    """A file for torch.save that keeps the OSError of a failed write: torch reports it only as a
    RuntimeError ("unexpected pos ...") without the reason."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _save_state(state: dict, path: Path) -> None:
    """torch.save(state, path), failing with the OSError of the write that failed."""
    with open(path, "wb") as f:
        recorded = _Recorded(f)
        try:
            torch.save(state, recorded)
        except RuntimeError:
            if recorded.error is None:
                raise
            raise recorded.error from None


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


def check_out_dir(out_dir: Path, cfg: Config, n_params: int) -> None:
    """Fail before training on an out_dir that cannot hold the checkpoints, whose run would be lost, or that
    another run writes into; with train.overwrite, delete the run it holds. Holds OUT_DIR/.lock from here to
    the end of the process (the caller's run)."""
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
    locks.hold(
        out_dir / LOCK,
        f"train.out_dir {out_dir}",
        exclusive=True,
        advice="another train.py writes into it: wait for it to end (or stop it), or choose another "
        "train.out_dir",
    )
    check_not_links(out_dir, ("last", "best"), OUT_DIR_ADVICE)
    has_run = any(is_checkpoint(out_dir / n) for n in ("last", "best", ".last.old"))
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

    @property
    def is_lora(self) -> bool:
        return (self.folder / ADAPTERS).is_file()

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights, their shapes checked against config.yaml's model (from the header) first."""
        model = self.config().model
        if (self.folder / WEIGHTS).is_file():
            verify.check_weights_file(self.folder / WEIGHTS, model)
        return self._read(WEIGHTS, lambda path: load_file(str(path)), *_DAMAGED_WEIGHTS)

    def adapters(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """A LoRA checkpoint's adapters, and what it records of their base (`lora_base`); their shapes are
        checked against the config where they are used (`_lora_weights`)."""

        def read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
            with safe_open(str(path), framework="pt") as f:
                base = f.metadata() or {}
                if not {"base", "base_sha256"} <= set(base):
                    raise ValueError("its metadata does not say which base model the adapters belong to")
                return {k: f.get_tensor(k) for k in f.keys()}, base  # noqa: SIM118 (not a dict)

        return self._read(ADAPTERS, read, *_DAMAGED_WEIGHTS)

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

    def tokenizer(self) -> dict:
        def parse(path: Path) -> dict:
            meta = json.loads(path.read_text(encoding="utf-8"))
            check_meta(meta)
            return meta

        return self._read(TOKENIZER, parse, (ValueError,))

    def train_state(self) -> dict[str, Any]:
        """state.pt, never unpickling code: weights_only refuses it (UnpicklingError). Its tensors are
        checked where they are used (runs/verify.py)."""
        state = self._read(
            STATE,
            lambda path: torch.load(path, map_location="cpu", weights_only=True),
            (Exception,),
            " or holds something other than tensors and numbers (refused to load it: {})",
        )
        missing = [k for k in ("iter", "rng", "optimizer") if not isinstance(state, dict) or k not in state]
        if missing:
            what = f"has no {missing[0]}" if isinstance(state, dict) else f"holds a {type(state).__name__}"
            raise UserError(
                f"{self.folder / STATE} is damaged: it {what} (not state.pt as train.py writes it); use "
                "another checkpoint"
            )
        return state

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


def load_into(model: GPT, weights: dict[str, torch.Tensor], where: Path, adapters: bool = False) -> None:
    """Load whole weights into a model that is not sharded yet (FSDP shards it afterwards); with `adapters`,
    a LoRA model's adapters alone (its base already loaded)."""
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # shape mismatch
        last = str(e).splitlines()[-1].strip()
        raise UserError(f"the weights in {where} do not fit its config: {last}") from None
    if adapters:
        missing = [k for k in missing if lora.is_adapter(k)]
    elif model.config.tie_embeddings:
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
    checked = verify.safe_optimizer_state(state["optimizer"], model, optimizers, ckpt.folder / STATE)
    options = StateDictOptions(full_state_dict=True)
    try:
        set_optimizer_state_dict(model, optimizers, checked, options=options)
    except (KeyError, ValueError, RuntimeError):
        raise mismatch from None


@dataclass
class Pretrained:
    """Weights to start from or to run: a checkpoint of ours, or a Hugging Face model converted by hf/."""

    where: Path  # the checkpoint or model folder
    model: GPTConfig
    weights: dict[str, torch.Tensor]  # ours, by name (a LoRA checkpoint's: merged, or its base's)
    tokenizer: dict | None  # our tokenizer metadata; None: a tokenizer tinygpt cannot run
    tokenizer_about: str  # what the tokenizer is, in a few words
    config: Config | None = None  # the training config of a checkpoint of ours
    adapters: dict[str, torch.Tensor] | None = None  # a LoRA checkpoint read with merge=False: its adapters

    def weights_for(self, model: GPTConfig) -> dict[str, torch.Tensor]:
        """The weights for `model`, which may have a shorter context: learned positions are cropped."""
        if "pos_emb.weight" not in self.weights:
            return self.weights
        return {**self.weights, "pos_emb.weight": self.weights["pos_emb.weight"][: model.block_size]}

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the weights as read (names, dtypes, shapes and bytes, in name order): the same however
        they are stored (a checkpoint of ours, its Hugging Face export), another if one value changed."""
        h = hashlib.sha256()
        for name in sorted(self.weights):
            t = self.weights[name].detach().cpu().contiguous()
            h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
        return h.hexdigest()


def lora_base(base: Pretrained) -> dict[str, str]:
    """What a LoRA checkpoint records of its base: the folder its weights come from, and their fingerprint."""
    return {"base": str(Path(base.where).resolve()), "base_sha256": base.fingerprint}


def base_of(ckpt: Checkpoint) -> Pretrained:
    """The base model of LoRA checkpoint `ckpt`, read where it was trained from; one line if it has moved or
    its weights have changed since (the adapters would then apply to other weights)."""
    recorded = ckpt.adapters()[1]
    folder, what = Path(recorded["base"]), f"the base model of LoRA checkpoint {ckpt}"
    if not folder.exists():
        raise UserError(
            f"{what}, {folder}, is missing (moved or deleted?); the checkpoint holds only the adapters: put "
            "the base back there (a symbolic link will do)"
        )
    try:
        base = load_pretrained(folder)
    except UserError as e:
        raise UserError(f"{what}, {folder}, cannot be read: {e}") from None
    if base.fingerprint != recorded["base_sha256"]:
        raise UserError(
            f"{what}, {folder}, has changed since the adapters were trained (its weights' sha256 is "
            f"{base.fingerprint[:12]}..., the checkpoint's {recorded['base_sha256'][:12]}...): put the "
            "original weights back there, or train the adapters again on the new ones"
        )
    return base


def _lora_weights(ckpt: Checkpoint, cfg: Config, merge: bool) -> tuple[dict, dict | None]:
    """(weights, adapters) of a LoRA checkpoint: the base's weights with the adapters merged in and None, or
    (merge False) the base's weights and the adapters apart."""
    if cfg.lora is None:
        raise UserError(f"{ckpt / CONFIG} has no lora section, but the checkpoint holds LoRA adapters")
    adapters = ckpt.adapters()[0]
    with torch.device("meta"):  # the adapters its config implies, to check the file against
        model = GPT(cfg.model)
        lora.add_lora(model, cfg.lora)
    expected = {k: tuple(v.shape) for k, v in lora.adapter_weights(model.state_dict()).items()}
    if {k: tuple(v.shape) for k, v in adapters.items()} != expected:
        raise UserError(
            f"the adapters in {ckpt / ADAPTERS} do not match its config ({len(adapters)} tensors; its lora "
            f"section implies {len(expected)}, of other names or shapes); the checkpoint is inconsistent"
        )
    weights = base_of(ckpt).weights_for(cfg.model)
    if merge:
        return lora.merge(weights, adapters, cfg.model, cfg.lora), None
    return weights, adapters


def load_pretrained(name: Path | str, hub: bool = False, merge: bool = True) -> Pretrained:
    """The model at `name`: a training run's folder (its best checkpoint, else its last), a checkpoint
    folder, a Hugging Face model folder (config.json), or with `hub` a Hugging Face hub name (gpt2). A LoRA
    checkpoint gives its base's weights with the adapters merged in, or with `merge` False, apart."""
    path = Path(name)
    if hub and not path.exists() and folders.is_hub_name(str(name)):
        path = folders.download(str(name))
    if folders.is_model_folder(path):
        model, weights, tokenizer, about = folders.read_model(path)
        verify.check_weight_shapes({k: tuple(v.shape) for k, v in weights.items()}, model, path)
        try:
            if tokenizer is not None:
                check_meta(tokenizer)
        except ValueError as e:
            raise UserError(f"{path / TOKENIZER} is damaged ({e})") from None
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
    weights, adapters = _lora_weights(ckpt, cfg, merge) if ckpt.is_lora else (ckpt.weights(), None)
    about = tokenizer_files.describe(tokenizer)
    return Pretrained(ckpt.folder, cfg.model, weights, tokenizer, about, cfg, adapters)


def load_model(
    path: Path | str, device: torch.device | str = "cpu", merge: bool = True
) -> tuple[GPT, Config, dict, Path]:
    """(model in eval mode, its training config, tokenizer metadata, checkpoint folder) for sampling. For a
    Hugging Face model folder the config is made up: its model, and a shipped dataset with its tokenizer.
    A LoRA checkpoint's model has the adapters merged into its weights, or with `merge` False, beside them."""
    source = load_pretrained(path, merge=merge)
    if source.tokenizer is None:
        raise UserError(
            f"{source.where} uses a tokenizer tinygpt cannot run: {source.tokenizer_about}; tinygpt runs "
            "char, GPT-2 BPE and its own bpe:N models"
        )
    if source.tokenizer["vocab_size"] > source.model.vocab_size:
        raise UserError(
            f"{source.where}: its tokenizer has {source.tokenizer['vocab_size']} tokens, more than the "
            f"model's vocabulary of {source.model.vocab_size}; the checkpoint is inconsistent"
        )
    cfg = source.config
    if cfg is None:
        dataset = "shakespeare_char" if source.tokenizer["kind"] == "char" else "shakespeare"
        cfg = Config(model=source.model, data=DataConfig(dataset=dataset))
    model = GPT(source.model)
    load_into(model, source.weights, source.where)
    if source.adapters is not None:
        lora.add_lora(model, cfg.lora)
        load_into(model, source.adapters, source.where, adapters=True)
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


def set_rng_state(state: dict[str, Any], where: Path | str = "state.pt") -> None:
    verify.check_rng_state(state, where)
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # on the current device
