"""A preparation's files: its shards written whole, progress.json to continue from, meta.json at the
end.

The one owner of what a preparation leaves in its folder. A shard (data/loader.py names it) is
written to a temporary file, flushed to the disk and renamed into place; only then does
progress.json record it, with the source's position after its last document (`end`). A rerun of the
same command (progress.json's `command` must match) keeps the listed shards whose files are whole,
takes the tokenizer made at the start from progress.json, and continues the source from the last
`end`: at most one shard's worth of text is read again. When the dataset is complete, meta.json
(data/dataset.py) lists the shards and progress.json goes. What a user sees of it: docs/datasets.md,
"A preparation that stops".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import json_text
from common.errors import UserError
from common.files import atomic_write, size_text, write_failed
from data.bpe import TrainedBPE
from data.dataset import META_FILE, Meta
from data.encode import Encoded, encode_stream
from data.loader import SHARD_NAME, shard_name, single_name
from data.tokenizers import TOKENIZER_JSON, CharTokenizer, Tokenizer

PROGRESS_FILE = "progress.json"
VERSION = 1


@dataclass
class Shard:
    """One complete shard of a split, as progress.json records it."""

    file: str
    tokens: int
    chars: int
    bytes: int
    documents: int
    end: object  # the source's position after the shard's last document (JSON)


@dataclass
class Preparation:
    """A preparation in `folder`: what it was asked, its tokenizer, the shards it completed."""

    folder: Path
    command: dict
    tokenizer_meta: dict  # to_meta() of the tokenizer, made before the first shard
    dtype: str  # of the ids, from the tokenizer's vocabulary
    splits: dict[str, list[Shard]] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)  # the splits that are complete

    @classmethod
    def start(cls, folder: Path, command: dict, tokenizer_meta: dict, dtype: str) -> Preparation:
        """A fresh preparation of `command`, recorded in progress.json, once every file an earlier
        one left is gone (meta.json too: with --overwrite, not a dataset until the new one
        lands)."""
        clear(folder)
        progress = cls(folder, command, tokenizer_meta, dtype)
        progress.save()
        return progress

    def save(self) -> None:
        data = {"version": VERSION, **dataclasses.asdict(self)}
        del data["folder"]
        atomic_write(self.folder / PROGRESS_FILE, json_text.dumps(data), advice=_again())

    def shards(self, split: str) -> list[Shard]:
        return self.splits.setdefault(split, [])

    def kept(self) -> str:
        """What was kept, for the line that says so: 'train: 3 shards (...), done; val: ...'."""
        parts = []
        for split, shards in self.splits.items():
            if not shards:
                continue
            tokens = sum(s.tokens for s in shards)
            text = sum(s.bytes for s in shards)
            docs = sum(s.documents for s in shards)
            what = f"{len(shards)} shard{'s' if len(shards) > 1 else ''} ({tokens:,} tokens, "
            what += (
                f"{docs:,} documents, "
                if self.command["source"].get("type") == "huggingface"
                else ""
            )
            parts.append(
                f"{split}: {what}{size_text(text)} of text)"
                + (", done" if split in self.done else "")
            )
        return "; ".join(parts)

    def complete(self, tokenizer: Tokenizer, source: dict) -> Meta:
        """The dataset this preparation made, in meta.json, written last: its shards listed (a split
        of one renamed to train.bin, val.bin), after bpe:N's tokenizer.json (as Hugging Face loads
        it); progress.json goes. Safe to repeat after a stop."""
        dropped = 0
        if isinstance(tokenizer, CharTokenizer):  # one token per character, none between documents
            dropped = sum(s.chars - s.tokens for shards in self.splits.values() for s in shards)
            if dropped:
                print(
                    f"dropped {dropped:,} character(s) the vocabulary lacks (--drop-unknown)",
                    file=sys.stderr,
                )
        meta = Meta(
            name=self.folder.name,
            tokenizer_meta=tokenizer.to_meta(),
            vocab_size=tokenizer.vocab_size,
            dtype=self.dtype,
            train_tokens=sum(s.tokens for s in self.shards("train")),
            val_tokens=sum(s.tokens for s in self.shards("val")),
            source=source,
            dropped_characters=dropped,
            shards=final_files(self),
        )
        if isinstance(tokenizer, TrainedBPE):
            atomic_write(self.folder / TOKENIZER_JSON, tokenizer.to_json(pretty=True))
        atomic_write(self.folder / META_FILE, meta.to_json())
        (self.folder / PROGRESS_FILE).unlink(missing_ok=True)
        return meta


def _again() -> str:
    return (
        "free some space or fix the folder's permissions, then run the same command again: it "
        "continues from the last complete shard"
    )


def continued(folder: Path, command: dict) -> Preparation | None:
    """The unfinished preparation in `folder` to continue, when progress.json says it was asked the
    same `command`: with the shards whose files are whole (a reboot can leave the last one short),
    what they do not list removed, meta.json too. None otherwise (nothing is removed:
    `Preparation.start` does that once the tokenizer is made). Says which, in one line on stderr."""
    old = _read(folder)
    if old is not None and old.command != command:
        differs = next(
            k
            for k in sorted(set(command) | set(old.command))
            if command.get(k) != old.command.get(k)
        )
        print(
            f"the unfinished preparation in {folder} was asked for another {differs}: starting "
            "afresh",
            file=sys.stderr,
        )
        return None
    if old is None:
        return None
    for split, shards in old.splits.items():
        whole = 0
        while whole < len(shards) and _whole(
            folder / shards[whole].file, shards[whole].tokens, old
        ):
            whole += 1
        if whole < len(shards) and split in old.done:
            old.done.remove(split)
        del shards[whole:]
    _remove_leftovers(folder, old)
    # --overwrite: not a dataset until the new one lands
    (folder / META_FILE).unlink(missing_ok=True)
    if any(old.splits.values()):
        print(f"continuing the preparation in {folder}: kept {old.kept()}", file=sys.stderr)
    return old


def kept_shards(folder: Path) -> bool:
    """Whether a stopped preparation in `folder` completed a shard the same command would continue
    from."""
    old = _read(folder)
    return old is not None and bool(old.splits.get("train"))


def _read(folder: Path) -> Preparation | None:
    """progress.json, or None when there is none or it is not one this version wrote."""
    try:
        data = json.loads((folder / PROGRESS_FILE).read_text(encoding="utf-8"))
        if data.pop("version") != VERSION:
            return None
        splits = {k: [Shard(**s) for s in v] for k, v in data.pop("splits").items()}
        return Preparation(folder, splits=splits, **data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _whole(path: Path, tokens: int, progress: Preparation) -> bool:
    itemsize = np.dtype(progress.dtype).itemsize
    try:
        return path.stat().st_size == tokens * itemsize
    except OSError:
        return False


def _ours(name: str) -> bool:
    """A file a preparation writes: a split's file or shard, or a temporary one of them."""
    return bool(SHARD_NAME.match(name)) or (name.startswith((".train", ".val")) and ".tmp-" in name)


def clear(folder: Path) -> None:
    """Remove what an earlier preparation left: the splits' files and shards, temporary files,
    progress, and meta.json."""
    for path in folder.iterdir():
        if _ours(path.name) or path.name in (PROGRESS_FILE, META_FILE):
            with contextlib.suppress(OSError):
                path.unlink()


def _remove_leftovers(folder: Path, progress: Preparation) -> None:
    """Files of ours that progress.json does not list: temporary files of a stopped write, shards
    written after the last one it recorded."""
    listed = {s.file for shards in progress.splits.values() for s in shards}
    for path in folder.iterdir():
        if _ours(path.name) and path.name not in listed:
            with contextlib.suppress(OSError):
                path.unlink()


def final_files(progress: Preparation) -> dict[str, list[list]]:
    """The splits' files for meta.json, in order: a split of one shard renamed to train.bin
    (val.bin), as a dataset of one file per split has always been. Safe to repeat after a stop."""
    listed = {}
    for split, shards in progress.splits.items():
        if len(shards) == 1 and shards[0].file != single_name(split):
            source = progress.folder / shards[0].file
            target = progress.folder / single_name(split)
            if source.exists():
                os.replace(source, target)
            shards[0].file = target.name
            progress.save()
        listed[split] = [[s.file, s.tokens] for s in shards]
    return listed


class ShardWriter:
    """One split's ids, written into shards of about `shard_tokens` (each whole tasks: a shard ends
    where a document, or a piece of a text file, ends), each recorded in progress.json once it is in
    place."""

    def __init__(
        self, progress: Preparation, split: str, dtype: np.dtype, shard_tokens: int, need: Callable
    ):
        self.progress = progress
        self.split = split
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.need = need  # bytes the split needs, about (for the line a full disk gives)
        self.file = None
        self.tmp = None
        self._reset()

    def _reset(self) -> None:
        self.tokens = self.chars = self.bytes = self.documents = 0
        self.end = None

    @property
    def final(self) -> Path:
        return self.progress.folder / shard_name(self.split, len(self.progress.shards(self.split)))

    def add(self, ids: np.ndarray, chars: int, n_bytes: int, documents: int, end: object) -> None:
        """A task's ids, with the text they came from and the source's position after it."""
        try:
            if self.file is None:
                final = self.final
                self.tmp = final.with_name(f".{final.stem}.tmp-{os.getpid()}{final.suffix}")
                self.file = open(self.tmp, "wb")  # noqa: SIM115 (closed in _close)
            # not tofile: its error lacks the errno (a full disk says "n requested")
            self.file.write(ids.data)
        except OSError as e:
            self._discard()
            raise write_failed(self.final, e, self.need(), _again()) from None
        self.tokens += len(ids)
        self.chars, self.bytes, self.documents = (
            self.chars + chars,
            self.bytes + n_bytes,
            self.documents + documents,
        )
        self.end = end
        if self.tokens >= self.shard_tokens:
            self._close()

    def finish(self) -> None:
        """The last shard, however short, and the split marked done."""
        if self.file is not None:
            self._close()
        self.progress.done.append(self.split)
        self.progress.save()

    def _close(self) -> None:
        """Flush the shard to the disk, rename it into place, record it (in that order: what
        progress.json lists is on the disk)."""
        final = self.final
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None
            os.replace(self.tmp, final)
        except OSError as e:
            self._discard()
            raise write_failed(final, e, self.need(), _again()) from None
        shard = Shard(final.name, self.tokens, self.chars, self.bytes, self.documents, self.end)
        self.progress.shards(self.split).append(shard)
        self.progress.save()
        self._reset()

    def _discard(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                self.tmp.unlink()

    def abandon(self) -> None:
        """A stop (Ctrl-C, an error): the shard in progress goes; the complete ones stay for the
        next run."""
        if self.file is not None:
            self._discard()


# --- writing a split, shard by shard ---


def write_split(
    progress: Preparation, split: str, source, tokenizer: Tokenizer, workers: int
) -> None:
    """Encode the split (data/encode.py) into shards from where progress.json says it stopped; a
    split done already is passed over. A failed write is one line: the space the split needs is
    extrapolated from what was written, when the split's size is known; so is a source that fails (a
    dropped connection). A split with no ids is one line too."""
    if split not in progress.done:
        _write(progress, split, source, tokenizer, workers)
    if not sum(s.tokens for s in progress.shards(split)):
        raise UserError(
            f"dataset {progress.folder.name}: the {split} split is empty; give the source more "
            "text (or a val split / val fraction that selects some of it)"
        )


def _write(progress: Preparation, split: str, source, tokenizer: Tokenizer, workers: int) -> None:
    dtype = np.dtype(progress.dtype)
    kept = progress.shards(split)
    eot = tokenizer.eot_token if source.separate_documents else None
    docs = source.documents(split, kept[-1].end if kept else None)
    unit = {"B": "bytes", "doc": "documents", "char": "chars"}[source.unit]
    done = {k: sum(getattr(s, k) for s in kept) for k in ("tokens", "chars", "bytes", "documents")}

    def need() -> int | None:  # the whole split's bytes, from what was encoded so far
        return int(done["tokens"] * dtype.itemsize * docs.size / done[unit]) if docs.size else None

    writer = ShardWriter(progress, split, dtype, progress.command["shard_tokens"], need)
    bar = tqdm(
        desc=f"{progress.folder.name} {split}",
        unit=source.unit,
        unit_scale=True,
        total=docs.size,
        initial=done[unit],
        dynamic_ncols=True,
    )
    try:
        with bar:
            for encoded in _reading(
                encode_stream(docs, tokenizer, eot, dtype, workers), source, progress
            ):
                for k in done:
                    done[k] += len(encoded.ids) if k == "tokens" else getattr(encoded, k)
                writer.add(
                    encoded.ids, encoded.chars, encoded.bytes, encoded.documents, encoded.end
                )
                bar.update(getattr(encoded, unit))
                text = "" if unit == "bytes" else f", text={size_text(done['bytes'])}"
                bar.set_postfix_str(f"tokens={done['tokens']:,}{text}", refresh=False)
            writer.finish()
    except BaseException:
        writer.abandon()
        raise


def _reading(encoded: Iterator[Encoded], source, progress: Preparation) -> Iterator[Encoded]:
    """`encoded`, with a source that fails on the way (a dropped connection, an unreadable file)
    turned into one line that says what is kept."""
    try:
        yield from encoded
    except Exception as e:
        library = type(e).__module__.split(".")[0]
        if not isinstance(e, OSError) and library not in SOURCE_ERRORS:
            raise
        kept = progress.kept() or "nothing yet"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"reading {source.to_meta().get('path')} failed ({reason}); kept {kept}: run the same "
            "command again to continue from there"
        ) from None


SOURCE_ERRORS = {
    "datasets",
    "huggingface_hub",
    "fsspec",
    "aiohttp",
    "requests",
    "httpx",
    "urllib3",
    "pyarrow",
}
