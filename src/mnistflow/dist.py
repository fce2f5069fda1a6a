"""Data parallel training under torchrun: one place decides what each rank does.

    torchrun --standalone --nproc_per_node 2 -m mnistflow train --recipe seed-cnn
    torchrun --nnodes 2 --node_rank 0 --rdzv_endpoint HOST:29500 --nproc_per_node 4 -m mnistflow train ...
    mnistflow train --nproc 2 ...      # the same as the first line, for one machine

Each rank reads its own interleaved shard of every epoch's order; DistributedDataParallel
averages gradients, so the global batch is per-rank batch x world size. Only rank 0 prints,
writes TensorBoard, metrics and checkpoints. Collectives time out (``MNISTFLOW_DIST_TIMEOUT``,
default 60 s) so a dead rank ends the job instead of hanging it.
"""
from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as tdist

from .errors import MnistflowError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_info() -> DistInfo:
    """Rank and world size from torchrun's environment (a single process without it)."""
    return DistInfo(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                    int(os.environ.get("LOCAL_RANK", 0)))


def init(device_kind: str) -> DistInfo:
    """Join the process group when launched by torchrun: gloo on CPUs, NCCL on GPUs."""
    info = env_info()
    if not info.enabled or (tdist.is_available() and tdist.is_initialized()):
        return info
    if not tdist.is_available():
        raise MnistflowError("this PyTorch build has no torch.distributed")
    timeout = datetime.timedelta(seconds=float(os.environ.get("MNISTFLOW_DIST_TIMEOUT", 60)))
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    tdist.init_process_group(backend, timeout=timeout)
    return info


def device_for(info: DistInfo, requested: torch.device) -> torch.device:
    """Under torchrun each process takes the GPU of its local rank."""
    if requested.type == "cuda" and info.enabled:
        return torch.device("cuda", info.local_rank)
    return requested


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks in place (no-op in a single process)."""
    if tdist.is_available() and tdist.is_initialized():
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def broadcast_object(obj, src: int = 0):
    if tdist.is_available() and tdist.is_initialized():
        box = [obj]
        tdist.broadcast_object_list(box, src=src)
        return box[0]
    return obj


def barrier() -> None:
    if tdist.is_available() and tdist.is_initialized():
        tdist.barrier()


def cleanup() -> None:
    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


def launch_local(nproc: int, argv: list[str]) -> int:
    """``mnistflow train --nproc N ...``: re-run the same command under torchrun on this machine."""
    if nproc < 1:
        raise MnistflowError(f"--nproc must be >= 1, got {nproc}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "mnistflow", *argv]
    if shutil.which(sys.executable) is None:
        raise MnistflowError(f"cannot find the Python interpreter {sys.executable}")
    return subprocess.call(cmd)
