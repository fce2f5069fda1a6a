"""The prepared record format: one directory per dataset, written once, atomically.

    DIR/meta.json            name, class names, shape, splits, mean/std, checksums, options
    DIR/{split}_x.npy        (N, H, W, C) uint8, opened by memory map (no copy)
    DIR/{split}_y.npy        (N,) int64
    DIR/train_x.aug{k}.npy   K augmented copies of the training images (same labels)

The directory is built under a temporary name next to DIR and renamed into place,
so a crash never leaves a half-written record set behind.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnistflow.core.errors import MnistflowError, fail
from mnistflow.data.formats.raw import RawDataset
from mnistflow.core.fsutil import sha256_file

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")


@dataclass
class Records:
    """An opened record set. Arrays are read-only memory maps."""

    path: Path
    meta: dict

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def class_names(self) -> list[str]:
        return list(self.meta["class_names"])

    @property
    def num_classes(self) -> int:
        return len(self.meta["class_names"])

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, C) of one image."""
        return tuple(self.meta["shape"])  # type: ignore[return-value]

    @property
    def mean(self) -> list[float]:
        return self.meta["mean"]

    @property
    def std(self) -> list[float]:
        return self.meta["std"]

    @property
    def variants(self) -> int:
        return int(self.meta.get("variants", 0))

    def has(self, split: str) -> bool:
        return self.size(split) > 0

    def size(self, split: str) -> int:
        """Images in ``split``; ``"train+val"`` counts both."""
        return sum(self.meta["splits"].get(s, 0) for s in split.split("+"))

    def split(self, split: str, variant: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(images, labels) of ``split``; ``variant`` k > 0 picks augmented copy k of train.

        ``"train+val"``: all labelled images, train's then val's, copied into memory once
        (the validation images are never augmented copies)."""
        if "+" in split:
            parts = [self.split(s, variant if s == "train" else 0) for s in split.split("+") if self.has(s)]
            if not parts:
                raise MnistflowError(f"has no '{split}' split", self.path)
            return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
        if not self.has(split):
            raise MnistflowError(f"has no '{split}' split", self.path)
        xname = f"{split}_x.npy" if variant == 0 else f"{split}_x.aug{variant}.npy"
        x = np.load(self.path / xname, mmap_mode="r", allow_pickle=False)
        y = np.load(self.path / f"{split}_y.npy", allow_pickle=False)
        return x, y


def _save_npy(folder: Path, name: str, arr: np.ndarray, checksums: dict[str, str]) -> None:
    p = folder / name
    with open(p, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    checksums[name] = sha256_file(p)


def _channel_stats(x: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 images in 0..255 units (float64 accumulation)."""
    c = x.shape[-1]
    flat = x.reshape(-1, c)
    # Chunked to bound memory on large sets.
    s = np.zeros(c)
    s2 = np.zeros(c)
    for i in range(0, len(flat), 1 << 22):
        part = flat[i:i + (1 << 22)].astype(np.float64)
        s += part.sum(0)
        s2 += (part * part).sum(0)
    n = max(len(flat), 1)
    mean = s / n
    std = np.sqrt(np.maximum(s2 / n - mean**2, 1e-12))
    return mean.tolist(), std.tolist()


def split_train_val(n: int, val_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train_idx, val_idx), both sorted, from a seeded permutation."""
    if val_size < 0 or val_size >= n:
        raise MnistflowError(f"--val-size {val_size} must be in 0..{n - 1} for {n} training images")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[val_size:]), np.sort(perm[:val_size])


def write_records(raw: RawDataset, out: Path, *, key: str, options: dict,
                  source_checksums: dict[str, str], val_size: int = 5000, seed: int = 0,
                  variants: int = 0, force: bool = False) -> Path:
    """Write ``raw`` as a record set at ``out`` atomically; returns ``out``."""
    out = Path(out)
    tr_idx, va_idx = split_train_val(len(raw.train.y), val_size, seed)
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        checksums: dict[str, str] = {}
        xtr, ytr = raw.train.x[tr_idx], raw.train.y[tr_idx]
        parts = {"train": (xtr, ytr), "val": (raw.train.x[va_idx], raw.train.y[va_idx])}
        if raw.test is not None:
            parts["test"] = (raw.test.x, raw.test.y)
        counts = {}
        for split, (x, y) in parts.items():
            counts[split] = int(len(y))
            if len(y):
                _save_npy(tmp, f"{split}_x.npy", x, checksums)
                _save_npy(tmp, f"{split}_y.npy", y.astype(np.int64), checksums)
        if variants:
            from mnistflow.data.augment import make_variant

            for k in range(1, variants + 1):
                _save_npy(tmp, f"train_x.aug{k}.npy", make_variant(xtr, seed * 1000 + k), checksums)
        mean, std = _channel_stats(xtr)
        meta = {
            "format_version": FORMAT_VERSION,
            "name": raw.name,
            "class_names": list(raw.class_names),
            "shape": list(raw.train.x.shape[1:]),
            "splits": counts,
            "mean": mean,
            "std": std,
            "variants": variants,
            "val_size": val_size,
            "seed": seed,
            "options": options,
            "key": key,
            "sources": source_checksums,
            "files": checksums,
        }
        with open(tmp / "meta.json", "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _replace_dir(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _replace_dir(tmp: Path, out: Path, force: bool) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is swapped away only after success."""
    if out.exists():
        if not force and not (out / "meta.json").is_file() and any(out.iterdir()):
            fail(out, "exists and is not a record set; use --force to replace it")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fd = os.open(out.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(path: Path) -> dict:
    path = Path(path)
    mp = path / "meta.json"
    if not mp.is_file():
        fail(path, "not a records directory (no meta.json); run 'mnistflow prep' first")
    try:
        meta = json.loads(mp.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        fail(mp, f"unreadable metadata ({e})")
    if not isinstance(meta, dict) or "format_version" not in meta:
        fail(mp, "not mnistflow record metadata")
    v = meta["format_version"]
    if not isinstance(v, int) or v > FORMAT_VERSION:
        fail(path, f"written by a newer mnistflow (record format {v}; this version reads up to "
                   f"{FORMAT_VERSION}): upgrade mnistflow or re-run 'mnistflow prep --force'")
    for k in ("name", "class_names", "shape", "splits", "mean", "std", "files"):
        if k not in meta:
            fail(mp, f"metadata lacks '{k}'")
    return meta


def verify(path: Path, meta: dict | None = None) -> None:
    """Check every payload file against the checksum recorded in meta.json."""
    path = Path(path)
    meta = meta or read_meta(path)
    for name, digest in meta["files"].items():
        p = path / name
        if not p.is_file():
            fail(p, "missing from the record set")
        if sha256_file(p) != digest:
            fail(p, "checksum does not match meta.json: the record set is corrupt; "
                    "re-run 'mnistflow prep --force'")


def open_records(path: Path | str, verify_checksums: bool = True) -> Records:
    """Open a record set, verifying its checksums unless told not to."""
    path = Path(path)
    meta = read_meta(path)
    if verify_checksums:
        verify(path, meta)
    return Records(path, meta)


def describe(rec: Records) -> str:
    """What a record set holds, as a few aligned lines."""
    m = rec.meta
    h, w, c = rec.shape
    lines = [
        f"records   {rec.path}",
        f"dataset   {m['name']}  (format {m['format_version']})",
        f"images    {h}x{w}x{c} uint8",
        f"classes   {rec.num_classes}: {', '.join(rec.class_names)}",
    ]
    for s in SPLITS:
        lines.append(f"{s:<9} {m['splits'].get(s, 0):,}")
    lines.append(f"variants  {m.get('variants', 0)} augmented copies of train")
    lines.append("mean/std  " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(m["mean"], m["std"])))
    size = sum((rec.path / f).stat().st_size for f in m["files"])
    lines.append(f"size      {size / 2**20:.1f} MiB in {len(m['files'])} files")
    return "\n".join(lines)
