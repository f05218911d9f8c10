"""Text a person gives tinygpt, read one way everywhere: prompts, --text-file, local text datasets,
the lines of a JSON Lines file (`json_line`).

UTF-8; a byte-order mark at the start (Notepad writes one) is removed; line ends are read as text
mode reads them (\r\n and a lone \r become \n), so a file saved on Windows gives the same tokens as
on Linux. A file that is not UTF-8 is one error naming the first bad byte and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.errors import UserError

BOM = "\ufeff"  # U+FEFF at the start of a file: a byte-order mark (b"\xef\xbb\xbf" in UTF-8)
BOM_BYTES = BOM.encode("utf-8")


def as_read(text: str) -> str:
    """Line ends as Python's text mode reads them: \\r\\n and a lone \\r become \\n."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def not_utf8(
    path: Path | str, raw: bytes, error: UnicodeDecodeError, offset: int = 0, what: str = ""
) -> UserError:
    """The one line for a file that is not UTF-8: the first bad byte, its offset in the file
    (`offset`: where `raw` starts), and how to convert the file."""
    byte = raw[error.start]
    at = offset + error.start
    return UserError(
        f"{what + ' ' if what else ''}{path} is not UTF-8 text (byte 0x{byte:02x} at offset {at}); "
        f"convert it, e.g. iconv -f latin1 -t utf-8 {path} > fixed.txt"
    )


def user_text(text: str, what: str, fix: str) -> str:
    """Text given on the command line or in a config (`what`: "the prompt"), read by the same rule
    as a file's; a string that is not UTF-8 is one error ending in `fix` (bytes in another encoding
    reach argv as lone surrogates, which no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(
            f"{what} is not valid UTF-8 text (the terminal or the script that passed it uses "
            f"another encoding); {fix}"
        ) from None
    return as_read(text.removeprefix(BOM))


def read_user_text(path: Path | str, what: str, fix: str = "check the path") -> str:
    """The text of the file a person named (`what`: "prompt file", "text file"), by the module's
    rule. A missing file is "WHAT PATH not found; FIX"; a folder or a file without permission, one
    line too."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{what} {path} not found; {fix}") from None
    except OSError as e:  # a folder, no permission
        raise UserError(f"{what} {path} cannot be read ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise not_utf8(path, raw, e, what=what) from None
    return as_read(text.removeprefix(BOM))


def json_line(
    raw: str, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict:
    """One line of a JSON Lines file a person wrote (`where`: "FILE line N"): a JSON object with
    the `required` fields. With `optional`, a field named in neither is refused too (without, other
    fields are left for the caller: HellaSwag's files carry more than we read)."""
    try:
        line = json.loads(raw)
    except json.JSONDecodeError as e:
        raise UserError(f"{where} is not JSON ({e.msg}); write one object per line") from None
    fields = ", ".join(required) + (f", {', '.join(optional)} (optional)" if optional else "")
    if not isinstance(line, dict):
        raise UserError(f"{where} is not a JSON object; write one per line, with {fields}")
    missing = [k for k in required if k not in line]
    unknown = sorted(set(line) - set(required) - set(optional)) if optional else []
    if missing:
        raise UserError(f"{where} has no {', '.join(missing)} (the fields are {fields})")
    if unknown:
        raise UserError(f"{where} has unknown keys {', '.join(unknown)} (the fields are {fields})")
    return line
