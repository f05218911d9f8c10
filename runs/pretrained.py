"""Where a model comes from: a checkpoint of ours, or a model of another format that a script reads
with a reader it hands in (`OtherFormat`: the scripts that read Hugging Face folders pass one).

`load_pretrained` reads the weights a run starts from (train.init_from) or a script runs, as a
`Pretrained`; `load_model` builds the model for sampling, evaluation and the heads tool, and gives
it with its tokenizer and the tokenizer's metadata (`Loaded`), so a script builds neither again;
`load_into` puts weights into a model. A LoRA checkpoint holds the adapters alone and records its
base (the folder its weights were read from, absolute) and the sha256 of those weights
(`fingerprint`: names, shapes and bytes, the same however the base is stored). Reading one loads the
base again (`base_of`) and refuses it, in one line, if it moved or changed; `load_pretrained` gives
the adapters merged into the base's weights (sampling, evaluation, export: one function for every
format), or apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from common.errors import UserError
from data.tokenizers import Tokenizer, describe, from_meta
from model import GPT, GPTConfig
from runs.checkpoint import CONFIG, WEIGHTS, Checkpoint, find
from runs.config_schema import Config, DataConfig
from runs.weight_checks import load_into

# the dataset a model was trained on: eval.py and heads.py open it, sample.py does not
if TYPE_CHECKING:
    from data.dataset import Dataset


@dataclass
class Pretrained:
    """Weights to start from or to run: a checkpoint of ours, or a model of another format converted
    to ours (`OtherFormat`)."""

    where: Path  # the checkpoint or model folder
    model: GPTConfig
    weights: dict[str, torch.Tensor]  # ours, by name (a LoRA checkpoint's: merged, or its base's)
    tokenizer_meta: dict | None  # our tokenizer's metadata; None: a tokenizer tinygpt cannot run
    tokenizer_about: str  # what the tokenizer is, in a few words
    config: Config | None = None  # the training config of a checkpoint of ours
    # a LoRA checkpoint read with merge=False: its adapters
    adapters: dict[str, torch.Tensor] | None = None

    def weights_for(self, model: GPTConfig) -> dict[str, torch.Tensor]:
        """The weights for `model`, which may have a shorter context: learned positions are
        cropped."""
        if "pos_emb.weight" not in self.weights:
            return self.weights
        return {
            **self.weights,
            "pos_emb.weight": self.weights["pos_emb.weight"][: model.block_size],
        }

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the weights as read (names, dtypes, shapes and bytes, in name order): the same
        however they are stored (a checkpoint of ours, its Hugging Face export), another if one
        value changed."""
        h = hashlib.sha256()
        for name in sorted(self.weights):
            t = self.weights[name].detach().cpu().contiguous()
            h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
        return h.hexdigest()


@dataclass
class Loaded:
    """A model ready to run (`load_model`) and what a script needs beside it."""

    model: GPT  # in eval mode, on the device asked for
    # its training config (made up for a Hugging Face folder: its model, a shipped dataset)
    config: Config
    tokenizer: Tokenizer
    tokenizer_meta: dict  # the tokenizer's metadata, to check a dataset against
    where: Path  # the checkpoint or model folder it was read from

    def dataset(self, data_dir: str | None = None) -> Dataset:
        """The dataset the model was trained on, checked against its tokenizer: in `data_dir`
        (--data-dir), else where its run recorded it (data.dir: absolute; an older version's
        relative one is taken from the folder the command runs in, as it was then). A known dataset
        not prepared is prepared there."""
        from data.dataset import META_FILE, dataset_folder, prepare_command
        from data.recipes import ready_dataset, recipes

        name = self.config.data.dataset
        recorded = self.config.data.dir
        folder = dataset_folder(name, data_dir or recorded)
        if not (folder / META_FILE).is_file() and name not in recipes():
            older = (
                f" (the run recorded data.dir {recorded!r}, relative: an older version's, read "
                "from the folder you run in)"
                if not data_dir and recorded and not Path(recorded).is_absolute()
                else ""
            )
            raise UserError(
                f"dataset {name!r}, which {self.where} was trained on, is not prepared in "
                f"{folder}{older}; give --data-dir with the folder it was prepared in "
                f"(prepare.py's --data-dir), or prepare it again: {prepare_command(folder)}"
            )
        return ready_dataset(name, data_dir or recorded, tokenizer_meta=self.tokenizer_meta)


# A reader of another format, handed in by a script: the model at a name that is not ours (a
# Hugging Face model folder, a hub name), converted and checked, or None where it is not of that
# format either.
OtherFormat = Callable[[str], "Pretrained | None"]


def load_pretrained(
    name: Path | str, merge: bool = True, other_format: OtherFormat | None = None
) -> Pretrained:
    """The model at `name`: a training run's folder (its best checkpoint, else its last), a
    checkpoint folder, or what `other_format` reads there. A LoRA checkpoint gives its base's
    weights (read with `other_format` too) with the adapters merged in, or with `merge` False,
    apart."""
    path = Path(name)
    if not is_ours(path):
        found = other_format(str(name)) if other_format is not None else None
        if found is not None:
            return found
        if other_format is None and (path / "config.json").is_file():  # no reader handed in
            raise UserError(
                f"{path} is a Hugging Face model folder: this command reads our checkpoints only"
            )
    try:
        ckpt = find(path)
    except UserError:
        if not path.is_dir():  # missing, or a file: find says which
            raise
        raise UserError(
            f"{path} holds no checkpoint ({WEIGHTS} with {CONFIG}, or a run's best/ or last/) and "
            "no Hugging Face model (it has no config.json); give a run's folder, a checkpoint or "
            "a model folder"
        ) from None
    cfg = ckpt.config()
    tokenizer_meta = ckpt.tokenizer_meta()
    about = describe(tokenizer_meta)
    if not ckpt.is_lora:
        return Pretrained(ckpt.folder, cfg.model, ckpt.weights(), tokenizer_meta, about, cfg)
    adapters, recorded = ckpt.adapters()
    weights = _base(recorded, ckpt, other_format).weights_for(cfg.model)
    if merge:
        from model.lora import merge

        weights, adapters = merge(weights, adapters, cfg.model, cfg.lora), None
    return Pretrained(ckpt.folder, cfg.model, weights, tokenizer_meta, about, cfg, adapters)


def is_ours(path: Path) -> bool:
    """Whether `path` is a checkpoint of ours (its config.yaml) or a training run's folder (best/ or
    last/), not another format's folder (a Hugging Face model's model.safetensors beside config.json
    looks like a checkpoint's)."""
    places = [path] + [path / name for name in ("best", "last", ".best.old", ".last.old")]
    return any((place / CONFIG).is_file() for place in places)


def lora_base(base: Pretrained) -> dict[str, str]:
    """What a LoRA checkpoint records of its base: the folder its weights come from, and their
    fingerprint."""
    return {"base": str(Path(base.where).resolve()), "base_sha256": base.fingerprint}


def base_of(ckpt: Checkpoint, other_format: OtherFormat | None = None) -> Pretrained:
    """The base model of LoRA checkpoint `ckpt`, read where it was trained from (`_base`)."""
    return _base(ckpt.adapters()[1], ckpt, other_format)


def _base(
    recorded: dict[str, str], ckpt: Checkpoint, other_format: OtherFormat | None
) -> Pretrained:
    """The base a LoRA checkpoint recorded (`lora_base`); one line if it has moved or its weights
    have changed since (the adapters would then apply to other weights)."""
    folder = Path(recorded["base"])
    what = f"the base model of LoRA checkpoint {ckpt}"
    if not folder.exists():
        raise UserError(
            f"{what}, {folder}, is missing (moved or deleted?); the checkpoint holds only the "
            "adapters: put the base back there (a symbolic link will do)"
        )
    try:
        base = load_pretrained(folder, other_format=other_format)
    except UserError as e:
        raise UserError(f"{what}, {folder}, cannot be read: {e}") from None
    if base.fingerprint != recorded["base_sha256"]:
        raise UserError(
            f"{what}, {folder}, has changed since the adapters were trained (its weights' sha256 "
            f"is {base.fingerprint[:12]}..., the checkpoint's {recorded['base_sha256'][:12]}...): "
            "put the original weights back there, or train the adapters again on the new ones"
        )
    return base


def load_model(
    path: Path | str,
    device: torch.device | str = "cpu",
    merge: bool = True,
    other_format: OtherFormat | None = None,
) -> Loaded:
    """The model at `path` (`load_pretrained`, `other_format` as there) built for sampling,
    evaluation and the heads tool, with its tokenizer. For a model of another format the config is
    made up: its model, and a shipped dataset with its tokenizer. A LoRA checkpoint's model has the
    adapters merged into its weights, or with `merge` False, beside them."""
    source = load_pretrained(path, merge, other_format)
    tokenizer_meta = source.tokenizer_meta
    if tokenizer_meta is None:
        raise UserError(
            f"{source.where} uses a tokenizer tinygpt cannot run: {source.tokenizer_about}; "
            "tinygpt runs char, GPT-2 BPE and its own bpe:N models"
        )
    if tokenizer_meta["vocab_size"] > source.model.vocab_size:
        raise UserError(
            f"{source.where}: its tokenizer has {tokenizer_meta['vocab_size']} tokens, more than "
            f"the model's vocabulary of {source.model.vocab_size}; the checkpoint is inconsistent"
        )
    tokenizer = from_meta(tokenizer_meta)
    cfg = source.config
    if cfg is None:
        dataset = "shakespeare_char" if tokenizer_meta["kind"] == "char" else "shakespeare"
        cfg = Config(model=source.model, data=DataConfig(dataset=dataset))
    model = GPT(source.model)
    weights = source.weights
    if source.adapters is not None:  # kept apart (merge False): adapters beside the base's weights
        from model.lora import add_lora

        add_lora(model, cfg.lora)
        weights = {**weights, **source.adapters}
    load_into(model, weights, source.where)
    return Loaded(model.to(device).eval(), cfg, tokenizer, tokenizer_meta, source.where)
