"""Room for ``torch.compile``'s files: inductor writes the code it generates (and on a CPU a
~150 MB precompiled header) to its cache directory, and the C++ compiler writes its scratch
files to ``$TMPDIR``. A full one of them ended a ``train --compile`` with a 140-line
traceback; it is one line naming the directory now, before the compile starts
(:func:`check_compile_room`) or, when the space ran out during it, after (:func:`compile_failure`).
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from mnistflow.core.errors import MnistflowError
from mnistflow.runtime.compat import inductor_cache_dir

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
MIN_FREE_MB = 64  # free in each directory torch.compile writes to, before it starts


def compile_dirs() -> dict[str, Path]:
    """{what it is: the directory} of what ``torch.compile`` writes."""
    return {"the compile cache directory (TORCHINDUCTOR_CACHE_DIR)": Path(os.path.abspath(inductor_cache_dir())),
            "the temporary directory (TMPDIR) the C++ compiler writes to":
                Path(os.path.abspath(os.environ.get("TMPDIR") or "/tmp"))}


def _existing(p: Path) -> Path:
    """``p``, or its nearest existing parent (where it would be made)."""
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _hint(what: str) -> str:
    var = "TORCHINDUCTOR_CACHE_DIR" if "TORCHINDUCTOR" in what else "TMPDIR"
    return f"free some, set {var} to a folder with room, or train without --compile"


def check_compile_room() -> None:
    """``--compile``: each directory ``torch.compile`` writes to can be written and has at least
    ``MIN_FREE_MB`` free; else one line naming it."""
    for what, d in compile_dirs().items():
        where = _existing(d)
        try:
            free = shutil.disk_usage(where).free
        except OSError as e:
            raise MnistflowError(f"--compile cannot use {what}: {e.strerror}", d) from None
        if not os.access(where, os.W_OK | os.X_OK):
            raise MnistflowError(f"--compile cannot write to {what} (permission denied): "
                                 + _hint(what).replace("free some, ", ""), d)
        if free < MIN_FREE_MB << 20:
            raise MnistflowError(f"--compile needs room for the code it generates: {what} has "
                                 f"{free / 2**20:.1f} MB free (at least {MIN_FREE_MB} MB): "
                                 + _hint(what), d)


def compile_failure(e: BaseException) -> MnistflowError | None:
    """``e`` (raised by a compiled model's first call) as one line when the disk was full
    (``No space left on device`` anywhere in it or its causes: inductor wraps the OSError, or
    the C++ compiler says it in its output); None for any other failure."""
    seen = 0
    cause: BaseException | None = e
    while cause is not None and seen < 20:
        if isinstance(cause, OSError) and cause.errno in NO_SPACE or "No space left on device" in str(cause):
            full = [f"{d} ({what.split(' (')[0].removeprefix('the ')})" for what, d in compile_dirs().items()
                    if _free_mb(d) < MIN_FREE_MB]
            return MnistflowError("--compile ran out of disk space writing the code it generates, in "
                                  + (", ".join(full) if full else " or ".join(map(str, compile_dirs().values())))
                                  + ": free some, set TORCHINDUCTOR_CACHE_DIR / TMPDIR to a folder with room, "
                                  "or train without --compile")
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return None


def _free_mb(d: Path) -> float:
    try:
        return shutil.disk_usage(_existing(d)).free / 2**20
    except OSError:
        return 0.0
