"""A prepared dataset: its folder, found in one place; its metadata, typed and checked; its splits.

A dataset NAME lives in DATA_DIR/NAME (or in the folder `data.dir` names): train.bin and val.bin hold the
token ids back to back, meta.json says which tokenizer made them, in which dtype, and how many there are.
meta.json is written last, so a folder without it is not prepared (data/prepare.py writes all three).
Everything that reads a dataset (training, evaluation, heads.py, the dry run) goes through `Dataset.open`, so
the folder is worked out once and a damaged meta.json is one line naming the fix, wherever it is met.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError
from data.loader import TokenWindows
from data.tokenizers import Tokenizer, from_meta

DATA_DIR = Path(__file__).resolve().parent  # the project's data/ folder: the default data.dir
META_FILE = "meta.json"
SPLITS = ("train", "val")
DTYPES = ("uint16", "uint32")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def dataset_folder(name: str, data_dir: str | Path | None = None) -> Path:
    """Where dataset `name` lives: data_dir/name (data_dir None: the project's data/ folder). A name is a
    name: one that is a path (`../x`, `a/b`) is refused, so nothing is read or written outside data_dir."""
    if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise UserError(
            f"dataset name {name!r} must be a plain folder name (letters, digits, _ - .), not a path"
        )
    return Path(data_dir if data_dir is not None else DATA_DIR) / name


@dataclass(frozen=True)
class Meta:
    """A dataset's meta.json."""

    name: str
    tokenizer: dict  # the tokenizer's metadata (data.tokenizers: to_meta / from_meta)
    vocab_size: int
    dtype: str  # of the ids in the bins: uint16 or uint32
    train_tokens: int
    val_tokens: int
    source: dict = field(default_factory=dict)  # where the text came from (for people)
    dropped_characters: int = 0  # characters a char vocabulary lacked, left out (--drop-unknown)

    def tokens(self, split: str) -> int:
        return self.train_tokens if split == "train" else self.val_tokens

    def to_json(self) -> str:
        data = asdict(self)
        if not self.dropped_characters:
            del data["dropped_characters"]
        return json.dumps(data, indent=1)

    @classmethod
    def read(cls, folder: Path) -> Meta:
        """The meta.json of a prepared dataset folder, checked field by field."""
        path = folder / META_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(
                f"dataset folder {folder} is not prepared (no {META_FILE}); run: python prepare.py "
                f"{folder.name} ..."
            ) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"{path} is damaged ({e}); prepare the dataset again") from None
        problem = _meta_problem(data)
        if problem:
            raise UserError(f"{path} is damaged: {problem}; prepare the dataset again")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _meta_problem(data) -> str | None:
    """What is wrong with a meta.json's content, or None."""
    if not isinstance(data, dict):
        return f"it holds a {type(data).__name__}, not an object"
    for key in ("name", "tokenizer", "vocab_size", "dtype", "train_tokens", "val_tokens"):
        if key not in data:
            return f"it has no {key}"
    counts = ("vocab_size", "train_tokens", "val_tokens")
    if any(not isinstance(data[k], int) or isinstance(data[k], bool) or data[k] < 0 for k in counts):
        return "vocab_size, train_tokens and val_tokens must be whole numbers"
    if data["vocab_size"] < 1:
        return "vocab_size must be positive"
    if data["dtype"] not in DTYPES:
        return f"dtype must be one of {', '.join(DTYPES)}, not {data['dtype']!r}"
    if np.iinfo(np.dtype(data["dtype"])).max < data["vocab_size"] - 1:
        return f"dtype {data['dtype']} cannot hold ids up to {data['vocab_size'] - 1}"
    if not isinstance(data["tokenizer"], dict) or "kind" not in data["tokenizer"]:
        return "tokenizer must be an object with a kind"
    return None


@dataclass(frozen=True)
class Dataset:
    """A prepared dataset folder and its metadata."""

    folder: Path
    meta: Meta

    @classmethod
    def open(cls, name: str, data_dir: str | Path | None = None) -> Dataset:
        """The prepared dataset `name` in data_dir (None: data/); not prepared is one line saying how."""
        folder = dataset_folder(name, data_dir)
        if not (folder / META_FILE).is_file():
            raise UserError(
                f"dataset {name!r} is not prepared in {folder}; prepare it with: python prepare.py {name} "
                "--text-file FILE (or --hf-dataset NAME)"
            )
        return cls(folder, Meta.read(folder))

    @staticmethod
    def is_prepared(name: str, data_dir: str | Path | None = None) -> bool:
        return (dataset_folder(name, data_dir) / META_FILE).is_file()

    @property
    def name(self) -> str:
        return self.folder.name

    def split_path(self, split: str) -> Path:
        return self.folder / f"{split}.bin"

    def tokenizer(self) -> Tokenizer:
        return from_meta(self.meta.tokenizer)

    def windows(self, split: str, block_size: int, device: torch.device, seed: int) -> TokenWindows:
        """Random windows of block_size + 1 tokens from a split (data/loader.py)."""
        return TokenWindows(self.split_path(split), self.meta.dtype, block_size, device, seed, split)

    def check_tokenizer(self, tokenizer_meta: dict, what: str) -> None:
        """Refuse a dataset tokenised otherwise than `tokenizer_meta` (a checkpoint's) says."""
        if self.meta.tokenizer != tokenizer_meta:
            raise UserError(
                f"the dataset in {self.folder} has another tokenizer than {what}; point --data-dir at the "
                "data the model was trained on"
            )
