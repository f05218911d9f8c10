"""A prepared dataset: its folder, found in one place; its metadata, typed and checked; its splits.

A dataset NAME lives in DATA_DIR/NAME (or in `data.dir`): each split's token ids (data/loader.py)
and meta.json, written last, so a folder without it is not prepared. Everything that reads a
dataset goes through `Dataset.open`: a damaged meta.json is one line naming the fix wherever it is
met, and the folder's lock is held shared while the process lives (preparing takes it exclusive).
A split is checked once per process when first used: file sizes, and every id against the
vocabulary.
"""

from __future__ import annotations

import functools
import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from common import json_text, locks
from common.errors import UserError
from data import DATA_DIR, loader
from data.loader import CHECKED_TOKENS, SPLITS, TokenFiles, TokenWindows
from data.tokenizers import Tokenizer, check_meta, from_meta, same

META_FILE = "meta.json"
DTYPES = ("uint16", "uint32")
LOCK = ".lock"  # in a dataset folder: exclusive while it is prepared, shared while it is read


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def dataset_folder(name: str, data_dir: str | Path | None = None) -> Path:
    """Where dataset `name` lives: data_dir/name (data_dir None: the project's data/ folder). A name
    is a name: one that is a path (`../x`, `a/b`) is refused, so nothing is read or written outside
    data_dir."""
    if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise UserError(
            f"dataset name {name!r} must be a plain folder name (letters, digits, _ - .), not a "
            "path"
        )
    return Path(data_dir if data_dir is not None else DATA_DIR) / name


def prepare_command(folder: Path) -> str:
    """The command that prepares a dataset of one's own text into `folder`, shell-quoted."""
    where = "" if folder.parent == DATA_DIR else f" --data-dir {shlex.quote(str(folder.parent))}"
    return (
        f"python prepare.py {shlex.quote(folder.name)}{where} --text-file FILE (or --hf-dataset "
        "NAME)"
    )


@dataclass(frozen=True)
class Meta:
    """A dataset's meta.json."""

    name: str
    tokenizer_meta: dict  # the tokenizer's metadata (data/tokenizers.py), meta.json's "tokenizer"
    vocab_size: int
    dtype: str  # of the ids in the bins: uint16 or uint32
    train_tokens: int
    val_tokens: int
    source: dict = field(default_factory=dict)  # where the text came from (for people)
    dropped_characters: int = 0  # characters a char vocabulary lacked, left out (--drop-unknown)
    # each split's files in order, [name, ids]; empty in a dataset from before shards: train.bin,
    # val.bin
    shards: dict = field(default_factory=dict)

    def tokens(self, split: str) -> int:
        return self.train_tokens if split == "train" else self.val_tokens

    def files(self, split: str) -> list[tuple[str, int]]:
        """The split's files in order, with the ids each holds."""
        if not self.shards:
            return [(loader.single_name(split), self.tokens(split))]
        return [(name, count) for name, count in self.shards[split]]

    def to_json(self) -> str:
        data = {_JSON_KEYS.get(k, k): v for k, v in asdict(self).items()}
        for key in ("dropped_characters", "shards"):
            if not data[key]:
                del data[key]
        return json_text.dumps(data, indent=1)

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
        # meta.json's key -> the field
        fields = {_JSON_KEYS.get(k, k): k for k in cls.__dataclass_fields__}
        return cls(**{fields[k]: v for k, v in data.items() if k in fields})


# a Meta field -> its key in meta.json, where they differ
_JSON_KEYS = {"tokenizer_meta": "tokenizer"}


def _meta_problem(data) -> str | None:
    """What is wrong with a meta.json's content, or None."""
    if not isinstance(data, dict):
        return f"it holds a {type(data).__name__}, not an object"
    for key in ("name", "tokenizer", "vocab_size", "dtype", "train_tokens", "val_tokens"):
        if key not in data:
            return f"it has no {key}"
    counts = ("vocab_size", "train_tokens", "val_tokens")
    if any(
        not isinstance(data[k], int) or isinstance(data[k], bool) or data[k] < 0 for k in counts
    ):
        return "vocab_size, train_tokens and val_tokens must be whole numbers"
    if data["vocab_size"] < 1:
        return "vocab_size must be positive"
    if data["dtype"] not in DTYPES:
        return f"dtype must be one of {', '.join(DTYPES)}, not {data['dtype']!r}"
    if np.iinfo(np.dtype(data["dtype"])).max < data["vocab_size"] - 1:
        return f"dtype {data['dtype']} cannot hold ids up to {data['vocab_size'] - 1}"
    try:
        check_meta(data["tokenizer"])
    except ValueError as e:
        return str(e)
    if data["tokenizer"]["vocab_size"] > data["vocab_size"]:
        return f"its tokenizer has {data['tokenizer']['vocab_size']} tokens, more than vocab_size"
    return _shards_problem(data.get("shards", {}), data)


def _shards_problem(listed, data: dict) -> str | None:
    """What is wrong with meta.json's list of shards (plain names of ours, counts that add up), or
    None."""
    if not listed:
        return None
    if not isinstance(listed, dict) or set(listed) != set(SPLITS):
        return f"its shards must list the files of {' and '.join(SPLITS)}"
    for split, files in listed.items():
        ok = (
            isinstance(files, list)
            and files
            and all(
                isinstance(f, list)
                and len(f) == 2
                and isinstance(f[0], str)
                and loader.SHARD_NAME.match(f[0])
                and isinstance(f[1], int)
                and not isinstance(f[1], bool)
                and f[1] >= 0
                for f in files
            )
        )
        if not ok:
            return (
                f"its {split} shards must be [file name, ids] pairs of {split}-NNNNN.bin or "
                f"{split}.bin files"
            )
        if sum(f[1] for f in files) != data[f"{split}_tokens"]:
            return f"its {split} shards do not add up to {split}_tokens"
    return None


def lock_reading(folder: Path) -> None:
    """Hold the dataset folder's lock, shared, until the process ends: no preparation starts
    meanwhile."""
    locks.hold(
        folder / LOCK,
        f"dataset {folder.name} ({folder})",
        exclusive=False,
        advice="it is being prepared: wait for the preparation to finish, then start again",
    )


@dataclass(frozen=True)
class Dataset:
    """A prepared dataset folder and its metadata."""

    folder: Path
    meta: Meta

    @classmethod
    def open(cls, name: str, data_dir: str | Path | None = None) -> Dataset:
        """The prepared dataset `name` in data_dir (None: data/); not prepared is one line saying
        how. The one way to open one (data/recipes.py's `ready_dataset` prepares it first where
        needed)."""
        folder = dataset_folder(name, data_dir)
        if not (folder / META_FILE).is_file():
            raise UserError(
                f"dataset {folder.name!r} is not prepared in {folder}; prepare it with: "
                f"{prepare_command(folder)}"
            )
        lock_reading(folder)
        return cls(folder, Meta.read(folder))

    @property
    def name(self) -> str:
        return self.folder.name

    def split(self, split: str) -> TokenFiles:
        """The split's ids, one sequence over its files, checked (once per process) against
        meta.json and the vocabulary."""
        names, counts = zip(*self.meta.files(split))
        files = TokenFiles.of([self.folder / n for n in names], self.meta.dtype)
        loader.check(files, counts, self.meta.vocab_size)
        return files

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer that made the ids, built once (on first use: a GPT-2 BPE may need its
        vocabulary downloaded, which a run that never decodes should not)."""
        return from_meta(self.meta.tokenizer_meta)

    def byte_lengths(self) -> np.ndarray | None:
        """The UTF-8 length of each token id, for bits per byte; None where the tokenizer cannot be
        loaded here (a BPE vocabulary that is not cached, offline), so training goes on without
        bpb."""
        try:
            return self.tokenizer.byte_lengths()
        except UserError:
            return None

    def windows(self, split: str, block_size: int, device: torch.device, seed: int) -> TokenWindows:
        """Random windows of block_size + 1 tokens from a split (data/loader.py)."""
        tokens = self.split(split)
        vocab = self.meta.vocab_size
        unchecked = self.meta.tokens(split) > CHECKED_TOKENS
        return TokenWindows(tokens, block_size, device, seed, split, vocab if unchecked else None)

    def all_windows(
        self, block_size: int, device: torch.device, seed: int
    ) -> dict[str, TokenWindows]:
        """`windows` of every split, as a run takes them (training/run.py's `start_run`; the dry run
        calls it to refuse what the run refuses: a split too short for one window)."""
        return {split: self.windows(split, block_size, device, seed) for split in SPLITS}

    def check_tokenizer(self, tokenizer_meta: dict, what: str) -> None:
        """Refuse a dataset tokenised otherwise than `tokenizer_meta` (a checkpoint's) says."""
        if not same(self.meta.tokenizer_meta, tokenizer_meta):
            raise UserError(
                f"the dataset in {self.folder} has another tokenizer than {what}; point --data-dir "
                "at the data the model was trained on"
            )
