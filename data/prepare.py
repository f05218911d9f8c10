"""Prepare a dataset: text -> tokenizer -> shards of ids -> meta.json. The one preparation path.

prepare.py is its command line; data/recipes.py runs it for a known dataset on first use.
`prepare_dataset` holds the folder's lock exclusive (data/dataset.py: no preparation under a run
that reads the dataset, nor beside another), makes or continues the preparation, and takes away a
folder it made when it fails before a shard is complete; data/shard_writer.py writes the shards,
progress.json and meta.json (last: a folder without it is not prepared). The tokenizer is made from
the text (`char`, `bpe:N`: data/tokenizers.py's `make_tokenizer` below), taken as it is (`gpt2`), or
given: an existing dataset's or checkpoint's (`tokenizer_from`, prepare.py's --tokenizer-from). What
a user sees of it is in docs/datasets.md.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from tqdm import tqdm

from common import json_text, locks
from common.errors import UserError
from common.files import write_failed
from data.bpe import BPETokenizer, TrainedBPE
from data.dataset import LOCK, META_FILE, Meta, token_dtype
from data.loader import SPLITS
from data.repeats import Repeats
from data.shard_writer import Preparation, continued, kept_shards, write_split
from data.sources import HFText, TextFile
from data.tokenizers import (
    METADATA_FILE,
    TOKENIZER_JSON,
    CharTokenizer,
    Tokenizer,
    UnknownCharacters,
    describe,
    from_meta,
    parse_spec,
)

BPE_TRAIN_CHARS = 1 << 30  # bpe:N learns from at most this much of the train split (about 1 GB)
# ids per shard (200 MB of uint16), as nanoGPT's and llm.c's FineWeb shards
SHARD_TOKENS = 100_000_000


@dataclass(frozen=True)
class Recipe:
    """A dataset's text and the tokenizer to make (the known ones are in data/recipes.py)."""

    source: Union[TextFile, HFText, Repeats]
    tokenizer: str  # "char", "bpe:N", or a tiktoken encoding ("gpt2")
    about: str = ""
    bpe_train_chars: int = BPE_TRAIN_CHARS


def already_prepared(out: Path) -> UserError:
    """The line for a dataset folder that holds a prepared dataset, which is replaced only when
    asked."""
    try:
        meta = Meta.read(out)
        what = f" ({meta.train_tokens:,} train tokens, {describe(meta.tokenizer_meta)})"
    except UserError:  # damaged: still the user's
        what = ""
    return UserError(
        f"dataset {out.name} is already prepared in {out}{what}; add --overwrite to replace it "
        "(runs trained on it then read the new data), or choose another name"
    )


def prepare_dataset(
    out: Path,
    recipe: Recipe,
    workers: Optional[int] = None,
    tokenizer: Optional[Tokenizer] = None,
    shard_tokens: int = SHARD_TOKENS,
    overwrite: bool = False,
) -> Meta:
    """Tokenise recipe's text into the dataset folder `out` (data/dataset.py's `dataset_folder`,
    resolved once by the caller): its splits in shards of about `shard_tokens` ids, and meta.json;
    returns the metadata. With `tokenizer` given (an existing dataset's or checkpoint's), it is used
    in place of the recipe's. A prepared dataset there is refused unless `overwrite`; an unfinished
    preparation of the same command is continued; a failure before any shard is complete takes away
    a folder it made. Holds the folder's lock, exclusive, meanwhile."""
    if (out / META_FILE).is_file() and not overwrite:
        raise already_prepared(out)
    # what a failure takes away
    made = [p for p in (out / LOCK, out, *out.parents) if not p.exists()]
    advice = "choose another --data-dir (data.dir for train.py), or fix the folder's permissions"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_failed(out, e, advice=advice) from None
    if not os.access(out, os.W_OK):
        raise UserError(f"cannot write dataset folder {out} (it is read-only); {advice}")
    what = f"dataset {out.name} ({out})"
    wait = (
        "a run reads it, or another prepare writes it: wait for it to end, or prepare under "
        "another name"
    )
    try:
        with locks.holding(out / LOCK, what, exclusive=True, advice=wait):
            if (out / META_FILE).is_file() and not overwrite:  # prepared meanwhile
                raise already_prepared(out)
            return _prepare(out, recipe, workers, tokenizer, shard_tokens)
    except BaseException:
        if not kept_shards(out):  # nothing to continue from: a folder made here goes
            if len(made) > 1:
                shutil.rmtree(made[-1], ignore_errors=True)
            elif made:
                made[0].unlink(missing_ok=True)
        raise


def _prepare(
    out: Path,
    recipe: Recipe,
    workers: Optional[int],
    tokenizer: Optional[Tokenizer],
    shard_tokens: int,
) -> Meta:
    """The preparation proper: shard by shard from where an unfinished one of the same command
    stopped (data/shard_writer.py). A fresh one reads the text for its tokenizer before anything in
    `out` changes, so a text that cannot be read leaves a dataset that was there whole."""
    recipe.source.check()
    command = {"source": recipe.source.to_meta(), "shard_tokens": shard_tokens}
    command["tokenizer"] = tokenizer.to_meta() if tokenizer is not None else recipe.tokenizer
    if tokenizer is None and parse_spec(recipe.tokenizer)[0] == "trained_bpe":
        command["bpe_train_chars"] = recipe.bpe_train_chars
    progress = continued(out, command)
    if progress is not None:  # its tokenizer, made once, is kept in progress.json for a rerun
        tokenizer = tokenizer or from_meta(progress.tokenizer_meta)
    else:  # a fresh one: the tokenizer is made before anything in `out` changes
        tokenizer = tokenizer or make_tokenizer(
            recipe.tokenizer, recipe.source, recipe.bpe_train_chars, out.name
        )
        progress = Preparation.start(
            out, command, tokenizer.to_meta(), token_dtype(tokenizer.vocab_size).name
        )
    for split in SPLITS:
        try:
            write_split(progress, split, recipe.source, tokenizer, workers or os.cpu_count() or 1)
        except UnknownCharacters:
            raise unknown_characters(tokenizer, recipe.source) from None
    return progress.complete(tokenizer, recipe.source.to_meta())


# --- a tokenizer taken from elsewhere (prepare.py --tokenizer-from) ---


def _tokenizer_meta_at(path: Path | str) -> dict:
    """The tokenizer metadata of a prepared dataset folder (its meta.json), a checkpoint folder or a
    model folder exported by tinygpt (its tinygpt_tokenizer.json), a training run's folder (its
    best/ or last/ checkpoint), or one of those JSON files; a Hugging Face tokenizer.json made by
    bpe:N (a dataset folder's) works too."""
    p = Path(path)
    if p.is_dir():
        names = (META_FILE, METADATA_FILE, TOKENIZER_JSON)
        found = [folder / n for folder in (p, p / "best", p / "last") for n in names]
        file = next((f for f in found if f.is_file()), None)
        if file is None:
            raise UserError(
                f"--tokenizer-from {path}: the folder holds no meta.json, {METADATA_FILE} or "
                f"{TOKENIZER_JSON}; give a prepared dataset folder (data/NAME) or a checkpoint or "
                "run folder (out/NAME)"
            )
    elif p.is_file():
        file = p
    else:
        raise UserError(
            f"--tokenizer-from {path}: no such file or folder; give a prepared dataset folder "
            "(data/NAME) or a checkpoint or run folder (out/NAME)"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--tokenizer-from {path}: cannot read {file} ({e})") from None
    except json.JSONDecodeError as e:
        raise UserError(
            f"--tokenizer-from {path}: {file} is not a tokenizer file (not JSON: {e})"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("tokenizer"), dict):  # a dataset's meta.json
        return data["tokenizer"]
    if isinstance(data, dict) and "kind" in data:  # a checkpoint's tokenizer metadata
        return data
    if isinstance(data, dict) and "model" in data:  # a Hugging Face tokenizer.json
        return TrainedBPE(json_text.dumps(data)).to_meta()
    raise UserError(
        f"--tokenizer-from {path}: {file} holds no tokenizer (expected a dataset's meta.json, a "
        f"checkpoint's {METADATA_FILE} or a Hugging Face {TOKENIZER_JSON})"
    )


def tokenizer_from(path: Path | str, drop_unknown: bool = False) -> Tokenizer:
    """The tokenizer of --tokenizer-from PATH; a char tokenizer drops unknown characters when
    asked."""
    tokenizer_meta = _tokenizer_meta_at(path)
    try:
        tokenizer = from_meta(tokenizer_meta)
    except UserError as e:
        raise UserError(f"--tokenizer-from {path}: {e}") from None
    if isinstance(tokenizer, CharTokenizer) and drop_unknown:
        tokenizer = CharTokenizer(tokenizer.chars, drop_unknown=True)
    return tokenizer


# --- the tokenizer a text makes ---
def first_chars(docs: Iterable[str], limit: int) -> Iterator[str]:
    """The documents up to `limit` characters in all (the last one cut)."""
    left = limit
    for doc in docs:
        if left <= 0:
            return
        yield doc[:left]
        left -= len(doc)


def train_bpe(source, vocab_size: int, max_chars: int, desc: str) -> TrainedBPE:
    """bpe:N: learn the tokenizer from (the first max_chars characters of) the train split,
    streamed."""
    start = time.perf_counter()
    with tqdm(desc=desc, unit="char", unit_scale=True, dynamic_ncols=True) as bar:

        def docs() -> Iterator[str]:
            for doc in first_chars(source.documents("train"), max_chars):
                bar.update(len(doc))
                yield doc

        tokenizer = interruptible(lambda: TrainedBPE.train(docs(), vocab_size))
        chars = bar.n
    short = (
        f" (the text has too few distinct pairs for {vocab_size})"
        if tokenizer.vocab_size < vocab_size
        else ""
    )
    print(
        f"trained {tokenizer.name}{short} on {chars:,} characters in "
        f"{time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return tokenizer


def interruptible(work):
    """work() in a daemon thread while this one waits in joins of 0.1 s, where Python handles
    signals: a Ctrl-C raises KeyboardInterrupt here within 0.1 s even while `work` runs native code
    that never checks for signals, and the process then exits without waiting for it."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as e:  # handed to the waiting thread
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    try:
        # start() is inside: it waits for the thread to begin, and a Ctrl-C can land there (a CI
        # run aborted so while the thread imported tokenizers)
        thread.start()
        while thread.is_alive():
            thread.join(0.1)
    except KeyboardInterrupt:
        # At exit Python would stop the still-running thread by unwinding it through the library's
        # native code, which aborts ("FATAL: exception not rethrown", exit -6): once the interrupt's
        # handlers have cleaned up and said so, the process leaves before that, with the interrupt's
        # code
        atexit.register(leave, 130)
        raise
    if "error" in result:
        raise result["error"]
    return result["value"]


def leave(code: int) -> None:
    """End the process now with `code`, what it printed flushed (no further exit handlers or
    finalization)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def make_tokenizer(spec: str, source, bpe_train_chars: int, name: str) -> Tokenizer:
    """The tokenizer a --tokenizer spec makes from a source's text: char's vocabulary is every
    character of both splits (one pass to find them), bpe:N is trained on the train split, gpt2 is
    taken as it is."""
    kind, size = parse_spec(spec)
    if kind == "char":
        return CharTokenizer.from_texts(doc for split in SPLITS for doc in source.documents(split))
    if kind == "trained_bpe":
        return train_bpe(source, size, bpe_train_chars, f"{name} training bpe:{size}")
    return BPETokenizer(kind)


def unknown_characters(tokenizer: CharTokenizer, source) -> UserError:
    """The error for text holding characters a char vocabulary lacks: all of them, from a pass over
    it."""
    vocab = set(tokenizer.chars)
    missing = set()
    count = 0
    for split in SPLITS:
        for doc in source.documents(split):
            new = set(doc) - vocab
            if new:
                missing |= new
                count += sum(doc.count(c) for c in new)
    shown = ", ".join(repr(c) for c in sorted(missing)[:20]) + (" ..." if len(missing) > 20 else "")
    return UserError(
        f"the text has {len(missing)} character(s) the char vocabulary lacks: {shown} ({count:,} "
        "in all); add --drop-unknown to leave them out"
    )
