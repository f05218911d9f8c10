"""What a script says to a person: errors in one line that says what is wrong and how to fix it
(exit code 2), and output that outlives its reader.

Code anywhere raises `UserError("what is wrong; how to fix it")`; every script runs its `main` under
`cli`, which prints `error: ...` and exits 2 (`--debug` or TINYGPT_DEBUG=1: the traceback).
Importing this module makes a Ctrl-C during the seconds of imports one line (exit 130), which is why
every script imports it first. A closed pipe (`train.py | head -3`) or terminal: `guard` points the
descriptor at os.devnull, and the program carries on without output (`keep_going`: training still
writes its checkpoints) or `cli` ends it quietly with 141, as a process killed by SIGPIPE reports.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import os
import re
import signal
import sys
from collections.abc import Callable


class UserError(Exception):
    """A problem the user can fix (bad config, missing file, bad prompt...); its text is the whole
    message."""


class ConfigError(UserError):
    """A mistake in the config or the command line: the same on every rank of a torchrun job."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """An exception's message cut to one line for a message of ours (its type's name when it has
    none)."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


def as_flags(message: str, flags: dict[str, str]) -> str:
    """`message` with each config key in `flags` named as the script's flag: `train.device=cuda`
    becomes `--device cuda`, a bare `train.device` becomes `--device`."""
    for key, flag in flags.items():
        key = re.escape(key)
        message = re.sub(rf"(?<![\w.]){key}=([^\s;,)]+)", rf"{flag} \1", message)
        message = re.sub(rf"(?<![\w.]){key}(?![\w.])", flag, message)
    return message


def named_as_flags(flags: dict[str, str]):
    """Decorate a script's `main` whose flags stand for config keys (`{"train.device":
    "--device"}`): a UserError raised under it, however deep, names them as the user gave them
    (`as_flags`)."""

    def decorate(main: Callable[[list[str]], int | None]) -> Callable[[list[str]], int | None]:
        @functools.wraps(main)
        def named(argv: list[str]) -> int | None:
            try:
                return main(argv)
            except UserError as e:
                e.args = (as_flags(str(e), flags), *e.args[1:])
                raise

        return named

    return decorate


def debug_enabled(argv: list[str] | None = None) -> bool:
    argv = sys.argv[1:] if argv is None else argv
    return "--debug" in argv or os.environ.get("TINYGPT_DEBUG", "") not in ("", "0")


# --- output whose reader went away ---

# the reader has gone: a pipe, a terminal, a socket
GONE = {errno.EPIPE, errno.EIO, errno.ECONNRESET}


class OutputClosed(BaseException):
    """stdout or stderr lost its reader (`guard`)."""


class GuardedStream:
    """A text stream whose writes survive the loss of its reader (`guard`)."""

    def __init__(self, stream, keep_going: bool):
        self._stream = stream
        self._keep_going = keep_going
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except OSError as e:
                self._lost(e)
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except OSError as e:
                self._lost(e)

    def _lost(self, e: OSError) -> None:
        if e.errno not in GONE and not self._keep_going:
            raise e
        self._gone = True
        # Python ignores SIGPIPE, so a closed pipe is an EPIPE here; restoring SIGPIPE's default
        # would kill the process on any closed socket too. Pointed at os.devnull, every later
        # write, Python's own flush at exit and native code's writes go nowhere.
        # no descriptor (a test's capture)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        if not self._keep_going:
            raise OutputClosed from None

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ... of the stream itself
        return getattr(self._stream, name)


def guard(keep_going: bool) -> None:
    """Wrap sys.stdout and sys.stderr (once) as `GuardedStream`s."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream, keep_going))


# --- Ctrl-C while the script starts, and cli ---

INTERRUPTED = "interrupted; nothing was written"


def _say(line: str) -> None:
    """One line on stderr, if anyone still reads it."""
    with contextlib.suppress(OSError, OutputClosed):
        print(line, file=sys.stderr, flush=True)


def _interrupt_hook(kind, value, tb, previous=sys.excepthook) -> None:
    """A Ctrl-C before `cli` runs (while a script imports torch): one line; Python then exits as
    killed by SIGINT (130)."""
    if issubclass(kind, KeyboardInterrupt) and not debug_enabled():
        _say(f"\n{INTERRUPTED} (while starting)")
        return
    previous(kind, value, tb)


sys.excepthook = _interrupt_hook


def _load_torch_holding_ctrl_c() -> None:
    """Import torch with Ctrl-C held back, then let it through (the hook's one line). torch's C
    start loads numpy and drops a KeyboardInterrupt that lands meanwhile: the script went on with
    numpy half-loaded and failed later with a RecursionError, or aborted."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        importlib.import_module("torch")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a Ctrl-C held meanwhile raises here


_load_torch_holding_ctrl_c()


def cli(
    main: Callable[[list[str]], int | None],
    argv: list[str] | None = None,
    interrupted: str = INTERRUPTED,
    keep_going: bool = False,
) -> None:
    """Run main(argv) and exit with its code; a UserError becomes one line on stderr and exit 2,
    Ctrl-C the line `interrupted` and exit 130; a closed stdout exits 141 quietly, or with
    `keep_going` only costs the output (`guard`)."""
    argv = sys.argv[1:] if argv is None else argv
    debug = debug_enabled(argv)
    argv = [a for a in argv if a != "--debug"]
    guard(keep_going)
    try:
        code = main(argv)
    except UserError as e:
        if debug:
            raise
        if isinstance(e, ConfigError) and os.environ.get("RANK", "0") != "0":
            # rank 0 says it and fails the job; exiting 2 here could make torchrun stop rank 0
            # before it does
            sys.exit(0)
        _say(f"error: {e}")
        sys.exit(2)
    except KeyboardInterrupt:
        if debug:
            raise
        _say(f"\n{interrupted}")
        sys.exit(130)
    except OutputClosed:
        sys.exit(141)
    sys.exit(code or 0)
