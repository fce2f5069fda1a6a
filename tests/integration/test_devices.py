"""Devices and threads: --device, --threads / --interop-threads, --gpu-memory-fraction, --sync-bn.

What needs a GPU is checked on one when present (skipped otherwise); the rest runs on CPUs.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.runtime import dist
from mnistflow.core.errors import MnistflowError
from mnistflow.runtime.cpu import busy_cores_elsewhere, default_threads, threads_for_load, usable_cores
from mnistflow.runtime.device import pick_device
from mnistflow.training.api import train

TINY = dict(model="softmax", max_steps=2, batch_size=32, threads=1, quiet=True, tensorboard=False,
            keep_checkpoints=0, validate=False)
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@no_gpu
def test_cuda_without_a_gpu_is_a_one_line_error(mnist_records, tmp_path):
    proc = run_cli("train", "--device", "cuda", "--data", str(mnist_records), "--run-dir", str(tmp_path / "r"))
    assert_one_line_error(proc, "--device cuda: no CUDA GPU is visible", "CUDA_VISIBLE_DEVICES")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name,fragment", [
    pytest.param("cuda:3", "--device cuda:3: ", marks=no_gpu),
    ("tpu", "unknown device 'tpu'"),
    ("cuda:x", "unknown device 'cuda:x'"),
    pytest.param("mps", "MPS is not available",
                 marks=pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS present")),
])
def test_unusable_devices_fail_before_work(mnist_records, tmp_path, name, fragment):
    with pytest.raises(MnistflowError, match=fragment.replace("(", r"\(")):
        train(device=name, data=str(mnist_records), run_dir=str(tmp_path / "r"), **TINY)
    assert not (tmp_path / "r").exists()


def test_auto_and_cpu_devices():
    assert pick_device("cpu") == torch.device("cpu")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type in (want, "mps")


@pytest.mark.parametrize("value", ["1.5", "0", "-0.2"])
def test_gpu_memory_fraction_must_be_a_fraction(tmp_path, value):
    proc = run_cli("train", "--gpu-memory-fraction", value, "--run-dir", str(tmp_path / "r"))
    assert_one_line_error(proc, f"--gpu-memory-fraction must be in (0, 1], got {float(value)}")


@no_gpu
def test_gpu_memory_fraction_on_a_cpu_warns_and_trains(mnist_records, tmp_path, capsys):
    s = train(device="cpu", gpu_memory_fraction=0.5, data=str(mnist_records), run_dir=str(tmp_path / "r"),
              **{**TINY, "quiet": False})
    assert s["steps"] == 2
    said = "--gpu-memory-fraction applies to CUDA GPUs; ignored on cpu"
    assert f"mnistflow: warning: {said}" in capsys.readouterr().err
    assert said in s["warnings"]  # recorded in the run's summary too (with quiet=True: only there)


def test_threads_and_interop_threads_are_applied(mnist_records, tmp_path):
    proc = run_cli("train", "--model", "softmax", "--data", str(mnist_records), "--run-dir", str(tmp_path / "r"),
                   "--max-steps", "2", "--threads", "1", "--interop-threads", "3", "--no-tensorboard",
                   "--quiet", "--json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    assert s["threads"] == 1 and s["interop_threads"] == 3 and s["world_size"] == 1
    assert "threads = 1" in (tmp_path / "r" / "config.toml").read_text()
    assert "interop_threads = 3" in (tmp_path / "r" / "config.toml").read_text()


def test_interop_threads_too_late_is_a_warning_not_a_crash():
    code = ("import torch; torch.set_num_interop_threads(2)\n"
            "from mnistflow.runtime.cpu import set_interop_threads\n"
            "print(set_interop_threads(3), set_interop_threads(2))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2"]
    assert "warning: --interop-threads 3 ignored: this process already uses 2 inter-op threads" in proc.stderr


def test_default_threads_share_the_cores_among_local_processes(monkeypatch):
    monkeypatch.delenv("MNISTFLOW_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_threads() == usable_cores()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun --nproc_per_node 2
    assert default_threads() == max(1, usable_cores() // 2)
    monkeypatch.setenv("MNISTFLOW_THREADS", "3")
    assert default_threads() == 3


@pytest.mark.parametrize("threads,cores,busy,fit", [
    (2, 2, 0.0, 2), (2, 2, 0.3, 2), (2, 2, 0.6, 1), (2, 2, 1.0, 1), (2, 2, 2.0, 1),
    (8, 8, 2.2, 6), (4, 8, 2.0, 4), (1, 2, 1.0, 1),
])
def test_threads_fit_the_cores_other_processes_leave(threads, cores, busy, fit):
    assert threads_for_load(threads, cores, busy) == fit


def test_threads_that_spin_because_the_machine_was_idle_are_not_sampled_again(monkeypatch):
    """mnistflow let the threads spin because it saw nothing else running at import: no second
    look at the load (a 0.25 s sample, a sixth of a `fast` run) before training. Otherwise (the
    user's policy, torch imported first, or a busy machine at import) they are fitted to the load."""
    from mnistflow.core import openmp
    from mnistflow.training import setup

    for var in ("MNISTFLOW_THREADS", "LOCAL_WORLD_SIZE", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(setup, "default_threads", lambda: 2)
    monkeypatch.setattr(setup, "usable_cores", lambda: 2)
    samples = []
    monkeypatch.setattr(setup, "busy_cores_elsewhere", lambda: samples.append(1) or 1.0)
    monkeypatch.setattr(openmp, "chosen", "spin")
    assert setup._threads_for_a_shared_machine() is None and not samples
    for chosen in (None, "passive"):  # torch first or the user's policy; a busy machine at import
        monkeypatch.setattr(openmp, "chosen", chosen)
        assert setup._threads_for_a_shared_machine() == 1
    assert samples == [1, 1]


@pytest.mark.skipif(usable_cores() < 2, reason="needs 2 cores: one for the busy neighbour")
def test_a_busy_neighbour_is_detected_and_threads_are_shed(mnist_records, tmp_path):
    """A thread that shares a core with a busy process stalls the others at every op, spinning
    (OMP_WAIT_POLICY=ACTIVE, or torch loaded before mnistflow) or passive (mnistflow's choice
    beside a running process): train takes fewer, unless the user gave a count."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.5)
        assert busy_cores_elsewhere() >= 0.7
        env = {"MNISTFLOW_THREADS": None, "LOCAL_WORLD_SIZE": None, "GOMP_SPINCOUNT": None}
        args = ("train", "--recipe", "softmax", "--data", str(mnist_records), "--json", "--no-tensorboard",
                "--device", "cpu")  # threads are a CPU run's question (a GPU run takes 2)
        for name, policy in (("spin", "ACTIVE"), ("passive", None)):  # None: mnistflow chooses (passive)
            proc = run_cli(*args, "--run-dir", str(tmp_path / name), "--max-steps", "5",
                           env={**env, "OMP_WAIT_POLICY": policy})
            assert proc.returncode == 0, proc.stderr
            assert "cores busy: training on" in proc.stderr
            # the busy process's core is shed (other test workers, busy too, may cost more)
            assert 1 <= json.loads(proc.stdout.strip().splitlines()[-1])["threads"] <= max(1, usable_cores() - 1)
        chosen = run_cli(*args, "--run-dir", str(tmp_path / "r2"), "--max-steps", "5", "--threads", "2",
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE"})  # the user's choice stands, without a word
        assert "cores busy" not in chosen.stderr
        assert json.loads(chosen.stdout.strip().splitlines()[-1])["threads"] == 2
    finally:
        busy.kill()
        busy.wait()


def test_sync_bn_under_torchrun_needs_gpus(tmp_path):
    # torchrun's environment without torchrun: the check comes before joining any process group
    proc = run_cli("train", "--device", "cpu", "--sync-bn", "--run-dir", str(tmp_path / "r"),
                   env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert_one_line_error(proc, "--sync-bn needs CUDA GPUs")


def test_dist_timeout_setting(monkeypatch):
    monkeypatch.delenv(dist.TIMEOUT_ENV, raising=False)
    assert dist.timeout_s() == 60
    monkeypatch.setenv(dist.TIMEOUT_ENV, "7.5")
    assert dist.timeout_s() == 7.5
    monkeypatch.setenv(dist.TIMEOUT_ENV, "soon")
    with pytest.raises(MnistflowError, match="MNISTFLOW_DIST_TIMEOUT must be a positive number"):
        dist.timeout_s()


def test_single_process_helpers_are_no_ops():
    assert not dist.initialized() and dist.env_info().world_size == 1
    t = torch.ones(3)
    assert dist.all_reduce_sum(t) is t and t.tolist() == [1, 1, 1]
    assert dist.max_over_ranks(5) == 5 and dist.broadcast_object("x") == "x"
    assert dist.params_in_sync(torch.nn.Linear(2, 2))


@gpu
def test_training_on_a_gpu_with_a_memory_cap(mnist_records, tmp_path):
    s = train(device="cuda", gpu_memory_fraction=0.5, data=str(mnist_records), run_dir=str(tmp_path / "r"),
              model="softmax", max_steps=20, batch_size=64, quiet=True, tensorboard=False)
    assert s["device"].startswith("cuda") and s["gpu_peak_allocated_mb"] > 0
    assert s["test_acc"] > 0.5



_DENORMAL_PROBE = (
    "import json, torch; from mnistflow.runtime.cpu import flush_denormals; torch.set_num_threads(2); "
    "x = torch.full((4_000_000,), 1e-39); a = torch.randn(500, 500); (a @ a).sum(); (x * 1.0).sum(); "
    "on = flush_denormals(); y = x * 1.0; "  # OpenMP threads exist; 2 threads: each computes half of y
    "z = torch.tensor(1e-30).mul(1e-10); "  # read bits as integers: DAZ would hide a denormal
    "print(json.dumps([on, (y.view(torch.int32) != 0).sum().item(), z.view(torch.int32).item()]))")


@pytest.mark.parametrize("env,flushed", [({}, True), ({"MNISTFLOW_DENORMALS": "keep"}, False)])
def test_training_processes_flush_denormals_unless_told_to_keep(env, flushed):
    # A fresh process each. The FPU mode is per thread: both halves of a 2-thread op (the
    # main thread's and the OpenMP worker's) must flush, denormal inputs and results alike.
    import os

    out = subprocess.run([sys.executable, "-c", _DENORMAL_PROBE], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True).stdout
    on, nonzero, product_bits = json.loads(out)
    assert on is flushed
    assert (nonzero, product_bits == 0) == ((0, True) if flushed else (4_000_000, False))


@gpu
@pytest.mark.parametrize("precision", ["auto", "fp16"])
def test_the_fast_recipe_on_a_gpu_reaches_99_percent_in_its_precision(mnist_records, tmp_path, precision):
    # The whole fast recipe on CUDA: resident data, whitened first layer, Muon (the PyTorch path:
    # the native kernels are CPU-only), one-cycle schedule; fp16 adds the gradient scaler.
    s = train(recipe="fast", device="cuda", precision=precision, data=str(mnist_records),
              run_dir=str(tmp_path / "r"), quiet=True, tensorboard=False, seed=0)
    assert s["device"].startswith("cuda") and s["precision"] == ("bf16" if precision == "auto" else "fp16")
    assert s["test_acc"] >= 0.985 and s["warnings"] == [] and s["kernels"]["ops"] == []
    assert s["cuda_graph"] is (precision == "auto")  # fp16's gradient scaler keeps the step eager


@gpu
def test_a_gpu_run_resumes_exactly(mnist_records, tmp_path):
    # The checkpoint holds the CUDA generator's state too: resuming must continue the same run.
    common = dict(model="mlp", data=str(mnist_records), batch_size=64, augment="auto", quiet=True, device="cuda",
                  precision="fp32", tensorboard=False, checkpoint_every=20)
    train(run_dir=str(tmp_path / "a"), epochs=0.05, **common)
    s = train(run_dir=str(tmp_path / "a"), resume=True, epochs=0.1, quiet=True)
    assert s["steps"] == 86 and s["resumed_from"].endswith("step-000043.pt")
    train(run_dir=str(tmp_path / "b"), epochs=0.1, **common)
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


@gpu
def test_profiling_a_gpu_run_records_cuda_kernels_and_batch_size_auto_measures_the_gpu(mnist_records, tmp_path):
    run = tmp_path / "p"
    proc = run_cli("profile", "--model", "seed-cnn", "--data", str(mnist_records), "--run-dir", str(run),
                   "--profile-steps", "2:6", "--device", "cuda", "--batch-size", "32")
    assert proc.returncode == 0, proc.stderr
    events = json.loads((run / "profile" / "trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)  # GPU kernels, not only CPU-side ops
    assert "ops by self time" in proc.stdout and "step breakdown" in proc.stdout
    proc = run_cli("train", "--data", str(mnist_records), "--model", "fast", "--batch-size", "auto",
                   "--max-steps", "5", "--device", "cuda", "--run-dir", str(tmp_path / "auto"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert any("batch size auto:" in ln for ln in proc.stderr.splitlines())  # a note: stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["device"].startswith("cuda")


@gpu
def test_a_model_trained_on_a_gpu_loads_and_predicts_on_the_cpu(mnist_records, tmp_path):
    from mnistflow.artifacts.load import load_any
    from mnistflow.artifacts.predictor import predict_arrays
    from mnistflow.data.records import open_records

    s = train(recipe="fast", device="cuda", data=str(mnist_records), run_dir=str(tmp_path / "r"), quiet=True,
              tensorboard=False, seed=0)
    model, info = load_any(tmp_path / "r" / "model.safetensors")  # the CPU by default
    x, y = open_records(mnist_records).split("test")
    acc = float((predict_arrays(model, info, x).argmax(1) == y).mean())
    assert next(model.parameters()).device.type == "cpu"
    assert abs(acc - s["test_acc"]) < 0.003, (acc, s["test_acc"])  # fp32 on the CPU vs bf16 on the GPU


@gpu
def test_the_graphed_step_trains_as_the_eager_one(mnist_records, tmp_path):
    # fp32 and deterministic cuDNN (two eager runs agree bitwise). The graph is captured at the
    # 4th step; by the 5th the weights agree to ~5e-5 (the tensor learning rate multiplies,
    # then adds: one more rounding than the eager add with alpha; training amplifies it, to
    # 1e-3 by step 8 and ~1 by step 65). A rate baked in at capture (the one-cycle rate halves
    # from step 4 to 5 of 5) or a stale input buffer would put the 5th step ~1e-2 apart.
    from safetensors.torch import load_file

    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        common = dict(recipe="fast", device="cuda", precision="fp32", data=str(mnist_records), quiet=True,
                      tensorboard=False, seed=0)
        runs = {(graphs, k): train(run_dir=str(tmp_path / f"{graphs}{k}"), cuda_graphs=graphs, max_steps=k,
                                   **common) for graphs in ("auto", "off") for k in (5, None)}
    finally:
        torch.backends.cudnn.deterministic = False
    assert [runs[g, k]["cuda_graph"] for g in ("auto", "off") for k in (5, None)] == [True, True, False, False]
    a, b = (load_file(str(tmp_path / f"{g}5" / "model.safetensors")) for g in ("auto", "off"))
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst < 1e-3, worst
    g, e = runs["auto", None], runs["off", None]
    assert g["steps"] == e["steps"] == 65 and abs(g["test_acc"] - e["test_acc"]) <= 0.003
    assert g["test_acc"] >= 0.985


@gpu
def test_a_graphed_run_steps_a_short_last_batch_eagerly(mnist_records, tmp_path):
    # 55,000 / 384 leaves a batch of 88: another shape than the captured one
    s = train(recipe="fast", device="cuda", drop_last=False, epochs=1, data=str(mnist_records), quiet=True,
              tensorboard=False, run_dir=str(tmp_path / "r"))
    assert s["cuda_graph"] and s["steps"] == 144 and s["test_acc"] >= 0.985 and s["warnings"] == []
