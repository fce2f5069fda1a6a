"""Data parallel training under torchrun: one place decides what each rank does.

    torchrun --standalone --nproc_per_node 2 -m mnistflow train --recipe seed-cnn
    torchrun --nnodes 2 --node_rank 0 --rdzv_endpoint HOST:29500 --nproc_per_node 4 -m mnistflow train ...
    mnistflow train --nproc 2 --max-restarts 3 ...   # the first line, for one machine, restarting

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
import signal
import sys
from dataclasses import dataclass
from typing import Iterator, TypeVar, overload

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
_store = None  # the job's store (``job_store``), connected once per process
LAUNCHER_ENV = "MNISTFLOW_LAUNCHER_PID"  # set by ``launch_local``: the workers' parent


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


def job_store():
    """The key-value store torchrun's agents keep for the whole job, through all its restarts
    (``--max-restarts``, a machine leaving or joining), or None when no torchrun agent started
    this process. Connected once per process (it holds no state of its own)."""
    global _store
    if _store is None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
        try:
            _store = tdist.TCPStore(addr, int(port), is_master=False,
                                    timeout=datetime.timedelta(seconds=timeout_s()))
        except (ValueError, RuntimeError, OSError) as e:  # gone, refused, a bad port
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            raise CommFailure(f"cannot reach the job's store at {addr}:{port} that torchrun named "
                              f"(MASTER_ADDR, MASTER_PORT): {first[:200]}") from None
    return _store


def _join(backend: str, info: DistInfo, timeout: datetime.timedelta) -> None:
    store = job_store()
    if store is None:
        tdist.init_process_group(backend, timeout=timeout)
        return
    # The job's store outlives each attempt (torchrun restarts, nodes leaving or joining): the
    # new processes would find the failed attempt's keys there (the addresses of dead
    # processes), so each attempt joins under its own key prefix. TORCHELASTIC_RESTART_COUNT
    # cannot name it: under the c10d rendezvous a machine whose processes were still running
    # when a peer failed restarts them without counting. So each rank counts its own joins,
    # per world size: the ranks of an attempt of world size W are exactly 0..W-1, each joining
    # once, so their counts agree (a machine that left and came back skipped the same attempts).
    w = info.world_size
    attempt = store.add(f"mnistflow/joins/world{w}/rank{info.rank}", 1)
    tdist.init_process_group(backend, store=tdist.PrefixStore(f"mnistflow/world{w}/attempt{attempt}/", store),
                             rank=info.rank, world_size=w, timeout=timeout)


# Sent to a process under torchrun when its agent dies (``die_with_parent``): not SIGTERM, which
# a dying multi-threaded parent delivers once per thread (the child is handed from thread to
# thread as each exits), and a second SIGTERM means "stop at once, unsaved" to a training.
PARENT_DEATH_SIGNAL = getattr(signal, "SIGUSR2", None)


def die_with_parent() -> None:
    """Under torchrun: end this process when the agent that started it dies, even by ``kill -9``,
    never left training alone in the background: ``PARENT_DEATH_SIGNAL`` (``prctl``, Linux
    only), which a training takes as SIGTERM (it saves a checkpoint and stops;
    ``training.checkpointing``) and which ends any other process at once."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(PARENT_DEATH_SIGNAL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    expected = os.environ.get(LAUNCHER_ENV)
    if os.getppid() != parent or parent == 1 or (expected and expected != str(parent)):
        # the agent died before the death signal was set: it will never be sent
        os.kill(os.getpid(), PARENT_DEATH_SIGNAL)


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


@overload
def max_over_ranks(value: int) -> int: ...
@overload
def max_over_ranks(value: list[int]) -> list[int]: ...


def max_over_ranks(value):
    """The largest ``value`` of all ranks (a stop flag, a signal number), or of each element of a
    list of them: one tiny CPU collective."""
    if not initialized():
        return value
    t = torch.tensor(value if isinstance(value, list) else [value], dtype=torch.int64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=_group(t))
    return t.tolist() if isinstance(value, list) else int(t[0])


_T = TypeVar("_T")


def broadcast_object(obj: _T, src: int = 0) -> _T:
    """``obj`` of rank ``src`` on every rank (picklable values: paths, small dicts)."""
    if initialized():
        box = [obj]
        tdist.broadcast_object_list(box, src=src, group=_group())
        return box[0]
    return obj


def gather_objects(obj: _T) -> list[_T]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` in a single process)."""
    if not initialized():
        return [obj]
    out: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj, group=_group())
    return out


def gather_to_primary(obj: _T) -> list[_T] | None:
    """Every rank's ``obj``, in rank order, on rank 0; None on the others."""
    if not initialized():
        return [obj]
    primary = tdist.get_rank() == 0
    out: list | None = [None] * tdist.get_world_size() if primary else None
    tdist.gather_object(obj, out, dst=0, group=_group())
    return out


def barrier() -> None:
    if initialized():
        tdist.barrier(group=_group())


@contextlib.contextmanager
def local_rank_zero_first(info: DistInfo) -> Iterator[None]:
    """Local rank 0 of each machine runs the block first (e.g. preparing the data cache),
    the other processes after it: no two processes of a machine write the same files. A
    one-line error in the block (data missing on one machine) stops every rank with that line
    (``rank R: ...``), not only the rank that met it (the others would only see it gone)."""
    if not info.enabled:
        yield
        return
    failed: MnistflowError | None = None
    if info.local_rank == 0:
        try:
            yield
        except MnistflowError as e:
            failed = e
    _stop_if_any_failed(info, failed)
    if info.local_rank != 0:
        yield


def _stop_if_any_failed(info: DistInfo, failed: MnistflowError | None) -> None:
    """Every rank's outcome to every rank (the barrier of ``local_rank_zero_first``); the first
    failure is raised on all of them."""
    from mnistflow.core.errors import one_line

    seen = gather_objects(None if failed is None else one_line(failed))
    first = next(((r, why) for r, why in enumerate(seen) if why), None)
    if failed is not None:
        raise failed
    if first is not None:
        raise MnistflowError(f"rank {first[0]} of {info.world_size} failed: {first[1]}")


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


class WorkerDied(MnistflowError):
    """A process of ``launch_local`` died of a signal, without a word of its own (kill -9, the
    OOM killer), and no restart was left: the launcher exits 128 + the signal, as a shell would."""

    def __init__(self, detail: str, exit_code: int):
        super().__init__(detail)
        self.exit_code = exit_code


def launch_local(nproc: int, argv: list[str], max_restarts: int = 0) -> int:
    """``mnistflow train --nproc N [--max-restarts K] ...``: the same command under torchrun's
    elastic agent, run inside this process: N processes on this machine, the group restarted
    up to K times when one fails (each restart resumes the run by itself: ``training.resume``).

    The processes die with this one, even by ``kill -9`` (``die_with_parent``); SIGTERM or
    Ctrl-C here is passed on to them (each saves a checkpoint and stops). What the processes
    say is what the user reads: torchrun's own log lines and failure report are left out.
    Returns the exit code: the first failed process's (2 after its one-line error).
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if nproc < 1:
        raise MnistflowError(f"--nproc must be >= 1, got {nproc}")
    if "OMP_NUM_THREADS" not in os.environ:  # else torchrun sets 1 and prints a banner about it
        from mnistflow.runtime.cpu import usable_cores

        os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cores() // nproc))
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    args = torchrun.parse_args(["--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
                                "-m", "mnistflow", *argv])
    _quiet_agent()
    try:
        torchrun.run(args)
    except SignalException as e:  # SIGTERM / Ctrl-C: passed on; the processes said where they stopped
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        # the root cause: a process killed by a signal (it could say nothing), unless the agent's
        # own SIGTERM stopped it; else the first failure (it said why, in its own line)
        killed = [(r, f) for r, f in sorted(e.failures.items())
                  if f.exitcode < 0 and -f.exitcode != signal.SIGTERM]
        rank, failure = killed[0] if killed else e.get_first_failure()
        if failure.exitcode >= 0:
            return failure.exitcode
        try:
            name = signal.Signals(-failure.exitcode).name
        except ValueError:
            name = f"signal {-failure.exitcode}"
        left = f"after {max_restarts} restart(s) (--max-restarts)" if max_restarts else "(--max-restarts 0)"
        raise WorkerDied(f"the process of rank {rank} (pid {failure.pid}) was killed by {name}; the job "
                         f"stopped {left}", 128 - failure.exitcode) from None
    return 0


def _quiet_agent() -> None:
    """torchrun's agent logs each step of a failure, then a report, to this process's stderr
    (WARNING and up, ~20 lines): in ``launch_local`` the processes' own lines say it."""
    import logging

    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed.elastic") or name.startswith("torch.distributed.launcher"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
