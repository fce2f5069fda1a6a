"""CSV images: one image per row, ``label,pixel0,...,pixelP-1`` -> ``RawDataset``.

* ``.csv`` or ``.csv.gz``; an optional header row is detected (any non-numeric cell). With a
  header, a column named ``label`` is the label column wherever it is; else the first column.
* P pixels make a grey image when P is a square (s*s -> s x s x 1), else an RGB image when
  P/3 is a square, stored **channel-last** (r,g,b of pixel 0, then of pixel 1, ... row-major:
  the order of ``x.reshape(N, -1)`` for ``x`` of shape (N, s, s, 3)).
* Pixels are integers 0..255 (``12.0`` is accepted as 12); labels are integers >= 0, and the
  classes are the values the training rows use (labels 1..26 make 26 classes named "1".."26";
  ``raw.from_original_labels``).
* Test split: for ``<a>train<b>.csv`` a sibling ``<a>test<b>.csv`` (same folder) is read as
  the test split (``companion_files`` names it); a sibling without a label column (one column
  fewer, like Kaggle's unlabelled ``test.csv``) is ignored.
Every error names the file and the 1-based line number.
"""
from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from mnistflow.core import limits
from mnistflow.core.errors import fail
from mnistflow.data.formats.idx import open_input
from mnistflow.data.formats.raw import (
    RawDataset,
    RawSplit,
    check_dataset_bytes,
    dataset_from_labels,
)

_CHUNK = 4096


def companion_files(path: str | os.PathLike) -> list[Path]:
    """The sibling test CSV of a ``*train*.csv`` file, when there is one."""
    path = Path(path)
    name = path.name
    i = name.lower().rfind("train")
    if i < 0:
        return []
    sib = path.with_name(name[:i] + ("TEST" if name[i:i + 5].isupper() else "test") + name[i + 5:])
    return [sib] if sib != path and sib.is_file() else []


def _is_number(cell: str) -> bool:
    try:
        float(cell.strip().strip('"'))
        return True
    except ValueError:
        return False


def _diagnose(path: Path, lines: list[str], linenos: list[int], ncols: int) -> None:
    """Find and report the first bad line in a chunk that numpy refused."""
    for ln, lineno in zip(lines, linenos):
        cells = ln.split(",")
        if len(cells) != ncols:
            fail(path, f"line {lineno}: {len(cells)} values, expected {ncols} like the first row")
        for col, cell in enumerate(cells, 1):
            c = cell.strip().strip('"')
            try:
                v = float(c)
            except ValueError:
                what = f"'{c[:20]}' is not a number" if c else "empty value"
                fail(path, f"line {lineno}, column {col}: {what}")
            if not math.isfinite(v) or v != int(v):
                fail(path, f"line {lineno}, column {col}: {c[:20]} is not an integer")
    fail(path, f"line {linenos[0]}..{linenos[-1]}: unparseable values")


def _parse_chunk(path: Path, lines: list[str], linenos: list[int], ncols: int) -> np.ndarray:
    try:
        a = np.loadtxt(lines, delimiter=",", dtype=np.int64, comments=None,
                       quotechar='"', ndmin=2)
        if a.shape[1] == ncols:
            return a
        _diagnose(path, lines, linenos, ncols)
    except ValueError:
        pass
    try:  # integral floats such as 12.0
        f = np.loadtxt(lines, delimiter=",", dtype=np.float64, comments=None,
                       quotechar='"', ndmin=2)
    except ValueError:
        _diagnose(path, lines, linenos, ncols)
    bad = ~np.isfinite(f) | (f != np.round(f)) | (np.abs(f) > 2**62)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        fail(path, f"line {linenos[r]}, column {c + 1}: {f[r, c]} is not an integer")
    if f.shape[1] != ncols:
        _diagnose(path, lines, linenos, ncols)
    return f.astype(np.int64)


def _image_shape(path: Path, npix: int) -> tuple[int, int, int]:
    s = math.isqrt(npix)
    if npix > 0 and s * s == npix:
        return s, s, 1
    s = math.isqrt(npix // 3)
    if npix > 0 and npix % 3 == 0 and s * s * 3 == npix:
        return s, s, 3
    fail(path, f"{npix} pixel columns is neither a square (grey s*s) nor 3 times a square "
               "(RGB s*s*3); expected rows 'label,pixel0,...'")


def _rows(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of the non-blank lines, streamed (a ``.gz`` is never inflated
    whole); a line longer than ``limits.MAX_CSV_LINE_BYTES`` is refused before it is all read."""
    with open_input(path) as (f, _, _):
        lineno = offset = 0
        any_rows = False
        while True:
            raw = f.readline(limits.MAX_CSV_LINE_BYTES + 1)
            if not raw:
                break
            if len(raw) > limits.MAX_CSV_LINE_BYTES:
                fail(path, f"line {lineno + 1} is longer than {limits.MAX_CSV_LINE_BYTES:,} bytes: "
                           "not a CSV of images")
            try:
                text = raw.decode("utf-8-sig" if offset == 0 else "utf-8")
            except UnicodeDecodeError as e:
                fail(path, f"not a text CSV file (byte {offset + e.start} is not UTF-8)")
            offset += len(raw)
            for ln in text.splitlines():
                lineno += 1
                if ln.strip():
                    any_rows = True
                    yield lineno, ln
    if not any_rows:
        fail(path, "no data rows")


def _chunks(rows: Iterator[tuple[int, str]], size: int) -> Iterator[list[tuple[int, str]]]:
    part: list[tuple[int, str]] = []
    for r in rows:
        part.append(r)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part


def _read_split(path: Path, rows: Iterator[tuple[int, str]]) -> tuple[np.ndarray, np.ndarray]:
    rows = iter(rows)
    head = next(rows)
    first = head[1].split(",")
    ncols = len(first)
    label_col = 0
    pending = [head]
    if not all(_is_number(c) for c in first):  # a header
        names = [c.strip().strip('"').lower() for c in first]
        label_col = names.index("label") if "label" in names else 0
        pending = []
        nxt = next(rows, None)
        if nxt is None:
            fail(path, "has a header but no data rows")
        pending = [nxt]
    if ncols < 2:
        fail(path, f"line {pending[0][0]}: expected 'label,pixel0,...' (at least 2 columns)")
    shape = _image_shape(path, ncols - 1)
    pix = [c for c in range(ncols) if c != label_col]
    xs, ys = [], []
    total = 0
    for part in _chunks(itertools.chain(pending, rows), _CHUNK):
        linenos = [r[0] for r in part]
        a = _parse_chunk(path, [r[1] for r in part], linenos, ncols)
        p = a[:, pix]
        bad = (p < 0) | (p > 255)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            col = pix[c] + 1
            fail(path, f"line {linenos[r]}, column {col}: pixel {p[r, c]} is outside 0..255")
        lab = a[:, label_col]
        if (lab < 0).any():
            r = int(np.flatnonzero(lab < 0)[0])
            fail(path, f"line {linenos[r]}: label {lab[r]} is negative")
        total += p.size
        check_dataset_bytes(path, total)
        xs.append(p.astype(np.uint8))
        ys.append(lab)
    x = np.concatenate(xs)
    return x.reshape((len(x), *shape)), np.concatenate(ys)


def _first_row(path: Path) -> str:
    rows = _rows(path)
    try:
        return next(rows)[1]
    finally:
        rows.close()


def read_csv(path: str | os.PathLike, name: str | None = None) -> RawDataset:
    """Read a ``label,pixel...`` CSV (and its ``*test*`` sibling) into a ``RawDataset``."""
    path = Path(path)
    x, y = _read_split(path, _rows(path))
    test = None
    test_path = None
    files = [path]
    for sib in companion_files(path):
        if _first_row(sib).count(",") == x[0].size - 1:
            continue  # pixels without labels (like Kaggle's test.csv): not a test split
        tx, ty = _read_split(sib, _rows(sib))
        if tx.shape[1:] != x.shape[1:]:
            fail(sib, f"test images are {tx.shape[1:]} but {path.name} has {x.shape[1:]}")
        test, test_path = RawSplit(tx, ty), sib
        files.append(sib)
    stem = path.name.split(".")[0]
    return dataset_from_labels(name or stem, RawSplit(x, y), test, files, where=path,
                               test_where=test_path)
