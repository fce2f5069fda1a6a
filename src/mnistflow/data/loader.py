"""Batches from records, fast enough that the model never waits.

One loader (``__len__``, ``__iter__``, ``set_epoch``, ``stats``), two sources of uint8 batches,
and one ``BatchTransform`` (augment, normalize, memory format) applied to both:

* ``ResidentLoader``: the whole uint8 split lives on the training device; each batch is
  gathered, converted and normalized there (no per-sample Python, no worker processes).
* ``StreamLoader``: for splits that do not fit in memory; a background thread reads batches
  from the memory map into a bounded queue.

``make_loader`` picks the source: resident when the split fits in half the free memory.

The order of every epoch is a pure function of (seed, epoch, rank), so resuming needs only
the epoch and the step within it.
"""
from __future__ import annotations


import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mnistflow.data import augment as augmod
from mnistflow.data.normalize import Normalizer

if TYPE_CHECKING:
    from mnistflow.data.records import Records


@dataclass
class LoaderStats:
    """What the trainer shows users about the input pipeline ("watch your input queue")."""

    wait_s: float = 0.0  # seconds the consumer spent waiting for batches, cumulative
    batches: int = 0
    queue_depth: int = 0  # batches ready in the queue at the last fetch (resident: always 0)

    def reset(self) -> None:
        """Forget what was counted (after the warm-up's throw-away batch)."""
        self.wait_s, self.batches, self.queue_depth = 0.0, 0, 0


def epoch_order(n: int, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
                shuffle: bool = True, drop_last: bool = False, pad: bool = True) -> torch.Tensor:
    """Indices this rank visits in ``epoch``: a pure function of its arguments.

    Ranks take interleaved slices of one global permutation, so the union of the ranks'
    k-th batches (each of size B/world) is exactly the k-th batch (of size B) of a single
    process: data parallel training sees the same global batches as one process.

    When ``n`` is not a multiple of ``world_size``, training pads the order by wrapping
    around (every rank gets as many batches: the ranks step together); ``pad=False`` (for
    evaluation) gives every index to exactly one rank, so shards differ in length by one.
    """
    if shuffle:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        perm = torch.randperm(n, generator=g)
    else:
        perm = torch.arange(n)
    if world_size > 1:
        if drop_last:
            perm = perm[: n - n % world_size]
        elif n % world_size and pad:  # pad by wrapping around, like DistributedSampler
            perm = torch.cat([perm, perm[: world_size - n % world_size]])
        perm = perm[rank::world_size]
    return perm


def policy_name(augment: str | None) -> str | None:
    """The policy a loader applies, None for none: ``augment`` is a policy name, ``off`` or
    None. ``auto`` is resolved from the records' name first (``make_loader`` does)."""
    if augment is None or augment == "off":
        return None
    if augment == "auto":
        raise ValueError("augment='auto' is resolved from the records (make_loader), not by a Loader")
    augmod.get_policy(augment)  # an unknown name: an error listing the known ones
    return augment


class BatchTransform:
    """The one transform every batch goes through, whatever its source: uint8 (N, C, H, W) on
    the device -> float, augmented (training: ``augment`` names a policy of
    ``data.augment``), normalized, in the model's memory format and dtype."""

    def __init__(self, mean, std, device: torch.device, *, augment: str | None = None,
                 channels_last: bool = False, dtype: torch.dtype = torch.float32):
        self.normalizer = Normalizer(mean, std, device)
        self.augment = policy_name(augment)
        self.policy = None if self.augment is None else augmod.get_policy(self.augment)
        self.channels_last, self.dtype = channels_last, dtype
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, xb: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        xb = xb.to(torch.float32)
        if self.policy is not None:  # erased pixels (cutout) take the mean: 0 once normalized
            xb = augmod.augment(xb, gen, self.policy, fill=self.normalizer.mean)
        xb = self.normalizer(xb).contiguous(memory_format=self.memory_format)
        return xb if self.dtype == torch.float32 else xb.to(self.dtype)


class Loader:
    """Batches of one split: a source of uint8 batches (``ResidentLoader``: the split on the
    device; ``StreamLoader``: a reader thread over the memory map) and one ``BatchTransform``.

    ``x`` is the split's images (N, H, W, C) uint8, or a list of them: the original and its
    augmented copies (``prep --variants``), one per epoch in turn. Both sources visit the same
    indices in the same order and draw the same augmentation, so they give the same batches.
    """

    queued = False  # True when batches wait in a queue (the starvation meter reads it)

    def __init__(self, x: np.ndarray | list[np.ndarray], y: np.ndarray, *, batch_size: int,
                 mean, std, device: torch.device | str = "cpu", shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, rank: int = 0, world_size: int = 1,
                 channels_last: bool = False, augment: str | None = None,
                 dtype: torch.dtype = torch.float32, pad: bool = True):
        self.device = torch.device(device)
        self.y_np = np.asarray(y)
        self.n = len(self.y_np)
        self.batch_size = batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.transform = BatchTransform(mean, std, self.device, augment=augment,
                                        channels_last=channels_last, dtype=dtype)
        self.channels_last, self.augment = channels_last, self.transform.augment  # a policy name or None
        self.image_hw = tuple((x[0] if isinstance(x, list) else x).shape[1:3])
        self.epoch, self.start_batch = 0, 0
        self.stats = LoaderStats()
        self._aug_gen = torch.Generator()
        self._setup(x if isinstance(x, list) else [x])

    def _setup(self, xs: list[np.ndarray]) -> None:
        raise NotImplementedError

    def _batches(self, variant: int, order: torch.Tensor):
        """Yield this epoch's (uint8 (B, C, H, W) images, int64 labels), both on the device,
        from ``self.start_batch`` on."""
        raise NotImplementedError

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch's order; ``start_batch`` skips batches already trained (resume)."""
        self.epoch, self.start_batch = epoch, start_batch

    def _num_samples(self) -> int:
        if self.world_size == 1:
            return self.n
        if self.drop_last:
            return self.n // self.world_size
        if not self.pad:  # this rank's indices rank, rank + world, ... below n
            return len(range(self.rank, self.n, self.world_size))
        return -(-self.n // self.world_size)

    def __len__(self) -> int:
        m = self._num_samples()
        return m // self.batch_size if self.drop_last else -(-m // self.batch_size)

    def __iter__(self):
        order = epoch_order(self.n, self.seed, self.epoch, self.rank, self.world_size,
                            self.shuffle, self.drop_last, self.pad)
        gen = self._aug_gen
        if self.augment is not None:
            # Each rank its own augmentation stream (rank 0's is the single process's).
            gen.manual_seed(self.seed * 7919 + self.epoch + self.rank * 1_000_000_007)
            if self.start_batch:  # keep the augmentation stream aligned on resume
                augmod.skip(gen, self.augment, self.start_batch, self.batch_size, *self.image_hw)
        batches = self._batches(self.epoch % self.copies, order)
        try:
            while True:
                t0 = time.perf_counter()
                item = next(batches, None)
                if item is None:
                    break
                xb = self.transform(item[0], gen)
                self.stats.wait_s += time.perf_counter() - t0
                self.stats.batches += 1
                yield xb, item[1]
        finally:
            batches.close()
            self.start_batch = 0


class ResidentLoader(Loader):
    """The whole uint8 split (and its variants) lives on the training device; each batch is
    gathered, converted and normalized there (no per-sample Python, no worker processes)."""

    def _setup(self, xs: list[np.ndarray]) -> None:
        self.xs = [self._to_device(a) for a in xs]
        self.copies = len(self.xs)  # the original + its augmented copies
        self.y = torch.as_tensor(self.y_np, dtype=torch.int64).to(self.device)

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.array(a, copy=True))  # (N, H, W, C): a private copy out of the mmap
        t = t.permute(0, 3, 1, 2)  # NCHW view whose memory is NHWC, i.e. channels_last
        if not self.channels_last:
            t = t.contiguous()
        return t.to(self.device, non_blocking=True)

    def _batches(self, variant: int, order: torch.Tensor):
        x, bs = self.xs[variant], self.batch_size
        order = order.to(self.device)
        for b in range(self.start_batch, len(self)):
            idx = order[b * bs:(b + 1) * bs]
            yield x.index_select(0, idx), self.y.index_select(0, idx)


class StreamLoader(Loader):
    """For splits that do not fit in memory: a background thread reads each batch from the
    memory map into a bounded queue (``prefetch`` batches ahead)."""

    queued = True

    def __init__(self, x, y, *, prefetch: int = 4, delay_s: float = 0.0, **kw):
        self.prefetch, self.delay_s = prefetch, delay_s  # delay_s: an injected slow reader (tests)
        super().__init__(x, y, **kw)

    def _setup(self, xs: list[np.ndarray]) -> None:
        self.xs, self.copies = xs, len(xs)
        self.y = self.y_np

    def _produce(self, x: np.ndarray, order: np.ndarray, q: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> bool:  # False once the consumer has gone: never block on a full queue
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        bs = self.batch_size
        try:
            for b in range(self.start_batch, len(self)):
                idx = order[b * bs:(b + 1) * bs]
                # Read in sorted index order (kinder to the page cache), keep the epoch's order.
                by_index = np.argsort(idx, kind="stable")
                rows = x[idx[by_index]]
                xa = np.empty_like(rows)
                xa[by_index] = rows
                xb = torch.from_numpy(xa)
                yb = torch.from_numpy(self.y[idx].astype(np.int64))
                if self.device.type == "cuda":  # page-locked: the copy below is truly asynchronous
                    xb, yb = xb.pin_memory(), yb.pin_memory()
                if self.delay_s:
                    time.sleep(self.delay_s)
                if not put((xb, yb)):
                    return
            put(None)
        except BaseException as e:  # surfaced in the consumer
            put(e)

    def _batches(self, variant: int, order: torch.Tensor):
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        th = threading.Thread(target=self._produce, args=(self.xs[variant], order.numpy(), q, stop),
                              daemon=True)
        th.start()
        try:
            while True:
                self.stats.queue_depth = q.qsize()
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                xb, yb = item
                yield (xb.to(self.device, non_blocking=True).permute(0, 3, 1, 2),
                       yb.to(self.device, non_blocking=True))
        finally:
            stop.set()
            th.join(timeout=5)


def fits_in_memory(nbytes: int, device: torch.device) -> bool:
    """True when a resident copy of ``nbytes`` leaves at least half the free memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return nbytes < free // 2
    import psutil

    return nbytes < psutil.virtual_memory().available // 2


def make_loader(rec: Records, split: str, *, batch_size: int, device: torch.device | str = "cpu",
                train: bool = True, seed: int = 0, drop_last: bool = False, rank: int = 0,
                world_size: int = 1, channels_last: bool = False, augment: str | None = None,
                resident: str = "auto", delay_s: float = 0.0, pad: bool = True,
                norm: tuple[list[float], list[float]] | None = None) -> Loader:
    """The loader for ``split`` of an opened record set (``mnistflow.data.records.Records``).

    ``norm``: the (mean, std) per channel to normalize by: a trained model's own, when its
    images come from other records; by default the records' own (training's).
    ``rank``/``world_size``: this process's shard (see ``epoch_order``); ``pad=False`` for
    evaluation shards, which count every image exactly once over the ranks. ``augment``: a
    policy name (``data.augment.POLICIES``), ``auto`` (the records' dataset's own), ``off``."""
    device = torch.device(device)
    if augment == "auto":
        augment = augmod.resolve_policy("auto", rec.name)[0]
    x, y = rec.split(split)
    xs = [x] + ([rec.split(split, k)[0] for k in range(1, rec.variants + 1)]
                if train and split.startswith("train") else [])
    nbytes = sum(a.nbytes for a in xs)
    if resident == "auto":
        resident = "yes" if fits_in_memory(nbytes, device) and not delay_s else "no"
    mean, std = norm or (rec.mean, rec.std)
    common = dict(batch_size=batch_size, mean=mean, std=std, device=device,
                  shuffle=train, seed=seed, drop_last=drop_last, rank=rank,
                  world_size=world_size, channels_last=channels_last, pad=pad)
    if resident == "yes":
        return ResidentLoader(xs, y, augment=augment, **common)
    return StreamLoader(xs, y, augment=augment, delay_s=delay_s, **common)
