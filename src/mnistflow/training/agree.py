"""The processes of a data parallel run agree on what they train before they train it.

Under torchrun every process resolves its own configuration from its own command line (on
several machines, several command lines: "the same command on every machine" is the user's
promise, nothing more). A model or batch that differs would end in DDP's or gloo's own crash;
an ``--lr`` that differs would train to the end, each rank stepping its own way. So, once the
data is open and before the model is built, every rank hands its resolved settings and its
data's fingerprint to the others (:func:`check_ranks_agree`), and each stops with the same one
line naming what differs and where (``--lr 0.1 on rank 0, 0.2 on rank 1``).
"""
from __future__ import annotations

import dataclasses

import torch

from mnistflow.core.errors import MnistflowError
from mnistflow.data.records import Records
from mnistflow.runtime import dist
from mnistflow.training.config import TrainConfig, flag
from mnistflow.training.resume import data_fingerprint

# Settings each process may have its own of: where its files are (the data is compared by its
# fingerprint, not its path; rank 0 decides the run directory and the resume), what its machine
# gives it (threads, memory, native kernels), what it prints or logs (only rank 0 does).
PER_PROCESS = ("data", "dataset", "run_dir", "resume", "threads", "interop_threads", "kernels",
               "gpu_memory_fraction", "resident", "memory_cap_mb", "quiet", "json", "tensorboard", "mlflow")
DATA_IDENTITY = ("name", "shape", "splits", "variants", "sha256")  # of ``data_fingerprint``
SHOWN = 3  # differences named in the line (the count of the others follows)


def identity(cfg: TrainConfig, rec: Records, device: torch.device) -> dict:
    """What every rank must hold alike: the settings (but ``PER_PROCESS``), the device kind,
    and the data's content."""
    out = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in PER_PROCESS}
    out["device"] = device.type  # auto on one machine, cuda on another: NCCL and gloo cannot meet
    fp = data_fingerprint(rec)
    out["data"] = {k: fp[k] for k in DATA_IDENTITY}
    return out


def differences(seen: list[dict]) -> list[str]:
    """``--lr 0.1 on rank 0, 0.2 on rank 1`` for each setting in which ``seen`` (one identity
    per rank) differ; ranks holding one value are listed together."""
    out = []
    for key in seen[0]:
        groups: dict[str, list[int]] = {}
        for rank, ident in enumerate(seen):
            groups.setdefault(_show(key, ident.get(key)), []).append(rank)
        if len(groups) > 1:
            name = "--data" if key == "data" else flag(key)
            out.append(f"{name} " + ", ".join(f"{value} on {_ranks(ranks)}" for value, ranks in groups.items()))
    return out


class RanksDisagree(MnistflowError):
    """Every rank raises it at once, so each may wait for the others before leaving the
    process group (the loop does: a group left to the interpreter's exit can abort in C++)."""


def check_ranks_agree(cfg: TrainConfig, rec: Records, device: torch.device, info: dist.DistInfo) -> None:
    """Stop every rank, with the same one line, when the ranks were started with different
    settings or data (one gather of a small dict per rank; nothing in a single process)."""
    if not info.enabled:
        return
    diffs = differences(dist.gather_objects(identity(cfg, rec, device)))
    if diffs:
        more = f"; and {len(diffs) - SHOWN} more" if len(diffs) > SHOWN else ""
        raise RanksDisagree("the processes were started with different settings (every machine must run "
                             f"the same command, on the same data): {'; '.join(diffs[:SHOWN])}{more}")


def _show(key: str, value) -> str:
    if key == "data" and isinstance(value, dict):
        return f"{value.get('name')} (sha256 {str(value.get('sha256'))[:12]}, {value.get('splits')})"
    text = "unset" if value is None else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(map(str, ranks[:6])) + (f" and {len(ranks) - 6} more" if len(ranks) > 6 else "")
    return f"ranks {shown}"
