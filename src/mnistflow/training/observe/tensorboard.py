"""TensorBoard event files: curves as the tutorial shows them, plus throughput and the graph.

The writer (and its heavy import) is created on first use, and only on rank 0. A scalar a
hook returned is written under its own name (no prefix), at its step.
"""
from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mnistflow.core.log import warn
from mnistflow.training.hooks import EPOCH_KEYS

if TYPE_CHECKING:
    from tensorboard.compat.proto.config_pb2 import RunMetadata
    from tensorboard.compat.proto.graph_pb2 import GraphDef
    from torch.utils.tensorboard import SummaryWriter

_TRAIN = {"loss": "train/loss", "acc": "train/acc", "lr": "lr", "img_per_s": "throughput/img_per_s",
          "data_wait_frac": "pipeline/data_wait_frac", "queue_depth": "pipeline/queue_depth"}
_TRAIN_OTHER = {"epoch", "rss_mb"}  # in the logs, not curves of their own
_EVAL = {"split", "acc", "loss", "n", "eval_s"}


class TensorBoardLogger:
    def __init__(self, logdir: str | Path, purge_step: int | None = None):
        self.logdir = Path(logdir)
        self.purge_step = purge_step  # a resumed run: events from this step on are superseded
        self._w = None
        self._failed = False

    @property
    def writer(self) -> SummaryWriter | None:
        if self._w is None and not self._failed:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self._failed = True
                warn("tensorboard is not installed; no event files written")
                return None
            self._w = SummaryWriter(str(self.logdir), purge_step=self.purge_step)
        return self._w

    def _extras(self, w, step: int, logs: dict, known) -> None:
        for k, v in logs.items():
            if k not in known and isinstance(v, (int, float)) and not isinstance(v, bool):
                w.add_scalar(k, v, step)

    def on_step_end(self, step: int, logs: dict) -> None:
        w = self.writer
        if w is None or "loss" not in logs:  # logged steps (the measured scalars) only
            return
        for k, tag in _TRAIN.items():
            w.add_scalar(tag, logs[k], step)
        self._extras(w, step, logs, _TRAIN.keys() | _TRAIN_OTHER)

    def on_validation_end(self, step: int, logs: dict) -> None:
        w = self.writer
        if w is None:
            return
        split = logs["split"]
        w.add_scalar(f"{split}/loss", logs["loss"], step)
        w.add_scalar(f"{split}/acc", logs["acc"], step)
        self._extras(w, step, logs, _EVAL | {f"{split}_acc", f"{split}_loss"})

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        w = self.writer
        if w is not None:
            self._extras(w, logs["step"], logs, set(EPOCH_KEYS))  # a hook's scalars (the rest is written)

    def add_graph(self, model: torch.nn.Module, example: torch.Tensor) -> None:
        """The model's graph (traced on ``example``), written silently: the tracer's warnings are
        caught, and a model that cannot be traced costs one warning line, not the trace."""
        w = self.writer
        if w is None:
            return
        try:
            w._get_file_writer().add_graph(graph_def(model, example))
        except Exception as e:  # tracing is best effort: a model with data-dependent control flow
            first = (str(e).strip().splitlines() or [""])[0][:200]
            warn(f"model graph not written to TensorBoard ({type(e).__name__}: {first})")

    def close(self) -> None:
        if self._w is not None:
            self._w.flush()
            self._w.close()


def graph_def(model: torch.nn.Module, example: torch.Tensor) -> tuple[GraphDef, RunMetadata]:
    """``(GraphDef, RunMetadata)`` of ``model`` traced on ``example``, as ``SummaryWriter.add_graph``
    makes it, minus its noise: ``torch.jit.trace``'s re-trace check is off (it fails on models
    whose submodule types the tracer renames on a second trace, ``fast`` among them, though the
    graphs are the same) and its warnings (a shape read as a Python number, expected in the
    native kernels' dispatch tests) are caught, not printed."""
    from tensorboard.compat.proto.config_pb2 import RunMetadata
    from tensorboard.compat.proto.graph_pb2 import GraphDef
    from tensorboard.compat.proto.step_stats_pb2 import DeviceStepStats, StepStats
    from tensorboard.compat.proto.versions_pb2 import VersionDef
    from torch.utils.tensorboard._pytorch_graph import parse

    was = model.training
    model.eval()
    try:
        with warnings.catch_warnings(record=True), torch.no_grad(), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("always")  # recorded here (and dropped), never printed
            trace = torch.jit.trace(model, example, check_trace=False)
            graph = trace.graph
            torch._C._jit_pass_inline(graph)
            nodes = parse(graph, trace, (example,))
    finally:
        model.train(was)
    stats = RunMetadata(step_stats=StepStats(dev_stats=[DeviceStepStats(device="/device:CPU:0")]))
    return GraphDef(node=nodes, versions=VersionDef(producer=22)), stats  # producer: as add_graph
