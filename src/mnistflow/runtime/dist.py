"""Data parallel training under torchrun: one place decides what each rank does.

    torchrun --standalone --nproc_per_node 2 -m mnistflow train --recipe seed-cnn
    torchrun --nnodes 2 --node_rank 0 --rdzv_endpoint HOST:29500 --nproc_per_node 4 -m mnistflow train ...
    mnistflow train --nproc 2 ...      # the same as the first line, for one machine

Each rank reads its own interleaved shard of every epoch's order; DistributedDataParallel
averages gradients, so the global batch is per-rank batch x world size. Only rank 0 prints,
writes TensorBoard, metrics and checkpoints. Collectives time out (``MNISTFLOW_DIST_TIMEOUT``,
default 60 s) so a dead rank ends the job instead of hanging it.

Every helper here is a no-op in a single process (no process group): callers need no
``if distributed`` around them, and a single process pays nothing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import math
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Iterator, TypeVar

import torch
import torch.distributed as tdist

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import note
from mnistflow.runtime.cpu import launch_env

TIMEOUT_ENV = "MNISTFLOW_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0

# Small CPU-side collectives (stop flags, barriers, objects) go through a gloo group: with
# NCCL as the default backend they would otherwise need a GPU tensor and a device sync.
_control = None


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str = ""  # gloo or nccl once the process group is up

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_info() -> DistInfo:
    """Rank and world size from torchrun's environment (a single process without it)."""
    return DistInfo(*launch_env())


def timeout_s() -> float:
    """How long a collective waits for a silent peer (``$MNISTFLOW_DIST_TIMEOUT``): finite,
    positive and at most a week (inf, nan or 1e30 would overflow the process group's timer)."""
    raw = os.environ.get(TIMEOUT_ENV) or str(DEFAULT_TIMEOUT_S)
    try:
        t = float(raw)
    except ValueError:
        t = math.nan
    if not 0 < t <= limits.MAX_DIST_TIMEOUT_S:  # False for nan
        raise MnistflowError(f"{TIMEOUT_ENV} must be a positive number of seconds (at most "
                             f"{limits.MAX_DIST_TIMEOUT_S:g}, 7 days), got '{raw}'")
    return t


def initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def init(device_kind: str) -> DistInfo:
    """Join the process group when launched by torchrun: gloo on CPUs, NCCL on GPUs."""
    global _control
    info = env_info()
    if not info.enabled:
        return info
    if not tdist.is_available():
        raise MnistflowError("this PyTorch build has no torch.distributed")
    if tdist.is_initialized():
        return dataclasses.replace(info, backend=tdist.get_backend())
    if device_kind not in ("cpu", "cuda"):
        raise MnistflowError(f"data parallel training runs on CPUs (gloo) or CUDA GPUs (NCCL), "
                             f"not on {device_kind}: use --device cpu or cuda")
    timeout = datetime.timedelta(seconds=timeout_s())
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if backend == "nccl":
        n = torch.cuda.device_count()
        if info.local_rank >= n:
            raise MnistflowError(f"torchrun started {info.local_world_size} processes on this machine but "
                                 f"only {n} GPU(s) are visible (CUDA_VISIBLE_DEVICES); start at most {n} "
                                 "per machine, or train on the CPU (--device cpu)")
        torch.cuda.set_device(info.local_rank)
    try:
        _join(backend, info, timeout)
    except MnistflowError:
        raise
    except Exception as e:  # a peer that never came (or died while joining), a refused connection
        if not is_comm_failure(e) and not isinstance(e, (OSError, TimeoutError)):
            raise
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise CommFailure(f"rank {info.rank} of {info.world_size}: could not join the other processes "
                          f"({first[:200]}): one did not start, or died, within {timeout_s():g} s "
                          f"(${TIMEOUT_ENV}); the process that failed first reports why") from None
    _control = tdist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    return dataclasses.replace(info, backend=backend)


def _join(backend: str, info: DistInfo, timeout: datetime.timedelta) -> None:
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        tdist.init_process_group(backend, timeout=timeout)
        return
    # torchrun's agents keep one store for the whole job: after a failure (--max-restarts)
    # the new processes would find the failed attempt's keys there (the addresses of dead
    # processes), so each attempt joins under its own key prefix. The attempt is counted per
    # rank in the store: TORCHELASTIC_RESTART_COUNT is not agreed on across machines (under
    # the c10d rendezvous a node whose process was still running when a peer failed restarts
    # without counting it). Every rank joins once per attempt, so the counts agree.
    from torch.distributed.rendezvous import rendezvous

    store, _, _ = next(rendezvous("env://", timeout=timeout))
    attempt = store.add(f"mnistflow/joins/rank{info.rank}", 1)
    tdist.init_process_group(backend, store=tdist.PrefixStore(f"mnistflow/attempt{attempt}/", store),
                             rank=info.rank, world_size=info.world_size, timeout=timeout)


def gpus_for_processes(env: DistInfo, device: torch.device, asked: str) -> torch.device:
    """One GPU per process (NCCL cannot put two ranks on one GPU): with more processes on
    this machine than GPUs visible, ``--device auto`` trains on the CPUs (gloo) instead, and
    an explicit ``cuda`` is a one-line error. Every rank decides alike (same environment)."""
    if device.type != "cuda" or not env.enabled:
        return device
    gpus = torch.cuda.device_count()
    if env.local_world_size <= gpus:
        return device
    if asked == "auto":
        if env.local_rank == 0:
            note(f"{env.local_world_size} processes on this machine and {gpus} GPU(s) (one each is needed): "
                 "training on the CPUs")
        return torch.device("cpu")
    raise MnistflowError(f"--device {asked}: {env.local_world_size} processes on this machine need a GPU each; "
                         f"{gpus} visible (use --nproc {gpus}, or --device cpu)")


def device_for(info: DistInfo, requested: torch.device) -> torch.device:
    """Under torchrun each process takes the GPU of its local rank (among the visible ones)."""
    if requested.type == "cuda" and info.enabled:
        return torch.device("cuda", info.local_rank)
    return requested


def _group(t: torch.Tensor | None = None):
    """The group for a collective on ``t``: the gloo side group for CPU tensors under NCCL."""
    if _control is not None and (t is None or t.device.type == "cpu"):
        return _control
    return None


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks in place (no-op in a single process)."""
    if initialized():
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM, group=_group(t))
    return t


def max_over_ranks(value: int) -> int:
    """The largest ``value`` of all ranks (a stop flag, a signal number): one tiny CPU collective."""
    if not initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=_group(t))
    return int(t[0])


_T = TypeVar("_T")


def broadcast_object(obj: _T, src: int = 0) -> _T:
    """``obj`` of rank ``src`` on every rank (picklable values: paths, small dicts)."""
    if initialized():
        box = [obj]
        tdist.broadcast_object_list(box, src=src, group=_group())
        return box[0]
    return obj


def barrier() -> None:
    if initialized():
        tdist.barrier(group=_group())


@contextlib.contextmanager
def local_rank_zero_first(info: DistInfo) -> Iterator[None]:
    """Local rank 0 of each machine runs the block first (e.g. preparing the data cache),
    the other processes after it: no two processes of a machine write the same files."""
    if not info.enabled:
        yield
        return
    if info.local_rank != 0:
        barrier()
    yield
    if info.local_rank == 0:
        barrier()


def params_in_sync(model: torch.nn.Module) -> bool:
    """True when every parameter equals rank 0's, bit for bit (one broadcast of all of them)."""
    if not initialized():
        return True
    params = [p.detach() for p in model.parameters()]
    if not params:
        return True
    mine = torch.cat([p.reshape(-1).float() for p in params])
    ref = mine.clone()
    tdist.broadcast(ref, src=0)
    return max_over_ranks(int(not torch.equal(ref, mine))) == 0


class CommFailure(MnistflowError):
    """This process lost the others (a collective failed, or joining them did). Every rank that
    sees it says so (``per_rank``), not only rank 0: on several machines each log needs its line."""

    per_rank = True


def comm_failure(info: DistInfo, e: BaseException) -> CommFailure:
    """``e``, an error from a collective, as the one line users see."""
    return CommFailure(comm_failure_message(info, e))


def is_comm_failure(e: BaseException) -> bool:
    """An error from a collective: a peer died, hung past the timeout, or the link broke."""
    if isinstance(e, getattr(tdist, "DistError", ())):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        s in text for s in ("gloo", "Gloo", "NCCL", "Connection closed by peer", "Connection reset",
                            "Timed out", "timed out", "ProcessGroup", "Broken pipe"))


def comm_failure_message(info: DistInfo, e: BaseException) -> str:
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    return (f"rank {info.rank} of {info.world_size}: a collective operation failed ({first[:200]}); "
            "another process has died or hung, so the whole job stops. The process that failed "
            "first reports why; one that hangs is given up on after "
            f"{timeout_s():g} s (${TIMEOUT_ENV})")


def cleanup(sync: bool = True) -> None:
    """Leave the process group. ``sync``: first wait for every rank (after a normal end), so no
    rank tears gloo down while a peer still uses it (seen as a SIGABRT at exit without it)."""
    global _control
    if initialized():
        if sync:
            try:
                barrier()
            except Exception:  # a peer is gone: nothing left to wait for
                pass
        # The run's DDP reducer holds the group; freed only by the cycle collector, it would be
        # torn down at interpreter exit instead, its gloo threads still joinable (a rare SIGABRT,
        # "terminate called without an active exception", after a finished run)
        gc.collect()
        tdist.destroy_process_group()
    _control = None


def launch_local(nproc: int, argv: list[str]) -> int:
    """``mnistflow train --nproc N ...``: re-run the same command under torchrun on this machine.

    Ctrl-C reaches torchrun and its workers directly (one process group): this process keeps
    waiting while they save a checkpoint and stop. SIGTERM sent to this process is passed on.
    """
    if nproc < 1:
        raise MnistflowError(f"--nproc must be >= 1, got {nproc}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "mnistflow", *argv]
    if shutil.which(sys.executable) is None:
        raise MnistflowError(f"cannot find the Python interpreter {sys.executable}")
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:  # else torchrun sets 1 and prints a banner about it
        from mnistflow.runtime.cpu import usable_cores

        env["OMP_NUM_THREADS"] = str(max(1, usable_cores() // nproc))
    proc = subprocess.Popen(cmd, env=env)
    old = None
    try:
        old = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    except ValueError:  # not the main thread
        pass
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:
                continue  # torchrun got the same Ctrl-C and stops the workers
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    return rc if rc >= 0 else 128 - rc
