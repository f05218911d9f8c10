"""Tokenizers: characters (a vocabulary built from the corpus) here, and the byte-level BPEs
(GPT-2's, and bpe:N trained on your text) in data/bpe.py, which a character-level run never loads.

A tokenizer is described by a JSON-able dict, its metadata (`to_meta()`; called `tokenizer_meta`
wherever it is passed), stored in a dataset's meta.json and beside every checkpoint, rebuilt with
`from_meta()`, named by `describe()` and compared by `same()`; `parse_spec()` turns a --tokenizer
argument into a kind ("char", "bpe": a tiktoken encoding, "trained_bpe": bpe:N). Metadata read from
a file is checked by `check_meta` first: only what tinygpt writes is accepted, so a file never makes
tiktoken download another encoding. What each kind does: docs/datasets.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from common.errors import UserError

# our tokenizer metadata (to_meta) as a file: in checkpoint folders and in exported model folders
METADATA_FILE = "tinygpt_tokenizer.json"
# a tokenizer in Hugging Face's format (a bpe:N dataset's, a model folder's)
TOKENIZER_JSON = "tokenizer.json"


class UnknownCharacters(ValueError):
    """Text holds characters the character vocabulary lacks."""

    def __init__(self, missing: list[str]):
        self.missing = missing
        shown = ", ".join(repr(c) for c in missing[:20]) + (" ..." if len(missing) > 20 else "")
        super().__init__(f"{len(missing)} character(s) not in the vocabulary: {shown}")


def token_text(tokenizer, token: int) -> str:
    """One token as text to show: its characters; a byte-level BPE token holding part of a character
    (a UTF-8 sequence that the next tokens finish) shows the bytes it has, escaped as Python writes
    them (as \\xe6\\x97), not U+FFFD."""
    table = tokenizer.token_bytes() if hasattr(tokenizer, "token_bytes") else None  # BPE kinds only
    if table is None or not 0 <= token < len(table) or not table[token]:
        return tokenizer.decode([token])
    return table[token].decode("utf-8", errors="backslashreplace")


def encode_text(text: str, tokenizer: Tokenizer, where: str) -> np.ndarray:
    """Token ids of text; characters a character vocabulary lacks are one error naming them and
    `where`."""
    try:
        return tokenizer.encode(text)
    except UnknownCharacters as e:
        raise UserError(
            f"{where} has {e}; this model's vocabulary has only the characters of its training text"
        ) from None


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_token: int | None  # appended after each document when the vocabulary has one

    def encode(self, text: str) -> np.ndarray: ...
    # releases the GIL for the work
    def encode_batch(self, texts: list[str]) -> list[np.ndarray]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def stream_decoder(self) -> Callable[[list[int]], str]: ...
    def byte_lengths(self) -> np.ndarray: ...
    def to_meta(self) -> dict: ...


class CharTokenizer:
    """One token per character; ids follow the sorted order of the characters in the corpus.

    With drop_unknown, characters outside the vocabulary are left out of the ids instead of
    refused."""

    name = "char"
    eot_token = None

    def __init__(self, chars: Iterable[str], drop_unknown: bool = False):
        self.chars = sorted(set(chars))
        if not self.chars:
            raise UserError(
                "a character vocabulary needs at least one character: the text is empty"
            )
        self.vocab_size = len(self.chars)
        self.drop_unknown = drop_unknown
        codes = np.array([ord(c) for c in self.chars])
        # code point -> id, a table lookup (faster than a binary search); `_unknown` marks the rest
        dtype = np.uint16 if self.vocab_size < 1 << 16 else np.uint32
        self._unknown = np.iinfo(dtype).max
        self._ids = np.full(codes.max() + 2, self._unknown, dtype=dtype)
        self._ids[codes] = np.arange(self.vocab_size)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> CharTokenizer:
        seen = np.zeros(0x110000, dtype=bool)  # every Unicode code point
        for t in texts:
            seen[np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32)] = True
        return cls(chr(c) for c in np.flatnonzero(seen))

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = self._ids[np.minimum(codes, len(self._ids) - 1)]
        known = ids != self._unknown
        if known.all():
            return ids
        if self.drop_unknown:
            return ids[known]
        raise UnknownCharacters(sorted({chr(c) for c in codes[~known]}))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]  # numpy releases the GIL in the lookups and compares

    def decode(self, ids: Iterable[int]) -> str:
        n = self.vocab_size
        return "".join(self.chars[i] for i in ids if i < n)

    def stream_decoder(self) -> Callable[[list[int]], str]:
        return self.decode

    def byte_lengths(self) -> np.ndarray:
        return np.array([len(c.encode("utf-8")) for c in self.chars], dtype=np.int64)

    def to_meta(self) -> dict:
        return {"kind": "char", "vocab_size": self.vocab_size, "chars": self.chars}


def parse_spec(spec: str) -> tuple[str, int | None]:
    """A --tokenizer argument as (kind, size): ("char", None), ("trained_bpe", N) for bpe:N (the
    kinds of `to_meta`), (tiktoken encoding, None) for gpt2 (kind "bpe" in metadata)."""
    if not spec.startswith("bpe:"):
        return spec, None
    size = spec[len("bpe:") :]
    if not size.isdigit():
        raise UserError(
            f"tokenizer {spec!r}: the size after bpe: must be a whole number of tokens, e.g. "
            "bpe:4096"
        )
    from data.bpe import TrainedBPE  # a bpe:N spec only
    from data.byte_level import EOT

    n = int(size)
    least = TrainedBPE.min_size()
    if n < least:
        raise UserError(
            f"tokenizer {spec}: a byte-level BPE needs at least {least} tokens (the 256 bytes and "
            f"{EOT}) before its first merge; use bpe:N with N >= {least} (small models use "
            "512-8192)"
        )
    return "trained_bpe", n


def check_meta(tokenizer_meta) -> None:
    """A ValueError saying what is wrong with tokenizer metadata read from a file, unless it is what
    `to_meta` writes: char (distinct characters in order), GPT-2's BPE, or bpe:N (its tokenizers
    JSON)."""
    if not isinstance(tokenizer_meta, dict):
        raise ValueError(f"the tokenizer is a {type(tokenizer_meta).__name__}, not an object")
    kind, size = tokenizer_meta.get("kind"), tokenizer_meta.get("vocab_size")
    if kind not in ("char", "bpe", "trained_bpe"):
        raise ValueError(f"unknown tokenizer kind {kind!r} (expected char, bpe or trained_bpe)")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"the tokenizer's vocab_size is {size!r}, not a positive whole number")
    if kind == "char":
        chars = tokenizer_meta.get("chars")
        if not isinstance(chars, list) or not all(
            isinstance(c, str) and len(c) == 1 for c in chars
        ):
            raise ValueError("the char tokenizer's chars are not a list of single characters")
        if len(chars) != size:
            raise ValueError(
                f"the char tokenizer has {len(chars)} characters, not vocab_size {size}"
            )
        if chars != sorted(set(chars)):
            raise ValueError("the char tokenizer's characters are not each once, in order")
    elif kind == "bpe":
        from data.byte_level import BPE_ENCODINGS  # GPT-2's BPE: a metadata of that kind only

        encoding = tokenizer_meta.get("encoding")
        if encoding not in BPE_ENCODINGS:
            raise ValueError(f"the BPE encoding {encoding!r} is not one tinygpt writes (gpt2)")
    elif kind == "trained_bpe" and not isinstance(tokenizer_meta.get("tokenizer_json"), dict):
        raise ValueError("the trained tokenizer has no tokenizer_json object")


def from_meta(tokenizer_meta: dict) -> Tokenizer:
    """The tokenizer that metadata describes (`check_meta` first: damage is one line)."""
    try:
        check_meta(tokenizer_meta)
    except ValueError as e:
        raise UserError(f"the tokenizer metadata is damaged: {e}") from None
    kind, size = tokenizer_meta["kind"], tokenizer_meta["vocab_size"]
    if kind == "char":
        return CharTokenizer(tokenizer_meta["chars"])
    from data.bpe import BPETokenizer, TrainedBPE  # a BPE's metadata only

    if kind == "bpe":
        tokenizer = BPETokenizer(tokenizer_meta["encoding"])
    else:
        from common import json_text

        tokenizer = TrainedBPE(json_text.dumps(tokenizer_meta["tokenizer_json"]))
    if tokenizer.vocab_size != size:
        raise UserError(
            f"the tokenizer metadata is damaged: it says {size} tokens, the {tokenizer.name} "
            f"tokenizer has {tokenizer.vocab_size}"
        )
    return tokenizer


def describe(tokenizer_meta: dict) -> str:
    """A tokenizer's metadata in a few words, for messages."""
    kind = tokenizer_meta.get("kind")
    size = tokenizer_meta.get("vocab_size", len(tokenizer_meta.get("chars", ())))
    if kind == "char":
        return f"char ({size} characters)"
    if kind == "bpe":
        return f"{tokenizer_meta.get('encoding')} BPE ({size} tokens)"
    if kind == "trained_bpe":
        return f"bpe:{size} (a BPE trained on its dataset)"
    return f"{kind} ({size} tokens)"


def same(a: dict, b: dict) -> bool:
    """Whether two tokenizer metadata describe the same tokenizer (gpt2 is r50k_base): the one
    comparison of a checkpoint's, a dataset's and a model folder's tokenizers."""

    def canonical(tokenizer_meta: dict) -> dict:
        if tokenizer_meta.get("kind") == "bpe":
            encoding = tokenizer_meta["encoding"]
            from data.byte_level import BPE_ALIASES

            return {**tokenizer_meta, "encoding": BPE_ALIASES.get(encoding, encoding)}
        return tokenizer_meta

    return canonical(a) == canonical(b)


def bits_per_byte(total_nats: float, n_bytes: float) -> float | None:
    """Loss in bits per UTF-8 byte of text: comparable across tokenizers, unlike loss per token
    (None for no bytes: no figure rather than a nan).

    total_nats is the summed cross-entropy over the predicted tokens; n_bytes the UTF-8 bytes they
    stand for: `tokenizer.byte_lengths()[targets].sum()` (an <|endoftext|> counts 0 bytes)."""
    return total_nats / math.log(2) / n_bytes if n_bytes else None
