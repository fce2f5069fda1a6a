"""Files written whole or not at all (a temporary file in the same directory, fsync, rename,
fsync the directory), and their checksums.

A failed write (disk full, a read-only file system, no permission, a path of the wrong
kind) is a ``MnistflowError`` naming the file, one line for the user; it leaves neither
a temporary file nor the empty folders it created. New files get the mode a plain
``open()`` would give them (0644 under the usual umask 022), not a temporary file's 0600.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

from mnistflow.core.errors import os_error


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.cache
def umask() -> int:
    """The process's umask, read once: from ``/proc/self/status`` where the kernel shows it,
    else by setting and restoring it (for that moment a file another thread creates gets the
    stricter 077, never a looser mask)."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^Umask:\s*([0-7]+)$", f.read(), re.MULTILINE)
        if m:
            return int(m.group(1), 8)
    except OSError:
        pass
    old = os.umask(0o077)
    os.umask(old)
    return old


def file_mode() -> int:
    """The mode a new file gets from ``open()``: 0666 less the umask."""
    return 0o666 & ~umask()


def make_dirs(folder: str | Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns the ones created, deepest first, for
    :func:`remove_empty` to undo after a failed write. An ``OSError`` becomes one line."""
    folder = Path(folder)
    if folder.is_dir():
        return []
    missing = []
    p = folder
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        remove_empty(missing)
        raise os_error(e) from None
    return missing


def remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) that are still empty; never raises."""
    for p in folders:
        try:
            p.rmdir()
        except OSError:
            pass


def atomic_write(path: str | Path, write: Callable[[object], None]) -> None:
    """Call ``write(f)`` on a temporary binary file, then move it to ``path`` atomically.

    Raises ``MnistflowError(path, reason)`` for an ``OSError``, with nothing left behind."""
    path = Path(path)
    created = make_dirs(path.parent)
    tmp = None
    try:
        # Named before it exists: an interruption (Ctrl-C, SIGTERM) landing just after the file
        # is created still finds it bound for the cleanup below (mkstemp's return would be lost).
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), file_mode())
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        remove_empty(created)
        if isinstance(e, OSError):
            raise os_error(e, path) from e
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
