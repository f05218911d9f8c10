"""Errors meant for people: one line that says what is wrong and how to fix it, exit code 2.

Code anywhere raises `UserError("what is wrong; how to fix it")`; an entry point wraps its `main` in
`run_cli`, which prints `error: ...` on stderr and exits 2, or shows the traceback when `--debug` is on the
command line or TINYGPT_DEBUG=1 is set. Under torchrun every rank reads the same config, so a `ConfigError`
is printed by rank 0 alone, the job failing with its exit code; other errors by every rank that meets them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class UserError(Exception):
    """A problem the user can fix (bad config, missing file, bad prompt...); its text is the whole message."""


class ConfigError(UserError):
    """A mistake in the config or the command line: the same on every rank of a torchrun job."""


def debug_enabled(argv: list[str] | None = None) -> bool:
    argv = sys.argv[1:] if argv is None else argv
    return "--debug" in argv or os.environ.get("TINYGPT_DEBUG", "") not in ("", "0")


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> None:
    """Run main(argv) and exit with its code; a UserError becomes one line on stderr and exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    debug = debug_enabled(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        code = main(argv)
    except UserError as e:
        if debug:
            raise
        if isinstance(e, ConfigError) and os.environ.get("RANK", "0") != "0":
            # rank 0 says it and fails the job; exiting 2 here could make torchrun stop rank 0 before it does
            sys.exit(0)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code or 0)
