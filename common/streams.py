"""stdout and stderr that outlive their reader: a closed pipe (`train.py | head -3`) or a closed
terminal. `guard` wraps them so that a write to a reader that has gone points the descriptor at
os.devnull; then the program carries on without output (`keep_going`: training still writes its
checkpoints), or `cli` ends it quietly with 141, as a process killed by SIGPIPE reports.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

# the reader has gone: a pipe, a terminal, a socket
GONE = {errno.EPIPE, errno.EIO, errno.ECONNRESET}


class OutputClosed(BaseException):
    """stdout or stderr lost its reader (see the module docstring)."""


class GuardedStream:
    """A text stream whose writes survive the loss of its reader (see the module docstring)."""

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
