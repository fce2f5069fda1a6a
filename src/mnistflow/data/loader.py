"""Batches from records, fast enough that the model never waits.

Two loaders, one interface (``__len__``, ``__iter__``, ``set_epoch``, ``stats``):

* ``ResidentLoader``: the whole uint8 split lives on the training device; each batch is
  gathered, converted and normalized there (no per-sample Python, no worker processes).
* ``StreamLoader``: for splits that do not fit in memory; a background thread reads batches
  from the memory map into a bounded queue.

The order of every epoch is a pure function of (seed, epoch, rank), so resuming needs only
the epoch and the step within it.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from mnistflow.core.errors import MnistflowError


@dataclass
class LoaderStats:
    """What the trainer shows users about the input pipeline ("watch your input queue")."""

    wait_s: float = 0.0  # seconds the consumer spent waiting for batches, cumulative
    batches: int = 0
    queue_depth: int = 0  # batches ready in the queue at the last fetch (resident: always 0)


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


class ResidentLoader:
    """Batches gathered from a device-resident uint8 split, normalized on the device."""

    def __init__(self, x: np.ndarray | list[np.ndarray], y: np.ndarray, *, batch_size: int,
                 mean, std, device: torch.device | str = "cpu", shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, rank: int = 0, world_size: int = 1,
                 channels_last: bool = False, augment: bool = False,
                 dtype: torch.dtype = torch.float32, pad: bool = True):
        self.device = torch.device(device)
        # One resident copy per variant (variant 0 = the original images), NCHW uint8.
        xs = x if isinstance(x, list) else [x]
        self.xs = [self._to_device(a, channels_last) for a in xs]
        self.y = torch.as_tensor(np.asarray(y), dtype=torch.int64).to(self.device)
        self.n = len(self.y)
        if batch_size <= 0:
            raise MnistflowError(f"batch size must be positive, got {batch_size}")
        self.batch_size = batch_size
        c = self.xs[0].shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self.inv_std = 1.0 / torch.tensor(std, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.channels_last, self.augment, self.dtype = channels_last, augment, dtype
        self.epoch, self.start_batch = 0, 0
        self.stats = LoaderStats()
        self._aug_gen = torch.Generator()

    def _to_device(self, a: np.ndarray, channels_last: bool) -> torch.Tensor:
        t = torch.from_numpy(np.array(a, copy=True))  # (N, H, W, C): a private copy out of the mmap
        t = t.permute(0, 3, 1, 2)  # NCHW view whose memory is NHWC, i.e. channels_last
        if not channels_last:
            t = t.contiguous()
        return t.to(self.device, non_blocking=True)

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
        x = self.xs[self.epoch % len(self.xs)]
        order = epoch_order(self.n, self.seed, self.epoch, self.rank, self.world_size,
                            self.shuffle, self.drop_last, self.pad).to(self.device)
        # Each rank its own augmentation stream (rank 0's is the single process's).
        self._aug_gen.manual_seed(self.seed * 7919 + self.epoch + self.rank * 1_000_000_007)
        if self.start_batch and self.augment:  # keep the augmentation stream aligned on resume
            from mnistflow.data.augment import skip_batches

            skip_batches(self._aug_gen, self.start_batch, self.batch_size, x.shape[1])
        nb, bs = len(self), self.batch_size
        for b in range(self.start_batch, nb):
            t0 = time.perf_counter()
            idx = order[b * bs:(b + 1) * bs]
            xb = x.index_select(0, idx).to(torch.float32)
            if self.augment:
                from mnistflow.data.augment import augment_batch

                xb = augment_batch(xb, self._aug_gen)
            xb = xb.sub_(self.mean).mul_(self.inv_std)
            if self.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            if self.dtype != torch.float32:
                xb = xb.to(self.dtype)
            yb = self.y.index_select(0, idx)
            self.stats.wait_s += time.perf_counter() - t0
            self.stats.batches += 1
            yield xb, yb
        self.start_batch = 0


class StreamLoader:
    """Batches read from the memory map by a background thread into a bounded queue."""

    def __init__(self, x: np.ndarray, y: np.ndarray, *, batch_size: int, mean, std,
                 device: torch.device | str = "cpu", shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, rank: int = 0, world_size: int = 1,
                 channels_last: bool = False, prefetch: int = 4, delay_s: float = 0.0,
                 pad: bool = True):
        self.x, self.y = x, np.asarray(y)
        self.device = torch.device(device)
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.rank, self.world_size, self.pad, self.channels_last = rank, world_size, pad, channels_last
        self.prefetch, self.delay_s = prefetch, delay_s  # delay_s: an injected slow reader (tests)
        c = x.shape[-1]
        self.mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self.inv_std = 1.0 / torch.tensor(std, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self.n = len(self.y)
        self.epoch, self.start_batch = 0, 0
        self.stats = LoaderStats()

    set_epoch = ResidentLoader.set_epoch
    _num_samples = ResidentLoader._num_samples
    __len__ = ResidentLoader.__len__

    def _produce(self, order: np.ndarray, q: queue.Queue, stop: threading.Event) -> None:
        bs = self.batch_size
        try:
            for b in range(self.start_batch, len(self)):
                idx = np.sort(order[b * bs:(b + 1) * bs])  # sorted reads are kinder to the page cache
                xb = torch.from_numpy(np.ascontiguousarray(self.x[idx]))
                yb = torch.from_numpy(self.y[idx].astype(np.int64))
                if self.device.type == "cuda":  # page-locked: the copy below is truly asynchronous
                    xb, yb = xb.pin_memory(), yb.pin_memory()
                if self.delay_s:
                    time.sleep(self.delay_s)
                while not stop.is_set():
                    try:
                        q.put((xb, yb), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(None)
        except BaseException as e:  # surfaced in the consumer
            q.put(e)

    def __iter__(self):
        order = epoch_order(self.n, self.seed, self.epoch, self.rank, self.world_size,
                            self.shuffle, self.drop_last, self.pad).numpy()
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        th = threading.Thread(target=self._produce, args=(order, q, stop), daemon=True)
        th.start()
        try:
            while True:
                t0 = time.perf_counter()
                self.stats.queue_depth = q.qsize()
                item = q.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                xb, yb = item
                xb = xb.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float()
                xb = xb.sub_(self.mean).mul_(self.inv_std)
                xb = xb.contiguous(memory_format=torch.channels_last if self.channels_last
                                   else torch.contiguous_format)
                self.stats.wait_s += time.perf_counter() - t0
                self.stats.batches += 1
                yield xb, yb.to(self.device, non_blocking=True)
        finally:
            stop.set()
            th.join(timeout=5)
            self.start_batch = 0


def normalized_batch(images: np.ndarray, mean, std, device: torch.device | str = "cpu",
                     channels_last: bool = False) -> torch.Tensor:
    """uint8 images (N, H, W, C) as the normalized float32 batch (N, C, H, W) models take,
    the way the loaders make each batch (``mean``/``std`` per channel, in 0..255 units)."""
    x = torch.from_numpy(np.array(images)).to(device).permute(0, 3, 1, 2).float()  # a copy: mmaps are read-only
    c = x.shape[1]
    mean = torch.as_tensor(mean, dtype=torch.float32, device=x.device).view(1, c, 1, 1)
    std = torch.as_tensor(std, dtype=torch.float32, device=x.device).view(1, c, 1, 1)
    return ((x - mean) / std).contiguous(memory_format=torch.channels_last if channels_last
                                         else torch.contiguous_format)


def fits_in_memory(nbytes: int, device: torch.device) -> bool:
    """True when a resident copy of ``nbytes`` leaves at least half the free memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return nbytes < free // 2
    import psutil

    return nbytes < psutil.virtual_memory().available // 2


def make_loader(rec, split: str, *, batch_size: int, device: torch.device | str = "cpu",
                train: bool = True, seed: int = 0, drop_last: bool = False, rank: int = 0,
                world_size: int = 1, channels_last: bool = False, augment: bool = False,
                resident: str = "auto", delay_s: float = 0.0, pad: bool = True):
    """The loader for ``split`` of an opened record set (``mnistflow.data.records.Records``).

    ``rank``/``world_size``: this process's shard (see ``epoch_order``); ``pad=False`` for
    evaluation shards, which count every image exactly once over the ranks."""
    device = torch.device(device)
    x, y = rec.split(split)
    xs = [x] + ([rec.split(split, k)[0] for k in range(1, rec.variants + 1)]
                if train and split.startswith("train") else [])
    nbytes = sum(a.nbytes for a in xs)
    if resident == "auto":
        resident = "yes" if fits_in_memory(nbytes, device) and not delay_s else "no"
    common = dict(batch_size=batch_size, mean=rec.mean, std=rec.std, device=device,
                  shuffle=train, seed=seed, drop_last=drop_last, rank=rank,
                  world_size=world_size, channels_last=channels_last, pad=pad)
    if resident == "yes":
        return ResidentLoader(xs, y, augment=augment, **common)
    return StreamLoader(x, y, delay_s=delay_s, **common)
