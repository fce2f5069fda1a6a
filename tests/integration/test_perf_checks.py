"""The performance doctor's checks: each fires on a planted fault and stays silent when healthy."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from helpers import inject
from helpers.cli import assert_one_line_error, run_cli
from mnistflow.core.errors import MnistflowError
from mnistflow.training.api import train

SMALL = dict(threads=1, tensorboard=False, quiet=True)


class GrowsInForward(nn.Module):
    """Planted fault: a layer created inside forward (after training starts)."""

    def __init__(self, in_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(in_shape[0] * in_shape[1] * in_shape[2], num_classes)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.training and self.calls > 3:
            self.extra = nn.Linear(10, 10)  # registered on the model mid-training
        return self.fc(x.flatten(1))


class KeepsItsOutputs(nn.Module):
    """Planted fault: each step's activations kept alive in a list (a leak). (Keeping only the
    loss leaks little: backward() frees the graph's saved tensors.)"""

    def __init__(self, in_shape, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(in_shape[0], 32, 3, padding=1)
        self.fc = nn.Linear(32, num_classes)
        self.kept = []

    def forward(self, x):
        h = torch.relu(self.conv(x))
        out = self.fc(h.amax((2, 3)))
        if self.training:
            self.kept.append(h)  # B x 32 x 28 x 28 floats per step, never released
        return out


def test_starvation_warns_with_numbers_and_healthy_run_is_silent(mnist_records, tmp_path, monkeypatch, capsys):
    s = train(recipe="softmax", data=mnist_records, run_dir=tmp_path / "ok", max_steps=60, log_every=10,
              **{**SMALL, "quiet": False})
    assert "starvation" not in capsys.readouterr().err and not s["warnings"]
    inject.apply("data_delay", 0.01, setattr=monkeypatch.setattr)  # a reader that sleeps 10 ms a batch
    s = train(recipe="softmax", data=mnist_records, run_dir=tmp_path / "slow", max_steps=60, log_every=10,
              **{**SMALL, "quiet": False})
    err = capsys.readouterr().err
    assert "mnistflow: warning: input starvation" in err and "% of step time waiting for data" in err
    assert len(s["warnings"]) == 1 and s["warnings"][0].startswith("input starvation: ")  # recorded too
    assert s["data_wait_frac"] > 0.5
    recs = [json.loads(x) for x in (tmp_path / "slow" / "metrics.jsonl").read_text().splitlines()]
    assert all("queue_depth" in r and "data_wait_frac" in r for r in recs if r["kind"] == "train")


def test_finalize_guard_names_the_layer_created_in_forward(mnist_records, tmp_path, plant_model):
    plant_model("planted-grows-in-forward", GrowsInForward)
    with pytest.raises(MnistflowError, match=r"a Linear layer was created during training \(at .*test_perf_checks.py:\d+\)"):
        train(model="planted-grows-in-forward", data=mnist_records, run_dir=tmp_path / "r", max_steps=20,
              **SMALL)
    s = train(model="softmax", data=mnist_records, run_dir=tmp_path / "ok", max_steps=20, **SMALL)
    assert s["steps"] == 20
    # replacing a registered parameter object between steps is caught by the snapshot too
    from mnistflow.training.observe.finalize import FinalizeGuard

    m = torch.nn.Linear(2, 2)
    g = FinalizeGuard(m)
    m.weight = torch.nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(MnistflowError, match="replaced param weight"):
        g.on_step_end(7, {"loss": 1.0})  # a logged step


def test_leak_is_reported_with_growth_per_step(mnist_records, tmp_path, capsys, plant_model):
    plant_model("planted-keeps-outputs", KeepsItsOutputs)
    s = train(model="planted-keeps-outputs", data=mnist_records, run_dir=tmp_path / "leak", max_steps=48,
              batch_size=32, log_every=4, precision="fp32", **SMALL)
    leak = [w for w in s["warnings"] if "memory grows every step" in w]
    assert len(leak) == 1 and "KB/step" in leak[0]
    assert "memory grows" not in capsys.readouterr().err  # quiet: recorded, not printed
    s = train(model="vgg-small", data=mnist_records, run_dir=tmp_path / "ok", max_steps=48, batch_size=32,
              log_every=4, precision="fp32", **SMALL)
    assert not [w for w in s["warnings"] if "memory grows" in w]


def test_a_batch_too_large_for_the_memory_cap_is_refused_before_work(mnist_records, tmp_path):
    proc = run_cli("train", "--data", str(mnist_records), "--model", "seed-cnn", "--batch-size", "20000",
                   "--memory-cap-mb", "2000", "--run-dir", str(tmp_path / "r"))
    assert_one_line_error(proc, "would swap", "MB")
    assert not (tmp_path / "r" / "model.safetensors").exists()
    ok = run_cli("train", "--data", str(mnist_records), "--model", "softmax", "--batch-size", "100",
                 "--memory-cap-mb", "2000", "--max-steps", "5", "--threads", "1", "--run-dir", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stderr


def test_profile_writes_a_chrome_trace_with_the_models_ops(mnist_records, tmp_path):
    run = tmp_path / "p"
    proc = run_cli("profile", "--model", "seed-cnn", "--data", str(mnist_records), "--run-dir", str(run),
                   "--profile-steps", "2:6", "--threads", "1", "--batch-size", "32")
    assert proc.returncode == 0, proc.stderr
    trace = json.loads((run / "profile" / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"aten::convolution", "aten::max_pool2d_with_indices", "mnistflow/forward",
            "mnistflow/backward", "mnistflow/optimizer"} <= names
    assert "ops by self time" in proc.stdout and "ops by memory" in proc.stdout
    assert "step breakdown" in proc.stdout and "forward" in proc.stdout
    pct = [float(line.split()[-1].rstrip("%")) for line in proc.stdout.split("step breakdown")[1].splitlines()[1:9]]
    assert abs(sum(pct) - 100) < 1.0


def test_batch_size_auto_picks_the_fastest_on_cpu_and_says_why(mnist_records, tmp_path):
    run = tmp_path / "auto"
    proc = run_cli("train", "--data", str(mnist_records), "--model", "fast", "--batch-size", "auto",
                   "--max-steps", "5", "--threads", "1", "--run-dir", str(run), "--json", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    line = next(ln.split("batch size auto: ", 1)[1] for ln in proc.stderr.splitlines() if "batch size auto:" in ln)
    rates = {int(b): float(r.replace(",", "")) for b, r in
             (part.split(": ") for part in line.split("CPU: ")[1].rstrip(")").replace(" img/s", "").split(", "))}
    chosen = json.loads(proc.stdout.strip().splitlines()[-1])["global_batch"]
    assert set(rates) == {64, 128, 256, 512} and chosen == max(rates, key=rates.get)
    assert f"batch_size = {chosen}" in (run / "config.toml").read_text()  # the choice reproduces
    assert_one_line_error(run_cli("train", "--batch-size", "many"), "--batch-size")


@pytest.mark.slow
def test_a_healthy_compiled_run_never_recompiles(mnist_records, tmp_path):
    """--compile: the loop keeps shapes stable (warm-up at the real batch shape, the short last
    batch dropped, evaluation on the plain module), and recompiles would be logged with a reason."""
    proc = run_cli("train", "--model", "fast", "--data", str(mnist_records), "--run-dir", str(tmp_path / "c"),
                   "--compile", "--epochs", "1", "--max-steps", "220", "--batch-size", "256", "--threads", "2",
                   "--no-tensorboard", "--log-every", "100")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "recompil" not in (proc.stdout + proc.stderr).lower()
    assert "test " in proc.stdout  # evaluated, and crossed the epoch's short last batch (55,000 / 256)
