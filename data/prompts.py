"""Prompts for the scripts that take one (sample.py, heads.py, and train.py's samples): reading the
text of --prompt or --prompt-file, and encoding it into token ids with errors a person can act on.

A prompt file's last line end is dropped: editors end a file with one, and it is not part of the
prompt (a character model without a newline in its vocabulary would refuse the file).
"""

from __future__ import annotations

from common.errors import UserError
from common.user_text import read_user_text, user_text
from data.tokenizers import Tokenizer, encode_text


def read_prompt(prompt: str | None, prompt_file: str | None, tokenizer: Tokenizer) -> str:
    """The text of --prompt, or of the file --prompt-file names, read as every text a person gives
    is (common/user_text.py: a byte-order mark removed, CRLF read as LF), less a file's last line
    end; with neither, the default prompt."""
    if prompt_file is not None:
        # the editor's line end, not the prompt's: "ROMEO:\n" in a file is the prompt "ROMEO:"
        return read_user_text(prompt_file, "prompt file").removesuffix("\n")
    if prompt is None:
        return default_prompt(tokenizer)
    return user_text(prompt, "the prompt", "give it in UTF-8, or with --prompt-file")


def default_prompt(tokenizer: Tokenizer) -> str:
    """A newline for a character model; empty (the prompt becomes <|endoftext|>) for BPE."""
    return "\n" if tokenizer.eot_token is None else ""


def encode_prompt(text: str, tokenizer: Tokenizer, block_size: int | None) -> list[int]:
    """The prompt's ids: an empty prompt is <|endoftext|> (BPE); it must fit the model's context
    (None: a model that reads any length, GPTConfig.context_limit)."""
    if text == "" and tokenizer.eot_token is not None:
        return [tokenizer.eot_token]
    if text == "":
        raise UserError("the prompt is empty; give some text with --prompt")
    ids = encode_text(text, tokenizer, "the prompt").tolist()
    if block_size is not None and len(ids) > block_size:
        raise UserError(
            f"the prompt is {len(ids)} tokens, longer than the model's context of {block_size}; "
            "shorten it"
        )
    return ids
