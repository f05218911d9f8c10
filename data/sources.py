"""Where raw text comes from: a local text file, a Hugging Face dataset (hub or local files), or a
generator. A source yields a split's text ("train" or "val") lazily, as documents or as consecutive
pieces of one text (`separate_documents`), so a corpus larger than memory streams through.

`documents(split, start)` returns `Documents`, which say where the source stands after the last one
(`position()`, JSON-able) and start from such a position: what lets a stopped preparation continue
(data/shard_writer.py).
- `TextFile`: one UTF-8 file, read as common/user_text.py reads every text a person gives; its first
  (1 - val_fraction) of bytes are train, the rest val (as nanoGPT splits it); positions: byte
  offsets.
- `HFText`: `datasets.load_dataset(...)`, one document per row; every `val_every`-th goes to val (or
  `val_split`); streaming, its position is the iterator's own `state_dict()`: a resume skips nothing
  twice.
- `repeats` (data/repeats.py): synthetic sequences with repeated segments, for the induction study.
"""

from __future__ import annotations

import codecs
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Optional

from common.errors import UserError, first_line
from common.user_text import BOM, as_read, not_utf8
from data.byte_level import last_lossless_cut

BLOCK = 1 << 18  # bytes read at a time: one encoding task each (see data/encode.py: TASK_CHARS)


class Documents:
    """A split's documents in order (iterate over it once), and `position()`: where the source
    stands after the last one yielded, to start from again with `documents(split,
    start=position)`."""

    def __init__(
        self, docs: Iterator[str], position: Callable[[], object], size: Optional[int] = None
    ):
        self._docs = docs
        self.position = position
        # of the whole split, in the source's `unit`s, when known (the progress bar's total)
        self.size = size

    def __iter__(self) -> Iterator[str]:
        return self._docs


def counted(docs: Iterator[str], start: Optional[int]) -> Documents:
    """The documents of a source that can only start again from its beginning (data/repeats.py): the
    position is how many were yielded; starting from one skips that many (generated again, not
    encoded)."""
    state = {"n": start or 0}

    def gen() -> Iterator[str]:
        for doc in itertools.islice(docs, start or 0, None):
            state["n"] += 1
            yield doc

    return Documents(gen(), lambda: state["n"])


@dataclass(frozen=True)
class TextFile:
    path: str
    val_fraction: float = 0.1
    # its pieces are consecutive parts of one text: no end-of-text between them
    separate_documents = False

    def to_meta(self) -> dict:
        return {"type": "text_file", "path": self.path, "val_fraction": self.val_fraction}

    def check(self) -> None:
        """Fail early, before any progress bar, on a file that is missing or empty."""
        self._size()

    def split_bytes(self, split: str) -> int:
        """The split's size in bytes (about its characters)."""
        size = self._size()
        cut = self._split_offset(size)
        return cut if split == "train" else size - cut

    def _size(self) -> int:
        if not os.path.isfile(self.path):
            raise UserError(f"text file {self.path} not found; check the path (--text-file)")
        size = os.path.getsize(self.path)
        if size == 0:
            raise UserError(f"text file {self.path} is empty; give it some text to train on")
        return size

    def _split_offset(self, size: int) -> int:
        """Byte offset where val starts: (1 - val_fraction) of the file, moved to a UTF-8 character
        start (and past the LF of a CRLF, which is one line end)."""
        offset = int(size * (1.0 - self.val_fraction))
        with open(self.path, "rb") as f:
            f.seek(max(offset - 1, 0))
            before = f.read(1) if offset > 0 else b""
            tail = f.read(4)
        step = 0
        # continuation byte: not a character start
        while step < len(tail) and (tail[step] & 0xC0) == 0x80:
            step += 1
        if before == b"\r" and tail[:1] == b"\n":
            step = 1
        return offset + step

    unit = "B"  # the progress bar counts bytes

    def documents(self, split: str, start: Optional[int] = None) -> Documents:
        """The split as consecutive pieces of about BLOCK bytes, each ending at a newline where
        there is one: one between two characters that are not whitespace where there is one, so that
        BPE gives the ids of the whole text (see data.byte_level.split_losslessly). Each piece is
        read from where the one before it ended, so the pieces from a position are the same however
        the reading got there."""
        size = self._size()
        cut = self._split_offset(size)
        first, end = (0, cut) if split == "train" else (cut, size)
        state = {"at": first if start is None else start}
        return Documents(self._pieces(state, end), lambda: state["at"], end - first)

    def _pieces(self, state: dict, end: int) -> Iterator[str]:
        with open(self.path, "rb") as f:
            while state["at"] < end:
                pos = state["at"]
                f.seek(pos)
                raw = f.read(min(BLOCK, end - pos))
                last = pos + len(raw) >= end
                decoder = codecs.getincrementaldecoder("utf-8")()
                try:  # the bytes of a character cut at the block's end wait for the next piece
                    text = decoder.decode(raw, final=last)
                except UnicodeDecodeError as e:
                    raise not_utf8(self.path, raw, e, pos) from None
                cut = 0 if last else last_lossless_cut(text) or text.rfind("\n") + 1
                piece, rest = (text[:cut], text[cut:]) if cut > 0 else (text, "")
                # a \r\n cut in two would read as two line ends
                if not last and piece.endswith("\r"):
                    piece, rest = piece[:-1], "\r" + rest
                held = len(decoder.getstate()[0])  # bytes of a character the block cut
                state["at"] = end if last else pos + len(raw) - held - len(rest.encode("utf-8"))
                if pos == 0:  # a byte-order mark is not text (common/user_text.py)
                    piece = piece.removeprefix(BOM)
                if piece:
                    yield as_read(piece)


@dataclass(frozen=True)
class HFText:
    # hub name ("HuggingFaceFW/fineweb-edu"), a local folder, or a builder ("json", "parquet")
    path: str
    name: Optional[str] = None  # hub config, e.g. "sample-10BT"
    split: str = "train"
    text_column: str = "text"
    data_files: Optional[tuple[str, ...]] = None
    streaming: bool = False
    val_every: int = 200  # every val_every-th document goes to val ...
    val_split: Optional[str] = None  # ... unless the dataset has its own val split
    max_docs: Optional[int] = None  # stop after this many documents (to try a large corpus quickly)
    separate_documents = True  # rows are separate documents: <|endoftext|> after each (BPE)

    def to_meta(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if v is not None}
        if self.data_files:
            d["data_files"] = list(self.data_files)
        return {"type": "huggingface", **d}

    def _load(self, split: str):
        try:
            import datasets
        except ImportError:
            raise UserError(
                "reading a Hugging Face dataset needs the datasets package: pip install datasets"
            ) from None

        files = list(self.data_files) if self.data_files else None
        # text files are read as common/user_text.py reads any (datasets opens them in text mode:
        # \r\n is \n already), their byte-order mark removed too
        text = {"encoding": "utf-8-sig"} if self.path == "text" else {}
        try:
            return datasets.load_dataset(
                self.path,
                self.name,
                split=split,
                data_files=files,
                streaming=self.streaming,
                **text,
            )
        except (FileNotFoundError, ConnectionError, ValueError, OSError) as e:
            what = f"{self.path}" + (f" ({self.name})" if self.name else "")
            raise UserError(
                f"could not load Hugging Face dataset {what}, split {split!r}: {first_line(e)}. "
                "Check the name, config and split on huggingface.co/datasets, and your network "
                "(or HF_HUB_OFFLINE with a local copy)"
            ) from None
        except Exception as e:  # datasets raises its own classes (DatasetNotFoundError, ...)
            if isinstance(e.__cause__, UnicodeDecodeError):  # a data file in another encoding
                raise UserError(
                    f"a file of Hugging Face dataset {self.path} is not UTF-8 text "
                    f"({e.__cause__}); convert it, e.g. iconv -f latin1 -t utf-8 FILE > fixed.txt"
                ) from None
            if type(e).__module__.startswith(("datasets", "huggingface_hub", "fsspec")):
                raise UserError(
                    f"could not load Hugging Face dataset {self.path}: {str(e).splitlines()[0]}"
                ) from None
            raise

    def check(self) -> None:
        """Fail early on a dataset, split or column that does not exist."""
        self._columns(self._load(self.split))

    def _columns(self, ds) -> list[str]:
        columns = ds.column_names
        if columns is None:  # a streaming dataset may learn its columns only from the first row
            first = next(iter(ds), None)
            columns = list(first) if first is not None else []
        if self.text_column not in columns:
            raise UserError(
                f"column {self.text_column!r} is not in dataset {self.path}; it has: "
                f"{', '.join(columns) or 'no columns'} (choose one with --text-column)"
            )
        return columns

    unit = "doc"  # the progress bar counts documents

    def documents(self, split: str, start: Optional[dict] = None) -> Documents:
        """The split's non-empty rows of text_column. Position: {"rows": rows read, "docs":
        non-empty ones among them (val_every and max_docs count these), "state": the streaming
        iterator's state}."""
        which = self.split if split == "train" or self.val_split is None else self.val_split
        ds = self._load(which)
        self._columns(ds)
        ds = ds.select_columns([self.text_column])
        rows = self._size(ds, which)
        state = (
            {"rows": 0, "docs": 0}
            if start is None
            else {"rows": start["rows"], "docs": start["docs"]}
        )
        if start is not None and self.streaming:
            ds.load_state_dict(start["state"])
        elif start is not None:
            # contiguous: a slice of the table, nothing read
            ds = ds.select(range(start["rows"], len(ds)))
        if rows is not None and self.max_docs is not None:
            rows = min(rows, self.max_docs)
        if rows is not None and self.val_split is None:
            rows = rows // self.val_every if split == "val" else rows - rows // self.val_every

        def texts() -> Iterator[str]:
            for row in ds:
                state["rows"] += 1
                text = row[self.text_column]
                if not text:
                    continue
                i = state["docs"]
                if self.max_docs is not None and i >= self.max_docs:
                    return
                state["docs"] += 1
                if self.val_split is not None or (i % self.val_every == self.val_every - 1) == (
                    split == "val"
                ):
                    yield text

        def position() -> dict:
            return {**state, "state": ds.state_dict()} if self.streaming else dict(state)

        return Documents(texts(), position, rows)

    def _size(self, ds, which: str) -> Optional[int]:
        """The rows of the split, where the dataset says (a local table; the hub's metadata, not
        always)."""
        if not self.streaming:
            return len(ds)
        splits = getattr(ds.info, "splits", None)
        try:
            return int(splits[which].num_examples) or None if splits else None
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
