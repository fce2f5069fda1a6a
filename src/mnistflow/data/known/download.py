"""Download a known dataset's files through unreliable mirrors, verified against their
published md5 sums (``known.matches``): the HTTP mechanics behind ``known.locate``.

    mnistflow prep fashion-mnist                       # the dataset's own mirrors
    MNISTFLOW_MIRRORS=http://proxy.lan/mnist/,https://my.mirror/mnist/ mnistflow prep mnist
    MNISTFLOW_DOWNLOAD_RETRIES=6 MNISTFLOW_DOWNLOAD_TIMEOUT=120 mnistflow prep emnist-letters

Mirrors: each file is tried at each mirror in turn, file by file (a file missing on the
first mirror comes from the second). A file's URL is a mirror's base URL + the file name.
``$MNISTFLOW_MIRRORS`` (base URLs, comma-separated) replaces every dataset's own mirrors: a
local copy, or a machine behind a proxy; ``$MNISTFLOW_MIRROR`` (one base URL) is tried first.

Retries: a timeout (``TIMEOUT`` seconds without a byte, ``$MNISTFLOW_DOWNLOAD_TIMEOUT``, or
fewer than ``limits.MIN_DOWNLOAD_RATE`` bytes a second over that long), a refused or reset
connection, or HTTP 5xx/408/429 is retried at the same mirror ``RETRIES`` times
(``$MNISTFLOW_DOWNLOAD_RETRIES``), after ``BACKOFF`` seconds, then twice as long each time.
Other HTTP errors (404, 403, a redirect loop, ...) go to the next mirror at once. A mirror never
reached (the name does not resolve, no route, a bad certificate, or no answer through all the
retries) is skipped for the files after.

Size: a file never grows past ``RemoteFile.max_bytes`` (its published size; twice that where
a re-compressed .gz is accepted): a mirror that declares more, or sends more, goes to the next
mirror and its bytes are deleted. With the rate floor and the bounded tries, every mirror's
time for a file is bounded too (an endless body or a one-byte drip ends).

Resume: a file streams to ``<dest>/<file>.part``. After a dropped connection the next request
asks for the rest (HTTP Range): a server answering 206 continues the part, one ignoring Range
(200) sends the whole file and the part starts over. A drop after new bytes is retried at once,
without a failure counted, at most ``limits.MAX_DOWNLOAD_RESUMES`` times at one mirror. A part
left by an interrupted run (Ctrl-C, every mirror failed mid-file) is resumed by the next run. A
part is locked (``flock``) while written: two processes downloading into one folder take turns.

Verification: the md5 of the part must be the published one (or, for a re-compressed .gz, the
md5 of its content) before the part is fsynced and renamed into place: a file with a wrong
checksum never lands under its final name; the next mirror is tried (a resumed part that does
not match is first fetched whole again from the same mirror).

Progress: a bar per file on a terminal (bytes, rate, ETA; erased when done), else a line every
``HEARTBEAT`` seconds while a file takes long; then a line per file downloaded; nothing under
``--quiet``. When every mirror fails: ONE error saying what each mirror did and exactly which
files (with their md5) to place in which folder.
"""
from __future__ import annotations

import contextlib
import errno
import http.client
import os
import re
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from mnistflow.core import limits, log
from mnistflow.core import progress as _progress
from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.fsutil import fsync_dir
from mnistflow.data.known import KnownDataset, RemoteFile, matches, md5_of

try:
    import fcntl
except ImportError:  # Windows: no lock
    fcntl = None

TIMEOUT = 30.0  # seconds without a byte before an attempt counts as failed
RETRIES = 3  # further attempts at one mirror after a failure that may pass
BACKOFF = 0.5  # seconds before the first retry; doubled for each next one
BACKOFF_MAX = 30.0
HEARTBEAT = 10.0  # seconds between two progress lines when stderr is no terminal
_CHUNK = 1 << 20
_AGENT = "mnistflow (Python-urllib)"  # some servers refuse urllib's default agent
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_sleep = time.sleep  # the tests watch the backoff through it


class _Retry(Exception):
    """Worth another try at the same mirror (timeout, reset, 5xx, a dropped connection)."""

    def __init__(self, why: str, answered: bool = False, slow: bool = False):
        super().__init__(why)
        self.answered = answered  # the server got as far as an HTTP status
        self.slow = slow  # bytes came, but under the rate floor: a failure all the same


class _NextMirror(Exception):
    """This file will not come from this mirror (404, a wrong checksum, retries spent)."""


class _MirrorDown(Exception):
    """The mirror cannot be reached at all: skip it for the other files too."""


def mirrors(ds: KnownDataset) -> list[str]:
    """The base URLs to try for ``ds``, in order (each ending in '/')."""
    first = os.environ.get("MNISTFLOW_MIRROR", "").strip()
    override = [m.strip() for m in os.environ.get("MNISTFLOW_MIRRORS", "").split(",") if m.strip()]
    out: list[str] = []
    for m in ([first] if first else []) + (override or list(ds.mirrors)):
        m = m if m.endswith("/") else m + "/"
        if m not in out:
            out.append(m)
    return out


def _setting(name: str, default: float, kind: type, most: float) -> float:
    """``$name`` as a ``kind`` in (0, most] (float: seconds) or [0, most] (int: retries)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = -1
    if not (0 <= value <= most) or (kind is float and value == 0):  # (False for nan)
        raise MnistflowError(f"${name}={raw[:40]!r}: expected " + (
            f"a number of seconds > 0, at most {most:g}" if kind is float else f"an integer from 0 to {most:g}"))
    return value


def _settings() -> tuple[float, int]:
    """(timeout, retries): the module's constants, or the environment's."""
    return (_setting("MNISTFLOW_DOWNLOAD_TIMEOUT", TIMEOUT, float, 86400.0),  # (inf overflowed the socket)
            int(_setting("MNISTFLOW_DOWNLOAD_RETRIES", RETRIES, int, 1000)))


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _failure(e: BaseException, timeout: float) -> Exception:
    """A connection-level error as a _Retry or a _MirrorDown, with a short reason."""
    r = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(r, socket.gaierror):
        return _MirrorDown(f"cannot resolve the host ({r.strerror or r})")
    if isinstance(r, ssl.SSLCertVerificationError):
        return _MirrorDown(f"bad TLS certificate ({r.verify_message or r})")
    if isinstance(r, TimeoutError):
        return _Retry(f"no answer within {timeout:g} s")
    if isinstance(r, ConnectionRefusedError):
        return _Retry("connection refused")
    if isinstance(r, http.client.RemoteDisconnected):
        return _Retry("closed the connection without an answer")
    if isinstance(r, ConnectionError):
        return _Retry(f"connection {'reset' if isinstance(r, ConnectionResetError) else 'lost'}")
    if isinstance(r, OSError) and r.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return _MirrorDown(r.strerror or "no route to the host")
    if isinstance(r, (OSError, http.client.HTTPException)):
        return _Retry(f"{type(r).__name__}: {r}".rstrip(": "))
    return _MirrorDown(str(r) or type(r).__name__)  # ValueError, "unknown url type", ...


class _Show:
    """The progress of one file: a bar on a terminal, else a line every HEARTBEAT seconds;
    then the line that says it was downloaded. Silent under ``--quiet``."""

    def __init__(self, name: str):
        self.name = name
        self.quiet = _progress.is_quiet()  # the CLI's --quiet / --json
        self.plain = not self.quiet and not _progress.is_terminal(sys.stderr)
        self.bar = None
        self.t0 = self.last = time.monotonic()
        self.url, self.total, self.got, self.received = "", None, 0, 0

    def start(self, url: str, have: int, total: int | None) -> None:
        self.url, self.total, self.got = url, total, have
        if self.bar is None:
            self.bar = _progress.progress(total, self.name, "B", unit_scale=True, initial=have)
        else:
            self.bar.reset(total)
            self.bar.update(have)
            self.bar.set_postfix_str("")

    def update(self, got: int) -> None:
        self.received += got - self.got
        self.bar.update(got - self.got)
        self.got = got
        self._line(self._status)

    def waiting(self, url: str, why: str, n: int, retries: int, wait: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"retry {n}/{retries}: {why}")
        self._line(lambda: f"{url}: {why}; retry {n} of {retries} in {wait:.1f} s")

    def _status(self) -> str:
        of = f" of {_mb(self.total)} ({100 * self.got / self.total:.0f}%)" if self.total else ""
        rate = self.received / max(time.monotonic() - self.t0, 1e-9)
        return f"downloading {self.url}: {_mb(self.got)}{of}, {rate / 1e6:.2f} MB/s"

    def _line(self, text) -> None:
        now = time.monotonic()
        if self.plain and now - self.last >= HEARTBEAT:
            self.last = now
            log.note(text())

    def done(self, url: str, size: int, tried: list[tuple[str, str]]) -> None:
        self.close()
        if self.quiet:
            return
        s = time.monotonic() - self.t0
        after = "".join(f"; {base}{self.name}: {why}" for base, why in tried)
        log.note(f"downloaded {url} ({_mb(size)} in {s:.1f} s, checksum OK{after})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _size(fh: IO[bytes]) -> int:
    return fh.seek(0, os.SEEK_END)


def _http_error(e: urllib.error.HTTPError) -> str:
    """An HTTP error status as one short line (urllib's redirect-loop reason spans lines)."""
    reason = " ".join(str(e.reason or "").split())
    if 300 <= e.code < 400 and "infinite loop" in reason:
        return f"HTTP {e.code}: redirects in a loop (or more than " \
               f"{urllib.request.HTTPRedirectHandler.max_redirections})"
    return f"HTTP {e.code} {reason[:100]}".rstrip()


def _attempt(url: str, fh: IO[bytes], part: Path, timeout: float, show: _Show, most: int) -> bool:
    """One request for ``url`` into ``fh`` (the part), asking for the rest when the part holds
    bytes already; returns whether the part continued earlier bytes. The part never grows past
    ``most`` bytes. Raises _Retry, _NextMirror or _MirrorDown."""
    have = _size(fh)
    headers = {"User-Agent": _AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and have:  # nothing after ``have``: the part may be whole already
            return True
        if e.code >= 500 or e.code in (408, 429):
            raise _Retry(_http_error(e), answered=True) from None
        raise _NextMirror(_http_error(e)) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise _failure(e, timeout) from None
    with resp:
        if resp.status == 206:
            m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
            if not m or int(m[1]) != have:
                fh.truncate(0)  # an answer to some other question: the next try asks for all
                raise _Retry("sent a range that was not asked for", answered=True)
            total = None if m[3] == "*" else int(m[3])
        else:  # 200: the whole file, whether a range was asked for or not
            have = 0
            n = resp.headers.get("Content-Length", "")
            total = int(n) if n.isdigit() and len(n) < 30 else None
        if total is not None and total > most:
            raise _NextMirror(f"offers {total:,} bytes; a copy of the file holds at most {most:,}")
        fh.truncate(have)
        fh.seek(have)
        show.start(url, have, total)
        got = _stream(resp, fh, part, have, most, timeout, show)
    if total is not None and got != total:
        raise _Retry(f"connection dropped at {_mb(got)} of {_mb(total)}", answered=True)
    if got == 0:
        raise _NextMirror("sent an empty file")
    return have > 0


def _stream(resp, fh: IO[bytes], part: Path, got: int, most: int, timeout: float, show: _Show) -> int:
    """The response's body appended to the part (holding ``got`` bytes); returns its size.
    Past ``most`` bytes the part is emptied (_NextMirror); under ``limits.MIN_DOWNLOAD_RATE``
    over a ``timeout`` window it is a stall (_Retry, slow); a failed write of the part (disk
    full) empties it too and is the one error line."""
    window_t0, window_got = time.monotonic(), got
    try:
        while True:
            try:
                chunk = resp.read1(_CHUNK)
            except (OSError, http.client.HTTPException) as e:
                why = (f"stalled for {timeout:g} s" if isinstance(e, TimeoutError)
                       else str(_failure(e, timeout)))
                raise _Retry(f"{why} at {_mb(got)}", answered=True) from None
            if not chunk:
                break
            if got + len(chunk) > most:
                fh.truncate(0)
                raise _NextMirror(f"sent more than {most:,} bytes, the most a copy of the file holds")
            fh.write(chunk)
            got += len(chunk)
            show.update(got)
            now = time.monotonic()
            if now - window_t0 >= timeout:
                if got - window_got < limits.MIN_DOWNLOAD_RATE * (now - window_t0):
                    raise _Retry(f"slower than {limits.MIN_DOWNLOAD_RATE / 1e3:g} kB/s for "
                                 f"{now - window_t0:.0f} s at {_mb(got)}", answered=True, slow=True)
                window_t0, window_got = now, got
        fh.flush()
    except OSError as e:  # the part's own write: disk full, ...
        with contextlib.suppress(OSError):
            fh.truncate(0)  # (not kept to fill the disk: the next run starts it again)
        fail(part, f"cannot write ({e.strerror or e}); the partial download was deleted")
    return got


def _from_mirror(url: str, f: RemoteFile, fh: IO[bytes], part: Path,
                 settings: tuple[float, int], show: _Show) -> None:
    """Fetch ``url`` into the part until its checksum is the published one; raises
    _NextMirror or _MirrorDown (the part kept where it may be continued elsewhere). Every try
    counts: one that failed without new bytes (or too slowly) against the retries, one that
    ended after new bytes against ``limits.MAX_DOWNLOAD_RESUMES``."""
    timeout, retries = settings
    failures = tries = resumes = 0
    best = _size(fh)  # the most bytes the part held: a failure after new bytes is a resume
    answered = refetched = False
    while True:
        tries += 1
        try:
            continued = _attempt(url, fh, part, timeout, show, f.max_bytes)
        except _Retry as e:
            answered |= e.answered
            now = _size(fh)
            gained, best = now > best, max(best, now)
            if gained and not e.slow:
                resumes += 1
                if resumes <= limits.MAX_DOWNLOAD_RESUMES:
                    continue
                raise _NextMirror(f"{e} ({tries} tries)") from None
            failures += 1
            if failures > retries:
                why = f"{e} ({tries} tries)" if tries > 1 else str(e)
                raise (_NextMirror if answered else _MirrorDown)(why) from None
            wait = min(BACKOFF * 2 ** (failures - 1), BACKOFF_MAX)
            show.waiting(url, str(e), failures, retries, wait)
            _sleep(wait)
            continue
        md5 = md5_of(part)
        if matches(part, f, md5):
            return
        fh.truncate(0)
        best = 0
        if continued and not refetched:  # earlier bytes may be the culprit: once more, whole
            refetched = True
            continue
        raise _NextMirror(f"md5 {md5}, expected the published {f.md5}")


@contextlib.contextmanager
def _locked(part: Path) -> Iterator[IO[bytes]]:
    """The part, opened read-write (created empty if new) and locked against the other
    processes downloading the same file."""
    while True:
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as e:
            fail(part, f"cannot write ({e.strerror or e})")
        if fcntl is None:
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.note(f"another process is downloading {part.name[:-5]} into {part.parent}; "
                     "waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks
            break
        try:  # the file locked must still be the one at the path (the holder renamed it)
            same = os.stat(part).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    fh = os.fdopen(fd, "r+b")
    try:
        yield fh
    finally:
        try:
            if _size(fh) == 0 and os.stat(part).st_ino == os.fstat(fh.fileno()).st_ino:
                part.unlink()  # nothing worth resuming: no litter
        except (OSError, ValueError):  # renamed into place already (or closed)
            pass
        finally:
            fh.close()


def _fetch_file(f: RemoteFile, bases: list[str], dest: Path, down: dict[str, str],
                settings: tuple[float, int]) -> list[tuple[str, str]]:
    """Fetch ``f`` into ``dest`` from the first mirror that gives it; [] on success (or when
    it is there already), else what each mirror did: [(base URL, why)]."""
    final, part = dest / f.name, dest / (f.name + ".part")
    if not part.exists() and final.is_file() and matches(final, f):
        return []
    with _locked(part) as fh:
        if final.is_file() and matches(final, f):  # there already, or another process did it
            fh.truncate(0)
            return []
        if _size(fh) > f.max_bytes:  # left by something else: not a part of this file
            fh.truncate(0)
        tried: list[tuple[str, str]] = []
        show = _Show(f.name)
        try:
            for base in bases:
                if base in down:
                    tried.append((base, down[base]))
                    continue
                try:
                    _from_mirror(base + f.name, f, fh, part, settings, show)
                except _MirrorDown as e:
                    down[base] = f"unreachable: {e}"
                    tried.append((base, down[base]))
                    continue
                except _NextMirror as e:
                    tried.append((base, str(e)))
                    continue
                size = _size(fh)
                try:
                    os.fsync(fh.fileno())
                    os.replace(part, final)
                    fsync_dir(dest)
                except OSError as e:
                    fail(final, f"cannot write ({e.strerror or e})")
                show.done(base + f.name, size, tried)
                return []
        finally:
            show.close()
        return tried


def _all_failed(ds: KnownDataset, dest: Path, bases: list[str],
                failed: dict[str, list[tuple[str, str]]]) -> str:
    """The one line: what each mirror did, and the files to place by hand."""
    said = []
    for base in bases:
        outcomes = [(name, why) for name, tried in failed.items() for b, why in tried if b == base]
        if len(outcomes) > 1 and len({why for _, why in outcomes}) == 1:
            said.append(f"{base} ({len(outcomes)} files): {outcomes[0][1]}")
        else:
            said += [f"{base}{name}: {why}" for name, why in outcomes]
    place = ", ".join(f"{f.name} (md5 {f.md5})" for f in ds.files if f.name in failed)
    if ds.format == "emnist" and getattr(ds, "loose_files", None):
        place += f", or the zip's {', '.join(ds.loose_files)}"
    kept = sum((dest / (n + ".part")).stat().st_size for n in failed
               if (dest / (n + ".part")).is_file())
    return (f"cannot download {ds.name}: {'; '.join(said)}. Fetch by hand"
            + (f" ({ds.homepage})" if ds.homepage else "")
            + f" and place in {dest}: {place}; or point --data or MNISTFLOW_DATA at a folder "
              "holding them, or MNISTFLOW_MIRRORS at mirrors that serve them"
            + (f" ({_mb(kept)} downloaded so far kept in .part files: the next try resumes)"
               if kept else ""))


def fetch(ds: KnownDataset, dest: Path) -> Path:
    """Download the files of ``ds`` into ``dest`` (verified); returns ``dest``."""
    dest = Path(dest)
    created = not dest.exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(dest, f"cannot create the download folder ({e.strerror or e})")
    bases = mirrors(ds)
    if not bases:
        fail(dest, f"no mirror known for {ds.name}; set MNISTFLOW_MIRRORS to base URLs serving "
                   + ", ".join(f.name for f in ds.files))
    settings = _settings()
    down: dict[str, str] = {}  # mirrors found unreachable: not tried for the next files
    failed: dict[str, list[tuple[str, str]]] = {}
    try:
        for f in ds.files:
            tried = _fetch_file(f, bases, dest, down, settings)
            if tried:
                failed[f.name] = tried
        if failed:
            raise MnistflowError(_all_failed(ds, dest, bases, failed), dest)
    except BaseException:
        if created:
            try:
                dest.rmdir()  # only if empty: verified files and resumable parts stay
            except OSError:
                pass
        raise
    return dest
