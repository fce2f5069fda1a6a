"""A CPU predictor runs a plain CNN with its convolutions in oneDNN's blocked layout
(``artifacts.predictor.blocked_model``) only where that computes the same function: the
answers agree with the model as trained (top-1 identical, probabilities within 1e-5), and
every model the rule does not cover runs as it is."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.synthetic import digits

from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.predictor import BlockedModel, TorchBackend, blocked_model, torch_probabilities
from mnistflow.models import create_model

INFO = ModelInfo("seed-cnn", [1, 28, 28], [str(i) for i in range(10)], [33.0], [78.0], dataset="synthetic")


def model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model(name, (1, 28, 28), 10).eval()


@pytest.mark.parametrize("name", ["seed-cnn", "conv5x5x16-valid-tanh,maxpool3s2,conv3x3x8-s2-valid,gap,fc10",
                                  "conv3x3x8,relu,conv3x3x8-bn,relu,avgpool2,fc10"])
def test_a_plain_cnn_runs_blocked_with_the_same_answers(name):
    net = model(name)
    with torch.inference_mode():
        want = torch_probabilities(net, INFO, digits(300)[0]).numpy()
    backend = TorchBackend(net, INFO)
    assert isinstance(backend.net, BlockedModel) and backend.model is net
    got = backend.predict(digits(300)[0])
    assert (got.argmax(1) == want.argmax(1)).all()
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("name", [
    "conv4x4x8,maxpool2,fc10",                      # SAME padding for an even kernel: padded by hand
    "conv3x3x8-s2,fc10",                            # SAME padding at stride 2: padded by hand
    "conv3x3x8-bn,relu,maxpool2,conv3x3x8,fc10",    # batch norm between convolutions
    "conv3x3x8,avgpool3s2,conv3x3x8,fc10",          # avg pool's ceil mode counts a partial window differently
    "fast",                             # not a Sequential (fused batch norm + ReLU inside)
    "softmax",                          # no convolution
])
def test_other_models_run_as_they_are(name):
    backend = TorchBackend(model(name), INFO)
    assert backend.net is backend.model


def test_bf16_runs_as_it_is():
    backend = TorchBackend(model("seed-cnn"), INFO, precision="bf16")
    assert backend.net is backend.model


def test_a_blocked_model_that_disagrees_on_the_probe_is_not_used(monkeypatch):
    conv = torch.mkldnn_convolution
    monkeypatch.setattr(torch, "mkldnn_convolution", lambda x, *a: conv(x, *a) * 1.01)
    assert blocked_model(model("seed-cnn").eval(), INFO) is None
