"""Preparation that survives a stop: a split written shard by shard, and progress.json, what a rerun keeps.

A preparation writes each split in shards of about `shard_tokens` ids (data/shards.py names them). A shard
is written to a temporary file, flushed to the disk and renamed into place; then progress.json records it:
its file, ids, characters, bytes and documents, and `end`, the source's position after its last document
(a text file's byte offset, a Hugging Face dataset's rows and its iterator's state). However a preparation
stops (Ctrl-C, SIGKILL, a full disk, a dropped connection, a reboot), the next run of the same command
keeps the shards progress.json lists whose files are whole and continues the source from the last one's
`end`: at most one shard's worth of text is read again. progress.json also holds what the command asked
for (`command`: the source, the tokenizer, the shard size), which a rerun must match to keep anything, and
the tokenizer made at the start (a char vocabulary, a trained bpe:N), so a rerun does not make it again.
When the dataset is complete, meta.json lists the shards and progress.json goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common import json_text
from common.files import atomic_write, size_text, write_failed
from data.shards import SHARD_NAME, shard_name, single_name

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
    """An unfinished preparation in `folder`: what it was asked, its tokenizer, the shards it completed."""

    folder: Path
    command: dict
    tokenizer_meta: dict | None = None  # to_meta() of the tokenizer, once made
    dtype: str | None = None  # of the ids, from the tokenizer's vocabulary
    splits: dict[str, list[Shard]] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)  # the splits that are complete

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
            tokens, text = sum(s.tokens for s in shards), sum(s.bytes for s in shards)
            docs = sum(s.documents for s in shards)
            what = f"{len(shards)} shard{'s' if len(shards) > 1 else ''} ({tokens:,} tokens, "
            what += f"{docs:,} documents, " if self.command["source"].get("type") == "huggingface" else ""
            parts.append(
                f"{split}: {what}{size_text(text)} of text)" + (", done" if split in self.done else "")
            )
        return "; ".join(parts)


def _again() -> str:
    return (
        "free some space or fix the folder's permissions, then run the same command again: it continues "
        "from the last complete shard"
    )


def resume(folder: Path, command: dict) -> Preparation:
    """The preparation in `folder` to continue: progress.json's, when it was asked the same `command`, with
    the shards whose files are whole (a reboot can leave the last one short); else a fresh one, with every
    file an earlier preparation left removed. Says which, in one line on stderr."""
    old = _read(folder)
    if old is not None and old.command != command:
        differs = next(
            k for k in sorted(set(command) | set(old.command)) if command.get(k) != old.command.get(k)
        )
        print(
            f"the unfinished preparation in {folder} was asked for another {differs}: starting afresh",
            file=sys.stderr,
        )
        old = None
    if old is None:
        clear(folder)
        return Preparation(folder, command)
    for split, shards in old.splits.items():
        whole = 0
        while whole < len(shards) and _whole(folder / shards[whole].file, shards[whole].tokens, old):
            whole += 1
        if whole < len(shards) and split in old.done:
            old.done.remove(split)
        del shards[whole:]
    _remove_leftovers(folder, old)
    if any(old.splits.values()):
        print(f"continuing the preparation in {folder}: kept {old.kept()}", file=sys.stderr)
    return old


def unfinished(folder: Path, command: dict) -> bool:
    """Whether `folder` holds an unfinished preparation of `command` that `resume` would continue."""
    old = _read(folder)
    return old is not None and old.command == command


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
    """Remove what an earlier preparation left: the splits' files and shards, temporary files, progress."""
    for path in folder.iterdir():
        if _ours(path.name) or path.name == PROGRESS_FILE:
            with contextlib.suppress(OSError):
                path.unlink()


def _remove_leftovers(folder: Path, progress: Preparation) -> None:
    """Files of ours that progress.json does not list: temporary files of a stopped write, shards written
    after the last one it recorded."""
    listed = {s.file for shards in progress.splits.values() for s in shards}
    for path in folder.iterdir():
        if _ours(path.name) and path.name not in listed:
            with contextlib.suppress(OSError):
                path.unlink()


def final_files(progress: Preparation) -> dict[str, list[list]]:
    """The splits' files for meta.json, in order: a split of one shard renamed to train.bin (val.bin), as a
    dataset of one file per split has always been. Safe to repeat after a stop."""
    listed = {}
    for split, shards in progress.splits.items():
        if len(shards) == 1 and shards[0].file != single_name(split):
            source, target = progress.folder / shards[0].file, progress.folder / single_name(split)
            if source.exists():
                os.replace(source, target)
            shards[0].file = target.name
            progress.save()
        listed[split] = [[s.file, s.tokens] for s in shards]
    return listed


class ShardWriter:
    """One split's ids, written into shards of about `shard_tokens` (each whole tasks: a shard ends where a
    document, or a piece of a text file, ends), each recorded in progress.json once it is in place."""

    def __init__(self, progress: Preparation, split: str, dtype: np.dtype, shard_tokens: int, need: Callable):
        self.progress, self.split, self.dtype, self.shard_tokens = progress, split, dtype, shard_tokens
        self.need = need  # bytes the split needs, about (for the line a full disk gives)
        self.file, self.tmp = None, None
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
            self.file.write(
                ids.data
            )  # not tofile: its error lacks the errno (a full disk says "n requested")
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
        """Flush the shard to the disk, rename it into place, record it (in that order: what progress.json
        lists is on the disk)."""
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
        """A stop (Ctrl-C, an error): the shard in progress goes; the complete ones stay for the next run."""
        if self.file is not None:
            self._discard()
