"""What a GPU changes, checked on any machine: when a run replays its training step as a CUDA
graph (``--cuda-graphs auto``), how many processes a machine's GPUs take, the profile's step
breakdown of a GPU trace. The GPU runs themselves: tests/integration/test_devices.py."""
from __future__ import annotations

import json

import pytest
import torch

from mnistflow.runtime import dist
from mnistflow.training.observe.profiler import step_breakdown

from mnistflow.core.errors import MnistflowError
from mnistflow.training.config import TrainConfig
from mnistflow.training.engine import graph_blocker
from mnistflow.training.recipes import RECIPES

CUDA = torch.device("cuda", 0)


def test_a_single_process_muon_run_on_a_gpu_can_be_graphed():
    assert graph_blocker(CUDA, 1, "muon", "bf16", False, False) is None
    assert graph_blocker(CUDA, 1, "muon", "fp32", False, False) is None


@pytest.mark.parametrize("args,why", [
    ((torch.device("cpu"), 1, "muon", "bf16", False, False), "not a CUDA device"),
    ((CUDA, 2, "muon", "bf16", False, False), "more than one process"),
    ((CUDA, 1, "adam", "bf16", False, False), "--optimizer adam"),
    ((CUDA, 1, "muon", "fp16", False, False), "fp16"),
    ((CUDA, 1, "muon", "bf16", True, False), "--compile"),
    ((CUDA, 1, "muon", "bf16", False, True), "profiling"),
])
def test_what_keeps_a_run_eager_is_named(args, why):
    assert why in graph_blocker(*args)


def test_the_speed_recipes_ask_for_graphs_and_plain_runs_do_not():
    assert all(RECIPES[r]["cuda_graphs"] == "auto" for r in ("fast", "fast-plus", "mid", "best"))
    assert TrainConfig().cuda_graphs == "off"
    with pytest.raises(MnistflowError, match="--cuda-graphs"):
        TrainConfig(cuda_graphs="always")  # checked when built


@pytest.mark.parametrize("gpus,asked,want", [(2, "auto", "cuda"), (1, "auto", "cpu"), (0, "auto", "cpu")])
def test_auto_trains_on_the_cpus_when_the_processes_outnumber_the_gpus(monkeypatch, gpus, asked, want):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    env = dist.DistInfo(rank=1, world_size=2, local_rank=1, local_world_size=2)
    assert dist.gpus_for_processes(env, CUDA, asked).type == want


def test_an_explicit_gpu_for_more_processes_than_gpus_is_a_one_line_error(monkeypatch):
    from mnistflow.core.errors import MnistflowError as Err

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    env = dist.DistInfo(rank=0, world_size=4, local_rank=0, local_world_size=2)  # 2 machines x 2
    with pytest.raises(Err, match=r"--device cuda: 2 processes on this machine need a GPU each; 1 visible "
                                  r"\(use --nproc 1, or --device cpu\)"):
        dist.gpus_for_processes(env, CUDA, "cuda")
    assert dist.gpus_for_processes(dist.DistInfo(), CUDA, "cuda") == CUDA  # one process: its GPU
    assert dist.gpus_for_processes(env, torch.device("cpu"), "cpu").type == "cpu"


def test_the_step_breakdown_of_a_gpu_trace_counts_each_range_once(tmp_path):
    # A CUDA trace draws each mnistflow/<phase> range twice: on the host, and on the GPU's
    # timeline ("gpu_user_annotation"). The breakdown is of the host's step (it summed to 145%).
    def span(name, ts, dur, cat="user_annotation"):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat}

    events = [span("ProfilerStep#1", 0, 1000, "cpu_op"), span("mnistflow/forward", 0, 500),
              span("mnistflow/backward", 500, 300), span("mnistflow/forward", 100, 700, "gpu_user_annotation"),
              span("mnistflow/backward", 800, 200, "gpu_user_annotation")]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    b = step_breakdown(trace)
    assert (b["forward"], b["backward"], b["other"]) == (50.0, 30.0, 20.0)
