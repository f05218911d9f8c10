"""GPT-2's byte-level conventions, shared by the BPE kinds and the files that carry them (hf/,
gguf_export/).

- `byte_alphabet`: the 256 printable characters that stand for the bytes in a byte-level BPE's
  vocabulary and merges (tokenizer.json's and GGUF's); `byte_chars` is its inverse.
- Lossless cuts: between two characters that are not whitespace, GPT-2's split pattern makes a
  newline a pre-token of its own, so a text cut after it encodes to the same ids as the whole.
  `split_losslessly` cuts a long text into pieces (the `tokenizers` library needs ~150 bytes per
  byte of a text it encodes); `last_lossless_cut` is where a text file's block may end
  (data/sources.py).
"""

from __future__ import annotations

from functools import lru_cache

# GPT-2's end-of-text token, which opens a document (and ends the one before)
EOT = "<|endoftext|>"
# the tiktoken encodings tinygpt prepares data with: GPT-2's BPE, by both its names
BPE_ENCODINGS = ("gpt2", "r50k_base")
BPE_ALIASES = {"gpt2": "r50k_base"}
PIECE_CHARS = 1 << 16  # characters per piece of a long text (bounded memory, the same ids)


def byte_alphabet() -> dict[str, int]:
    """The byte-level alphabet of GPT-2: the printable Latin-1 bytes stand for themselves, the other
    bytes (controls, space, 0x7f-0xa0, 0xad) for U+0100, U+0101, ... in byte order."""
    kept = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    moved = iter(range(256, 512))
    return {chr(b if b in kept else next(moved)): b for b in range(256)}


@lru_cache(maxsize=1)
def byte_chars() -> dict[int, str]:
    """Byte -> the character that stands for it in `byte_alphabet`."""
    return {b: c for c, b in byte_alphabet().items()}


def _lossless_newline(text: str, j: int) -> bool:
    """Whether text can be cut after the newline at j without changing any id: between two
    characters that are not whitespace, GPT-2's split pattern makes the newline a pre-token of its
    own, cut or not."""
    return 0 < j < len(text) - 1 and not text[j - 1].isspace() and not text[j + 1].isspace()


def last_lossless_cut(text: str) -> int:
    """The offset just after the last newline where text can be cut losslessly; 0 if there is
    none."""
    j = text.rfind("\n", 0, len(text) - 1)
    while j > 0 and not _lossless_newline(text, j):
        j = text.rfind("\n", 0, j)
    return j + 1 if j > 0 else 0


def split_losslessly(text: str, size: int = PIECE_CHARS) -> list[str]:
    """text cut into pieces of about `size` characters that encode to the ids of the whole text (a
    text with no newline to cut at stays whole)."""
    pieces = []
    start = 0
    pos = size
    while (j := text.find("\n", pos, len(text) - 1)) >= 0:
        if _lossless_newline(text, j):
            pieces.append(text[start : j + 1])
            start, j = j + 1, j + size
        pos = j + 1
    pieces.append(text[start:])
    return pieces
