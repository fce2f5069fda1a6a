"""The model graph in TensorBoard: written for every registered model, silently (issue 19:
``--recipe fast`` and ``best`` printed ~280 lines of tracer output and lost the graph)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mnistflow.core import log
from mnistflow.models.registry import create_model, list_models
from mnistflow.training.observe.tensorboard import TensorBoardLogger


def graphs_in(logdir) -> list:
    """The GraphDefs in the event files of ``logdir``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.graph_pb2 import GraphDef

    out = []
    for f in sorted(logdir.glob("events.out.tfevents.*")):
        for ev in EventFileLoader(str(f)).Load():
            if ev.HasField("graph_def"):
                out.append(GraphDef.FromString(ev.graph_def))
    return out


def write_graph(model: nn.Module, logdir) -> None:
    tb = TensorBoardLogger(logdir)
    tb.add_graph(model, torch.zeros(1, 1, 28, 28))
    tb.close()


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_graph_is_written_silently(name, tmp_path, capfd):
    model = create_model(name).train()
    with log.recording() as warned:
        write_graph(model, tmp_path)
    out, err = capfd.readouterr()
    assert (out, err, warned) == ("", "", [])
    graphs = graphs_in(tmp_path)
    assert len(graphs) == 1
    ops = {n.op for n in graphs[0].node}
    assert any(op.startswith("aten::") for op in ops), ops  # the model's ops, not an empty graph
    assert model.training  # the training mode is given back


class _DictOut(nn.Module):
    """A model the tracer refuses (a dict output under strict tracing)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return {"logits": self.fc(x.flatten(1))}


def test_a_model_that_cannot_be_traced_costs_one_recorded_warning_line(tmp_path, capfd):
    with log.recording() as warned:
        write_graph(_DictOut(), tmp_path)
    err = capfd.readouterr().err
    assert len(warned) == 1 and warned[0].startswith("model graph not written to TensorBoard")
    assert "\n" not in warned[0]
    assert err.splitlines() == [f"mnistflow: warning: {warned[0]}"]
    assert graphs_in(tmp_path) == []

