"""stdout and stderr that outlive their reader: a closed pipe (`train.py | head -3`) or a closed terminal.

Python ignores SIGPIPE, so a write to a pipe whose reader has gone fails with BrokenPipeError (EPIPE), and a
write to a terminal that was closed (its window, an ssh session) fails with EIO. `guard` wraps sys.stdout
and sys.stderr so that such a failure points the file descriptor at os.devnull (what the Python docs'
signal notes recommend, rather than restoring SIGPIPE's default, which would kill the process on any closed
socket too): every later write, Python's own flush at exit and writes from native code then go nowhere.
Then, with `keep_going`, the program carries on without output (training writes its checkpoints all the
same); without it, the write raises `OutputClosed`, which `run_cli` turns into a quiet exit 141 (128 +
SIGPIPE, what a program killed by SIGPIPE reports to the shell).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

GONE = {errno.EPIPE, errno.EIO, errno.ECONNRESET}  # the reader has gone: a pipe, a terminal, a socket


class OutputClosed(BaseException):
    """stdout or stderr lost its reader (see the module docstring)."""


class GuardedStream:
    """A text stream whose writes survive the loss of its reader (see the module docstring)."""

    def __init__(self, stream, keep_going: bool):
        self._stream, self._keep_going, self._gone = stream, keep_going, False

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
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor (a test's capture)
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
