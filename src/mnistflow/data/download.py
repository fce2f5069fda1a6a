"""Download a known dataset's files, verified against their published md5 sums.

Mirrors are tried in order, ``$MNISTFLOW_MIRROR`` (a base URL) first when set. Each file
streams to ``<dest>/<file>.part``, is checked (size against Content-Length, md5 against the
published sum -- or, for a re-compressed .gz, the md5 of its content), fsynced, and renamed
into place. A failure never leaves a ``.part`` behind. With no mirror reachable the error
is one line saying which files to fetch by hand and where to put them. Progress: a bar per
file on a terminal (bytes, rate, ETA; erased when done), and one stderr line per file
downloaded (none on failure, so that the error stays one line).
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.progress import progress, write
from mnistflow.data.datasets import KnownDataset, RemoteFile

TIMEOUT = 30.0  # seconds without progress before a mirror counts as failed
_CHUNK = 1 << 20


class _Unreachable(Exception):
    """The mirror could not be reached at all (DNS, refused, timeout, HTTP error)."""


class _BadTransfer(Exception):
    """The mirror answered but the file came wrong (short read, wrong checksum)."""


def _mirrors(ds: KnownDataset) -> list[str]:
    env = os.environ.get("MNISTFLOW_MIRROR", "").strip()
    out = [env] if env else []
    out += [m for m in ds.mirrors if m not in out]
    return [m if m.endswith("/") else m + "/" for m in out]


def _md5_file(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _matches(path: Path, f: RemoteFile, md5: str | None = None) -> bool:
    """The published md5, or (re-compressed .gz) the md5 of the uncompressed content."""
    if (md5 or _md5_file(path)) == f.md5:
        return True
    if f.raw_md5 and f.name.endswith(".gz"):
        try:
            with gzip.open(path, "rb") as g:
                h = hashlib.md5()
                for chunk in iter(lambda: g.read(_CHUNK), b""):
                    h.update(chunk)
            return h.hexdigest() == f.raw_md5
        except (OSError, EOFError, zlib.error):
            return False
    return False


def _download(url: str, part: Path) -> str:
    """Stream ``url`` into ``part``; returns the md5. Raises _Unreachable / _BadTransfer."""
    try:
        resp = urllib.request.urlopen(url, timeout=TIMEOUT)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise _Unreachable(str(getattr(e, "reason", None) or e)) from None
    h = hashlib.md5()
    got = 0
    with resp:
        length = resp.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        try:
            out = open(part, "wb")
        except OSError as e:
            fail(part, f"cannot write ({e.strerror or e})")
        with out, progress(expected, url.rsplit("/", 1)[-1], "B", unit_scale=True) as bar:
            while True:
                try:
                    chunk = resp.read(_CHUNK)
                except (http.client.HTTPException, OSError) as e:
                    raise _BadTransfer(f"connection dropped after {got} bytes "
                                       f"({type(e).__name__}: {e})") from None
                if not chunk:
                    break
                h.update(chunk)
                got += len(chunk)
                bar.update(len(chunk))
                try:
                    out.write(chunk)
                except OSError as e:
                    fail(part, f"cannot write ({e.strerror or e})")
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as e:
                fail(part, f"cannot write ({e.strerror or e})")
    if expected is not None and got != expected:
        raise _BadTransfer(f"connection dropped: got {got} of {expected} bytes")
    if got == 0:
        raise _BadTransfer("sent an empty file")
    return h.hexdigest()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fetch_file(f: RemoteFile, mirrors: list[str], dest: Path) -> tuple[list[str], list[str]]:
    """Try each mirror for ``f``; ([], []) on success, else (unreachable, bad-transfer) notes."""
    final, part = dest / f.name, dest / (f.name + ".part")
    unreachable, bad = [], []
    for base in mirrors:
        url = base + f.name
        try:
            md5 = _download(url, part)
            if not _matches(part, f, md5):
                raise _BadTransfer(f"gave md5 {md5}, expected the published {f.md5}")
            size = part.stat().st_size
            os.replace(part, final)
            _fsync_dir(dest)
            write(f"mnistflow: downloaded {url} ({size / 1e6:.1f} MB, checksum OK)", sys.stderr)
            return [], []
        except _Unreachable as e:
            unreachable.append(f"{url}: {e}")
        except _BadTransfer as e:
            bad.append(f"{url} {e}")
        finally:
            part.unlink(missing_ok=True)
    return unreachable, bad


def fetch_known(ds: KnownDataset, dest: Path) -> Path:
    """Download the files of ``ds`` into ``dest`` (verified); returns ``dest``."""
    dest = Path(dest)
    created = not dest.exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(dest, f"cannot create the download folder ({e.strerror or e})")
    mirrors = _mirrors(ds)
    if not mirrors:
        fail(dest, f"no mirror known for {ds.name}; set MNISTFLOW_MIRROR to a base URL")
    todo = [f for f in ds.files if not ((dest / f.name).is_file() and _matches(dest / f.name, f))]
    try:
        for i, f in enumerate(todo):
            unreachable, bad = _fetch_file(f, mirrors, dest)
            if bad:
                raise MnistflowError(f"could not download {f.name} for {ds.name}: "
                                     + "; ".join(bad + unreachable), dest)
            if unreachable:
                names = ", ".join(g.name for g in todo[i:])
                example = (ds.mirrors[0] if ds.mirrors else mirrors[0]).rstrip("/") + "/" + f.name
                raise MnistflowError(
                    f"cannot download {ds.name}: no mirror reachable ({unreachable[0]}). Fetch "
                    f"{names} by hand (e.g. {example}) into {dest}, or point --data or "
                    f"MNISTFLOW_DATA at a folder holding them", dest)
    except BaseException:
        for f in ds.files:
            (dest / (f.name + ".part")).unlink(missing_ok=True)
        if created:
            try:
                dest.rmdir()  # only if empty: files already verified stay
            except OSError:
                pass
        raise
    return dest
