"""Files and folders written whole or not at all, with a plain file's mode; one line when the disk
says no.

`atomic_file` and `atomic_write` write beside the target and rename over it; `atomic_folder` fills a
folder under a temporary name and swaps it in by renames (the old one moves to .NAME.old first), so
a crash at any moment leaves NAME or .NAME.old complete; `append_line` appends a line whole or cuts
the file back. A failed write (a full disk, a read-only folder) leaves the target as it was and is
one UserError: the path, the reason, the space needed and free.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

from common.errors import UserError


def cache_folder() -> Path:
    """Where tinygpt keeps what it can rebuild (a CPU's measured peak, compiled decoding steps):
    $TINYGPT_CACHE_DIR, else ~/.cache/tinygpt."""
    return Path(os.environ.get("TINYGPT_CACHE_DIR") or Path.home() / ".cache" / "tinygpt")


def size_text(n: float) -> str:
    """A byte count for people, the one way tinygpt prints sizes (memory and disk alike): 512 B, 3.1
    MiB, 1.2 GiB, in powers of 1024 (as nvidia-smi and PyTorch's memory summaries count)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while n >= 1024 and power < len(units) - 1:
        n, power = n / 1024, power + 1
    return f"{n:.0f} B" if power == 0 else f"{n:,.1f} {units[power]}"


def free_space(path: Path | str) -> int | None:
    """Bytes free on the filesystem holding `path` (or its nearest existing parent); None if
    unknown."""
    path = Path(path).absolute()
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def space_note(path: Path | str, need: int | None = None) -> str:
    """'; it needs about 3.1 MB and 1.2 MB are free there' (the parts that are known; '' when none
    is)."""
    free = free_space(path)
    parts = [f"it needs about {size_text(need)}"] if need else []
    parts += [f"{size_text(free)} are free there"] if free is not None else []
    return f"; {' and '.join(parts)}" if parts else ""


def write_failed(
    path: Path | str, error: OSError, need: int | None = None, advice: str = ""
) -> UserError:
    """The one line for a write to `path` that failed: why, and the space needed against the space
    free."""
    reason = error.strerror or str(error) or type(error).__name__
    fix = advice or "free some space or fix the folder's permissions, then run the command again"
    return UserError(
        f"could not write {path} ({reason}){space_note(path, need)}; nothing was written half: "
        f"{fix}"
    )


def user_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status, kernel
    4.7+); elsewhere set and put back at once under a lock (os.umask has no read-only form)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


_umask_lock = threading.Lock()


def plain_mode(path: Path | str) -> None:
    """Give a file tinygpt wrote the mode a plain open(path, "w") gives (0o666 less the umask): a
    temporary file (mkstemp) or safetensors' writer makes it 0600, which no one else can read;
    folders and links are left as they are."""
    path = Path(path)
    if path.is_file() and not path.is_symlink():
        os.chmod(path, 0o666 & ~user_umask())


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.stem}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}{path.suffix}")


@contextlib.contextmanager
def atomic_file(path: Path | str, need: int | None = None, advice: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends, it replaces `path` in one rename.
    A block that fails leaves `path` untouched and no temporary file; an OSError becomes
    `write_failed`'s line."""
    path = Path(path)
    tmp = _temporary(path)
    try:
        yield tmp
        plain_mode(tmp)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_failed(path, e, need, advice) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write(path: Path | str, data: str | bytes, advice: str = "") -> None:
    """Write text (UTF-8) or bytes to `path` whole, or not at all (`atomic_file`)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_file(path, len(raw), advice) as tmp:
        tmp.write_bytes(raw)


def _fsync(path: Path) -> None:
    """Flush a file or a folder's entries to disk (best effort: some systems refuse it for
    folders)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _recover(out_dir: Path, name: str) -> None:
    """Finish a swap that a crash interrupted, and drop leftovers of unfinished writes."""
    final = out_dir / name
    old = out_dir / f".{name}.old"
    if old.exists():
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(old, final)
    for tmp in out_dir.glob(f".{name}.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def check_not_links(out_dir: Path, names: tuple[str, ...], advice: str) -> None:
    """Refuse folders swapped in by `atomic_folder` that are symbolic links: a swap renames the
    link, not what it points to."""
    for name in names:
        for path in (out_dir / name, out_dir / f".{name}.old"):
            if path.is_symlink():
                raise UserError(
                    f"{path} is a symbolic link (to {os.readlink(path)}); checkpoints are replaced "
                    "by renaming folders, which would move the link, not its target: put the "
                    f"folder itself there, or {advice}"
                )


@contextlib.contextmanager
def atomic_folder(
    out_dir: Path, name: str, what: str, advice: str, need: int | None = None
) -> Iterator[Path]:
    """Yield an empty temporary folder's path; when the block ends, it becomes out_dir/name in one
    swap. If the block fails, the temporary folder is deleted and out_dir/name is untouched; a write
    that fails is one line with the space `need`ed (bytes, when known)."""
    check_not_links(out_dir, (name,), advice)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_failed(out_dir, e, need, advice) from None
    _recover(out_dir, name)
    tmp = out_dir / f".{name}.tmp-{uuid.uuid4().hex[:8]}"
    final = out_dir / name
    old = out_dir / f".{name}.old"
    try:
        yield tmp
        for f in tmp.iterdir():
            plain_mode(f)
            _fsync(f)
        _fsync(tmp)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"could not write {what} {final} ({e.strerror or e}){space_note(out_dir, need)}; the "
            f"previous one is untouched. Free disk space or {advice}"
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_figure(fig, path: Path | str, **savefig) -> None:
    """A matplotlib figure saved to `path` whole, or not at all (a full disk leaves no half-written
    PNG). A character no installed font has (an out_dir in Chinese in a title, a token's label) is
    drawn as a box, without matplotlib's warning for each one."""
    with atomic_file(path) as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"Glyph \d+ .* missing from", UserWarning)
        fig.savefig(tmp, **savefig)


def append_line(path: Path | str, line: str, advice: str = "") -> None:
    """Append one line to a text file whole: a write that fails cuts the file back to what it was
    (an append cannot go to a temporary file) and is `write_failed`'s line."""
    path = Path(path)
    size = path.stat().st_size if path.is_file() else 0
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.truncate(path, size)
        raise write_failed(path, e, len(line.encode()), advice) from None


def save_tensors(tensors: dict, path: Path | str, metadata: dict | None = None) -> None:
    """safetensors' save_file, failing with an OSError (errno and reason) where safetensors
    fails."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
        plain_mode(path)  # safetensors creates it 0600
    except SafetensorError as e:  # "... I/O error: No space left on device (os error 28)"
        found = re.search(r"os error (\d+)", str(e))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None
