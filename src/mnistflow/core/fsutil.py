"""Files written whole or not at all (a temporary file in the same directory, fsync, rename,
fsync the directory), and their checksums; and THE check before an input file is read
(``regular_file`` / ``open_regular`` / ``read_regular``): a regular file of at most N bytes.

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
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from mnistflow.core.errors import MnistflowError, os_error


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


# --- reading an input file: a regular file of at most N bytes --------------------------------

class NotReadable(MnistflowError):
    """An input file that exists (or is a dangling link) but is not read: not a regular file
    (a FIFO, socket, device or folder), over its size cap, or an OS error opening it. A file
    that does not exist at all is a plain ``MnistflowError`` ("no such file")."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "an unknown kind"


def _check_stat(path: Path, st: os.stat_result, max_bytes: int | None, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise NotReadable(f"not a regular file ({_kind(st.st_mode)}); refusing to read it", path)
    if max_bytes is not None and st.st_size > max_bytes:
        raise NotReadable(f"{what} of {st.st_size:,} bytes is over the {max_bytes:,}-byte limit; "
                          "refusing to read it", path)


def _missing(path: Path, e: OSError) -> MnistflowError:
    if isinstance(e, FileNotFoundError):
        if os.path.lexists(path):
            return NotReadable("a broken symbolic link", path)
        return MnistflowError("no such file", path)
    return NotReadable(f"cannot read: {e.strerror or e}", path)


def regular_file(path: str | os.PathLike, max_bytes: int | None = None, what: str = "file") -> Path:
    """``path`` if it is (or links to) a regular file of at most ``max_bytes`` bytes, checked by
    ``stat`` without opening it: a FIFO (whose open would wait forever for a writer), a device
    (``/dev/zero`` never ends), a socket or a folder is refused, and so is a file over the cap
    (a sparse file costs nothing on disk but everything once read). ``what`` names the file
    in the size message. Raises ``NotReadable`` (a ``MnistflowError``), or ``MnistflowError``
    ("no such file")."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise _missing(p, e) from None
    _check_stat(p, st, max_bytes, what)
    return p


def open_regular(path: str | os.PathLike, max_bytes: int | None = None, what: str = "file") -> BinaryIO:
    """``path`` opened for binary reading, after the checks of :func:`regular_file` made on the
    open descriptor (opened without blocking, so a FIFO is refused at once, and no file can be
    swapped in between a check and the open)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise NotReadable("not a regular file (a folder); refusing to read it", p) from None
    except OSError as e:
        raise _missing(p, e) from None
    try:
        _check_stat(p, os.fstat(fd), max_bytes, what)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (:func:`open_regular`); never more
    than ``max_bytes`` + 1 are read, even from a file that grows meanwhile."""
    p = Path(path)
    with open_regular(p, max_bytes, what) as f:
        try:  # sized from the file (read(n) allocates n bytes first), then to EOF if it grew
            size = os.fstat(f.fileno()).st_size
            parts = [f.read(size + 1)]
            total = len(parts[0])
            while total > size and total <= max_bytes:
                more = f.read(min(1 << 20, max_bytes + 1 - total))
                if not more:
                    break
                parts.append(more)
                total += len(more)
        except OSError as e:
            raise NotReadable(f"cannot read: {e.strerror or e}", p) from None
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) > max_bytes:
        raise NotReadable(f"{what} grew over the {max_bytes:,}-byte limit while being read", p)
    return data
