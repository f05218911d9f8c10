"""Tokenizers across the border: the files transformers reads for ours, and which of ours a folder
uses.

Export writes `tokenizer.json` (AutoTokenizer's PreTrainedTokenizerFast), `tokenizer_config.json`
and `tinygpt_tokenizer.json` (our own metadata, so tinygpt reads the folder back exactly). Notable:
- GPT-2 BPE is derived offline from the tiktoken ranks: the merges are rebuilt by running BPE on
  each token's bytes with only lower-ranked merges allowed, which stops at exactly the two pieces it
  is merged from; listed in rank order, they make the `tokenizers` BPE give tiktoken's ids on any
  text.
- char is a BPE with no merges, normaliser or pre-tokenizer; the tokenizer alone (not the model)
  gets <|endoftext|> after the characters, as an EOS that text never encodes to
  (`split_special_tokens`).
- a tokenizer whose metadata carries the `tokenizers` JSON (`tokenizer_json`) is written as it is.
Why (lm-eval, pipeline(), TransformerLens): docs/hugging-face.md. `tokenizer_of`: which of ours a
folder uses.
"""

from __future__ import annotations

import json
from functools import lru_cache
from itertools import pairwise
from pathlib import Path

from common import json_text
from common.errors import UserError
from data.bpe import BPETokenizer
from data.byte_level import BPE_ENCODINGS, EOT, byte_chars
from data.tokenizers import METADATA_FILE, check_meta, describe, from_meta

# --- GPT-2 BPE from tiktoken's ranks ---


@lru_cache(maxsize=1)
def _gpt2_ranks() -> dict[bytes, int]:
    tok = BPETokenizer("gpt2")
    return {b: i for i, b in enumerate(tok.token_bytes()) if i != tok.eot_token}


def gpt2_vocab() -> dict[str, int]:
    """GPT-2's vocab.json: each token in GPT-2's byte alphabet -> its id, and <|endoftext|>."""
    alphabet = byte_chars()
    vocab = {"".join(alphabet[b] for b in token): rank for token, rank in _gpt2_ranks().items()}
    vocab[EOT] = BPETokenizer("gpt2").eot_token
    return vocab


def _merged_from(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two tokens that BPE merges into `token`: its bytes, merged by the lower ranks until two
    remain."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        found = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(pairwise(parts))]
        best, i = min(found)
        if best >= rank:
            break
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} cannot be built from lower-ranked tokens")
    return parts[0], parts[1]


def gpt2_merges() -> list[tuple[str, str]]:
    """GPT-2's merges.txt, rebuilt from the ranks (about a second): one pair per multi-byte token,
    by rank."""
    ranks = _gpt2_ranks()
    alphabet = byte_chars()

    def text(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    by_rank = sorted((rank, token) for token, rank in ranks.items() if len(token) > 1)
    return [tuple(map(text, _merged_from(token, rank, ranks))) for rank, token in by_rank]


# --- writing ---


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise UserError(
            "export needs the tokenizers package (it comes with transformers): pip install -e "
            "'.[hf]'"
        ) from None
    return tokenizers


def _gpt2_json() -> str:
    tk = _tokenizers()
    vocab = gpt2_vocab()
    merges = gpt2_merges()
    tokenizer = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    tokenizer.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([tk.AddedToken(EOT, special=True)])
    return tokenizer.to_str()


def _char_json(chars: list[str]) -> str:
    tk = _tokenizers()
    tokenizer = tk.Tokenizer(tk.models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tokenizer.decoder = tk.decoders.Fuse()
    # id len(chars): the tools' BOS/EOS
    tokenizer.add_special_tokens([tk.AddedToken(EOT, special=True)])
    return tokenizer.to_str()


def _token_text(tokenizer_json: str, token: int) -> str | None:
    data = json.loads(tokenizer_json)
    added = {t["id"]: t["content"] for t in data.get("added_tokens", [])}
    vocab = {i: s for s, i in (data.get("model", {}).get("vocab") or {}).items()}
    return added.get(token, vocab.get(token))


def write_tokenizer(folder: Path, tokenizer_meta: dict, block_size: int) -> int | None:
    """Write the tokenizer files of `tokenizer_meta` into folder; its end-of-text token (None:
    none)."""
    # a trained BPE carries its tokenizers JSON: written as it is
    if "tokenizer_json" in tokenizer_meta:
        tokenizer_json = json_text.dumps(tokenizer_meta["tokenizer_json"], ensure_ascii=False)
    elif tokenizer_meta.get("kind") == "char":
        tokenizer_json = _char_json(tokenizer_meta["chars"])
    elif tokenizer_meta.get("kind") == "bpe" and tokenizer_meta.get("encoding") in BPE_ENCODINGS:
        tokenizer_json = _gpt2_json()
        (folder / "vocab.json").write_text(json_text.dumps(gpt2_vocab(), ensure_ascii=False))
        merges = "".join(f"{a} {b}\n" for a, b in gpt2_merges())
        (folder / "merges.txt").write_text("#version: 0.2\n" + merges, encoding="utf-8")
    else:
        raise UserError(
            f"cannot export the {describe(tokenizer_meta)} tokenizer; export supports char, gpt2 "
            "and bpe:N"
        )
    eot = from_meta(tokenizer_meta).eot_token
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": block_size,
        # decode exactly, never tidy spaces around punctuation
        "clean_up_tokenization_spaces": False,
    }
    if eot is not None:
        text = _token_text(tokenizer_json, eot)
        config |= {"bos_token": text, "eos_token": text}
    elif (
        tokenizer_meta.get("kind") == "char"
    ):  # the tokenizer's own <|endoftext|>, past the model's ids (see above)
        config |= {"eos_token": EOT, "split_special_tokens": True}
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json_text.dumps(config, indent=2, ensure_ascii=False)
    )
    (folder / METADATA_FILE).write_text(json_text.dumps(tokenizer_meta, indent=1))
    return eot


# --- reading ---


def tokenizer_of(folder: Path, model_type: str, vocab_size: int) -> tuple[dict | None, str]:
    """(our tokenizer metadata for the tokenizer of a Hugging Face folder, or None when it is none
    of ours; a few words on what it is). A GPT-2 model without tokenizer files, with room for
    GPT-2's vocabulary, is taken to use GPT-2's BPE."""
    # ours, written by export.py: checked as a checkpoint's is
    if (folder / METADATA_FILE).is_file():
        tokenizer_meta = _read_json(folder / METADATA_FILE)
        try:
            check_meta(tokenizer_meta)
        except ValueError as e:
            raise UserError(f"{folder / METADATA_FILE} is damaged ({e})") from None
        return tokenizer_meta, describe(tokenizer_meta)
    vocab = None
    if (folder / "tokenizer.json").is_file():
        vocab = _read_json(folder / "tokenizer.json").get("model", {}).get("vocab")
    elif (folder / "vocab.json").is_file():
        vocab = _read_json(folder / "vocab.json")
    gpt2 = BPETokenizer("gpt2").to_meta()
    if vocab is None:
        if model_type == "gpt2" and vocab_size >= gpt2["vocab_size"]:
            return gpt2, describe(gpt2)[:-1] + "; assumed: the folder has no tokenizer files)"
        return None, "unknown (the folder has no tokenizer files)"
    if isinstance(vocab, dict) and vocab == gpt2_vocab():
        return gpt2, describe(gpt2)
    return None, f"its own ({len(vocab)} tokens, not one of tinygpt's)"


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is damaged ({e})") from None
