"""Files written whole or not at all (a temporary file in the same directory, fsync, rename,
fsync the directory), and their checksums; the temporary names, each naming its owner
process, and the sweep of those a killed process left (``temp_name``, ``sweep_stale``); and
THE check before an input file is read
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
import shutil
import socket
import stat
import time
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


# --- temporary names: each names its owner process; what a gone owner left is swept ----------------
#
# ``.NAME.tmp-HOST-PID-HEX``: what is being written as NAME (a file or a folder), renamed to NAME
# when whole; ``.NAME.old-HOST-PID-HEX``: NAME moved aside while its replacement goes in. A
# process killed in between leaves them; the next writer in the folder (any of checkpoints,
# report, prep, export) removes those whose owner is gone (``sweep_stale``).

STALE_AFTER_S = 24 * 3600  # left over whoever made it: another host's, or an unnamed one, this old
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?:(?P<host>[A-Za-z0-9.]+)-(?P<pid>\d+)"
                       r"(?:-[^-]*)?|[^-]*)$")
_UNNAMED = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{16}\.tmp$")  # an older mnistflow's: no owner in it


def owner() -> str:
    """HOST-PID of this process, as its temporary names hold it."""
    host = re.sub(r"[^A-Za-z0-9.]", "", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


def temp_name(path: str | Path, kind: str = "tmp") -> Path:
    """A new name beside ``path`` for it while it is written (``tmp``) or moved aside (``old``),
    naming this process: ``.NAME.tmp-HOST-PID-HEX``."""
    path = Path(path)
    return path.parent / f".{path.name}.{kind}-{owner()}-{secrets.token_hex(4)}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def _stale(p: Path, m: re.Match | None, locked: bool, max_age_s: float) -> bool:
    """Whether the leftover ``p`` (``m``: its name parsed by ``_LEFTOVER``) has no live owner:
    this host's process is gone; another host's (or an unnamed one) is over ``max_age_s`` old.
    ``locked``: the folder is held by this process (a run's checkpoints/): everything is."""
    if locked:
        return True
    if m is not None and m["pid"] is not None and m["host"] == owner().rsplit("-", 1)[0]:
        return int(m["pid"]) != os.getpid() and not pid_alive(int(m["pid"]))
    try:
        return time.time() - p.lstat().st_mtime > max_age_s
    except OSError:
        return False


def sweep_stale(folder: str | Path, name: str | None = None, *, locked: bool = False,
                max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary names (``temp_name``) in ``folder`` whose owner is gone, whatever
    name they were written for; and, for ``name`` (the one the caller writes), an older
    mnistflow's names without an owner, once over ``max_age_s`` old (a name without its owner
    could be a user's file: only a writer of that name judges it). A ``.tmp`` goes; an ``.old``
    is put back when its NAME is missing (its owner was killed between its two renames: the old
    one is the live one), else goes. ``locked``: the folder is this process's (a run's
    checkpoints/, under the run's lock): every temporary name in it is stale. Links are never
    touched. Returns what went (or was put back)."""
    folder = Path(folder)
    gone = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return gone
    for p in entries:
        m = _LEFTOVER.match(p.name)
        u = None if m else _UNNAMED.match(p.name)
        owned = m is not None and m["pid"] is not None
        if (m or u) is None or p.is_symlink() or not (owned or locked or (m or u)["name"] == name):
            continue
        if not _stale(p, m, locked, max_age_s):
            continue
        target = folder / (m or u)["name"]
        try:
            if m is not None and m["kind"] == "old" and not os.path.lexists(target):
                os.replace(p, target)
            elif p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink()
        except OSError:
            continue
        gone.append(p)
    return gone


def _write_temp(path: Path, write: Callable[[object], None]) -> Path:
    """``write(f)`` on a new temporary file beside ``path`` (``temp_name``), flushed to disk;
    returns its name. Nothing is left of a failure."""
    # Named before it exists: an interruption (Ctrl-C, SIGTERM) landing just after the file
    # is created still finds it bound for the cleanup below (mkstemp's return would be lost).
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), file_mode())
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def atomic_write(path: str | Path, write: Callable[[object], None]) -> None:
    """Call ``write(f)`` on a temporary binary file, then move it to ``path`` atomically.

    Raises ``MnistflowError(path, reason)`` for an ``OSError``, with nothing left behind."""
    path = Path(path)
    created = make_dirs(path.parent)
    tmp = None
    try:
        tmp = _write_temp(path, write)
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except BaseException as e:
        if tmp is not None:
            _unlink(tmp)
        remove_empty(created)
        if isinstance(e, OSError):
            raise os_error(e, path) from e
        raise


def replace_together(files: dict[Path, bytes]) -> None:
    """Write several files that belong together (a model and its int8 twin): each whole under
    a temporary name first, then all renamed into place; when one cannot be (no permission, an
    immutable file, a full disk), those already renamed get their earlier file back (or go,
    when there was none), so the names never hold a mix of this write and the one before.
    (A kill -9 between two renames, a few microseconds, can still leave a mix.) An
    ``OSError`` is one ``MnistflowError`` naming the file."""
    paths = [Path(p) for p in files]
    created = [d for p in paths for d in make_dirs(p.parent)]
    temps: dict[Path, Path] = {}
    saved: dict[Path, Path] = {}  # the earlier file of each name, kept under an "old" name
    done: list[Path] = []
    at = paths[0]
    try:
        for at in paths:
            temps[at] = _write_temp(at, lambda f, data=files[at]: f.write(data))
        for at in paths:
            if os.path.lexists(at):
                saved[at] = _keep_old(at)
        for at in paths:
            os.replace(temps[at], at)
            del temps[at]
            done.append(at)
        for p in {p.parent for p in paths}:
            fsync_dir(p)
    except BaseException as e:
        for p in done:  # back as they were
            try:
                if p in saved:
                    os.replace(saved.pop(p), p)
                else:
                    os.unlink(p)
            except OSError:
                pass
        for tmp in temps.values():
            _unlink(tmp)
        remove_empty(created)
        if isinstance(e, OSError):
            raise os_error(e, at) from e
        raise
    finally:
        for old in saved.values():
            _unlink(old)


def _keep_old(path: Path) -> Path:
    """A second name for the file at ``path`` (a hard link; a copy where links are refused),
    so it can be put back."""
    old = temp_name(path, "old")
    try:
        os.link(path, old, follow_symlinks=False)
    except OSError:
        shutil.copy2(path, old, follow_symlinks=False)
    return old


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
