"""Checkpoints you can trust: a folder per checkpoint, written atomically, loaded without unpickling.

OUT_DIR/last/ and OUT_DIR/best/ each hold
    model.safetensors   the weights (safetensors: tensors only, no code)
    config.yaml         the resolved training config
    tokenizer.json      the tokenizer metadata (vocabulary)
    state.pt            training state (optimiser, iteration, RNG states, best val loss): plain tensors and
                        numbers, read with torch.load(weights_only=True), which refuses anything else
A checkpoint is written into a temporary folder, flushed to disk, then swapped in by renames: the old folder
moves to .NAME.old, the new one takes its name, the old one is deleted. A crash at any moment leaves either
NAME or .NAME.old complete, and `find()` takes whichever exists. `best` shares the files of `last` by hard
links (files are never modified in place, only replaced).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional

import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from common.errors import UserError
from model import GPT, GPTConfig
from training.config import Config, to_yaml

WEIGHTS, CONFIG, TOKENIZER, STATE = "model.safetensors", "config.yaml", "tokenizer.json", "state.pt"
SHARDS = "shards.json"  # in place of model.safetensors: an FSDP checkpoint (see training/distributed.py)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights to save: no wrapper prefixes (torch.compile's _orig_mod., DDP's module.), no tied copy
    of the embedding, contiguous CPU tensors."""
    state = {}
    for name, tensor in model.state_dict().items():
        name = name.replace("_orig_mod.", "").replace("module.", "")
        state[name] = tensor
    if getattr(getattr(model, "config", None), "tie_embeddings", True) and "token_emb.weight" in state:
        state.pop("lm_head.weight", None)
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def recover(out_dir: Path, name: str) -> None:
    """Finish a swap that a crash interrupted, and drop leftovers of unfinished writes."""
    final, old = out_dir / name, out_dir / f".{name}.old"
    if old.exists():
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(old, final)
    for tmp in out_dir.glob(f".{name}.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def swap_in(tmp: Path, out_dir: Path, name: str) -> Path:
    """Make the complete folder `tmp` checkpoint out_dir/name (see the module docstring)."""
    final, old = out_dir / name, out_dir / f".{name}.old"
    _fsync_dir(tmp)
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final


def save_metadata(
    folder: Path, cfg: Config, tokenizer_meta: dict, train_state: Optional[dict[str, Any]]
) -> None:
    """config.yaml, tokenizer.json and (when given) state.pt, flushed to disk."""
    _write(folder / CONFIG, lambda f: f.write(to_yaml(cfg).encode()))
    _write(folder / TOKENIZER, lambda f: f.write(json.dumps(tokenizer_meta, indent=1).encode()))
    if train_state is not None:
        _write(folder / STATE, lambda f: torch.save(train_state, f))


def save(
    out_dir: Path | str,
    name: str,
    weights: dict[str, torch.Tensor],
    cfg: Config,
    tokenizer_meta: dict,
    train_state: Optional[dict[str, Any]] = None,
) -> Path:
    """Write checkpoint OUT_DIR/NAME atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    recover(out_dir, name)
    tmp = out_dir / f".{name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
        with open(tmp / WEIGHTS, "rb+") as f:
            os.fsync(f.fileno())
        save_metadata(tmp, cfg, tokenizer_meta, train_state)
        return swap_in(tmp, out_dir, name)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"could not write checkpoint {out_dir / name} ({e.strerror or e}); the previous one "
            "is untouched. Free disk space or choose another train.out_dir"
        ) from None


def copy(out_dir: Path | str, src: str, dst: str) -> Path:
    """Make checkpoint DST a copy of SRC (hard links where the filesystem allows), atomically."""
    out_dir = Path(out_dir)
    recover(out_dir, dst)
    tmp = out_dir / f".{dst}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(out_dir / src, tmp, copy_function=_link_or_copy)
        return swap_in(tmp, out_dir, dst)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"could not write checkpoint {out_dir / dst} ({e.strerror or e}); the previous one "
            "is untouched. Free disk space or choose another train.out_dir"
        ) from None


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _has_weights(folder: Path) -> bool:
    return (folder / WEIGHTS).is_file() or (folder / SHARDS).is_file()


def find(path: Path | str, prefer: tuple[str, ...] = ("best", "last")) -> Path:
    """The checkpoint folder at `path`: path itself, else its best (or last) checkpoint."""
    path = Path(path)
    if _has_weights(path):
        return path
    if not path.is_dir():
        raise UserError(
            f"no checkpoint at {path}: the folder does not exist; train one with "
            f"python train.py (it writes to train.out_dir), or check the path"
        )
    for name in prefer:
        for candidate in (path / name, path / f".{name}.old"):  # .old: a swap interrupted by a crash
            if _has_weights(candidate):
                return candidate
    raise UserError(
        f"no checkpoint in {path} (expected {' or '.join(prefer)}/{WEIGHTS}); "
        "has training reached its first eval?"
    )


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise UserError(f"{path} is missing; the checkpoint is incomplete") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(
            f"{path} is damaged or not a safetensors file ({str(e).splitlines()[0]}); "
            "use another checkpoint (e.g. last/ instead of best/) or train again"
        ) from None


def load_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The full weights of a checkpoint; an FSDP checkpoint's per-rank shards are joined along dim 0."""
    if not (ckpt / SHARDS).is_file():
        return _load_safetensors(ckpt / WEIGHTS)
    try:
        world = int(json.loads((ckpt / SHARDS).read_text())["world_size"])
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise UserError(f"{ckpt / SHARDS} is damaged ({e})") from None
    shards = [_load_safetensors(ckpt / f"model-rank{r:02d}-of-{world:02d}.safetensors") for r in range(world)]
    return {
        k: torch.cat([s[k] for s in shards], dim=0) if shards[0][k].dim() else shards[0][k] for k in shards[0]
    }


def load_optimizer_shard(ckpt: Path, rank: int, world: int, optimizers: list) -> list[dict]:
    """This rank's optimizer state from an FSDP checkpoint, as DTensors placed like the parameters."""
    meta = json.loads((ckpt / SHARDS).read_text())
    if int(meta["world_size"]) != world:
        raise UserError(
            f"checkpoint {ckpt} was sharded over {meta['world_size']} processes; resume it with "
            f"torchrun --nproc_per_node={meta['world_size']}"
        )
    path = ckpt / f"state-rank{rank:02d}.pt"
    saved = load_train_state(ckpt, path=path)["optimizers"]
    from torch.distributed.tensor import DTensor

    for opt, state in zip(optimizers, saved):
        params = [p for g in opt.param_groups for p in g["params"]]
        for idx, s in state["state"].items():
            p = params[int(idx)]
            for k, v in s.items():
                if isinstance(p, DTensor) and torch.is_tensor(v) and v.dim() > 0:
                    s[k] = DTensor.from_local(
                        v.to(p.device),
                        p.device_mesh,
                        p.placements,
                        run_check=False,
                        shape=p.shape,
                        stride=p.stride(),
                    )
    return saved


def load_config(ckpt: Path) -> Config:
    try:
        data = yaml.safe_load((ckpt / CONFIG).read_text())
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), data or {}))
    except FileNotFoundError:
        raise UserError(f"{ckpt / CONFIG} is missing; the checkpoint is incomplete") from None
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as e:
        raise UserError(f"{ckpt / CONFIG} is damaged ({str(e).splitlines()[0]})") from None


def load_tokenizer_meta(ckpt: Path) -> dict:
    try:
        return json.loads((ckpt / TOKENIZER).read_text())
    except FileNotFoundError:
        raise UserError(f"{ckpt / TOKENIZER} is missing; the checkpoint is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{ckpt / TOKENIZER} is damaged ({e})") from None


def load_train_state(ckpt: Path, path: Optional[Path] = None) -> dict[str, Any]:
    """state.pt (or another file of tensors and numbers) of a checkpoint, never unpickling code."""
    path = path or ckpt / STATE
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(
            f"{path} is missing: this checkpoint holds weights only and cannot resume training"
        ) from None
    except Exception as e:  # weights_only refuses pickled code with UnpicklingError; damage gives others
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"{path} is damaged or holds something other than tensors and numbers "
            f"(refused to load it: {first[:200]})"
        ) from None


def load_into(model: torch.nn.Module, weights: dict[str, torch.Tensor], ckpt: Path) -> None:
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if model.config.tie_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise UserError(
            f"the weights in {ckpt} do not match its config.yaml (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); the checkpoint is inconsistent"
        )


def load_model(path: Path | str, device: torch.device | str = "cpu") -> tuple[GPT, Config, dict, Path]:
    """(model in eval mode, its training config, tokenizer metadata, checkpoint folder) for sampling."""
    ckpt = find(path)
    cfg = load_config(ckpt)
    weights = load_weights(ckpt)
    model = GPT(GPTConfig(**vars(cfg.model)))
    try:
        load_into(model, weights, ckpt)
    except RuntimeError as e:  # shape mismatch
        raise UserError(
            f"the weights in {ckpt} do not fit its config.yaml: {str(e).splitlines()[-1].strip()}"
        ) from None
    return model.to(device).eval(), cfg, load_tokenizer_meta(ckpt), ckpt


def rng_state() -> dict[str, Any]:
    """Every random generator training touches, as tensors and plain numbers (weights_only-loadable)."""
    import random

    import numpy as np

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
