"""Advisory locks on a lock file, so that two processes never write one run folder or one dataset at
once: exclusive for a writer (train.py on its out_dir, prepare on a dataset), shared for readers (a
run reading its dataset). A lock that is taken is one line naming the process that holds it. They
are fcntl.flock's, which the operating system releases when the process ends, however it ends: a
kill -9 leaves none behind. Windows has no fcntl: nothing is locked there.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from common.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: msvcrt's locks lock byte ranges, mandatorily, which is not this
    fcntl = None

# a reader waits this long for a writer that is finishing (torchrun's other ranks)
READER_WAIT_S = 10.0
_held: dict[Path, tuple[int, bool]] = {}  # lock file -> (descriptor, exclusive)


def _open(lock_file: Path) -> int | None:
    """A descriptor of the lock file (created if need be); None where it cannot be had (a read-only
    folder that nobody writes into: there is nothing to guard against)."""
    try:
        return os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        try:
            return os.open(lock_file, os.O_RDONLY)
        except OSError:
            return None


def _try(fd: int, exclusive: bool, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, another user's
        return True
    return True


def _pids(fd: int) -> list[int]:
    """The processes the lock file names that still run (readers add themselves, a writer is
    alone)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = os.pread(fd, 4096, 0).decode()
        return [int(w) for w in dict.fromkeys(text.split()) if w.isdigit() and _alive(int(w))]
    return []


def _holder(fd: int) -> str:
    pids = _pids(fd)
    return (
        f"process{'es' if len(pids) > 1 else ''} {', '.join(map(str, pids))}"
        if pids
        else "another process"
    )


def _sign(fd: int, exclusive: bool) -> None:
    """Write this process's pid into the lock file: alone for a writer, among the other readers' for
    one."""
    pids = [] if exclusive else [p for p in _pids(fd) if p != os.getpid()]
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, "".join(f"{p}\n" for p in [*pids, os.getpid()]).encode(), 0)


def hold(lock_file: Path | str, what: str, exclusive: bool, advice: str) -> None:
    """Take the lock on `lock_file` until the process ends or `release`; held elsewhere, the
    UserError '{what} is in use by process N; {advice}'."""
    lock_file = Path(lock_file).absolute()
    if fcntl is None:
        return
    if lock_file in _held:
        fd, was_exclusive = _held[lock_file]
        if exclusive and not was_exclusive:
            if not _try(fd, True, 0.0):
                raise UserError(f"{what} is in use by {_holder(fd)}; {advice}")
            _held[lock_file] = (fd, True)
            _sign(fd, True)
        return
    fd = _open(lock_file)
    if fd is None:
        return
    if not _try(fd, exclusive, 0.0 if exclusive else READER_WAIT_S):
        holder = _holder(fd)
        os.close(fd)
        raise UserError(f"{what} is in use by {holder}; {advice}")
    _held[lock_file] = (fd, exclusive)
    _sign(fd, exclusive)


def release(lock_file: Path | str) -> None:
    held = _held.pop(Path(lock_file).absolute(), None)
    if held is not None:
        os.close(held[0])


@contextlib.contextmanager
def holding(lock_file: Path | str, what: str, exclusive: bool, advice: str) -> Iterator[None]:
    """`hold` for the block only; a shared lock this process held before is shared again after
    it."""
    lock_file = Path(lock_file).absolute()
    before = _held.get(lock_file)
    hold(lock_file, what, exclusive, advice)
    try:
        yield
    finally:
        if before is None:
            release(lock_file)
        elif exclusive and not before[1] and lock_file in _held:
            fcntl.flock(before[0], fcntl.LOCK_SH)
            _held[lock_file] = (before[0], False)
