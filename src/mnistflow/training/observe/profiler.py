"""``train --profile-steps A:B`` and ``mnistflow profile``: the PyTorch profiler over a few
steps of a real run, a Chrome trace, TensorBoard profiler files, the op tables by time and by
memory, and a breakdown of the step (from the named ranges of ``training.engine.profiled``)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from mnistflow.core.fsutil import atomic_write_bytes, atomic_write_text
from mnistflow.core.log import warn

PHASES = ("data", "forward", "backward", "optimizer", "sync", "logging", "step_hooks")
PHASE_LABELS = {"data": "data (next batch)", "forward": "forward", "backward": "backward",
                "optimizer": "optimizer", "sync": "device syncs", "logging": "logging",
                "step_hooks": "checkpoint I/O + eval"}


def parse_steps(text: str) -> tuple[int, int]:
    from mnistflow.core.errors import MnistflowError

    try:
        a, b = (int(v) for v in text.split(":"))
        if not 0 <= a < b:
            raise ValueError
        return a, b
    except ValueError:
        raise MnistflowError(f"--profile-steps must be A:B with 0 <= A < B, got '{text}'") from None


# What the profiler's C++ side (kineto, c10) writes straight to file descriptor 2 on every start
# and stop: stage markers and a note on memory allocated before the window. Not for a user.
_NATIVE_NOISE = re.compile(r"^(?:USDT:|STAGE:|\[W\d+ [^\]]*\] Memory block of unknown size was allocated "
                           r"before the profiling started)")


class _NativeNoise:
    """Holds back ``_NATIVE_NOISE`` around the profiler's calls: file descriptor 2 goes to a
    temporary file while one runs; what else was written there is passed on to stderr."""

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryFile()

    @contextlib.contextmanager
    def filtered(self):
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(self.tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            self.tmp.seek(0)
            text = self.tmp.read().decode(errors="replace")
            self.tmp.seek(0)
            self.tmp.truncate()
            rest = [line for line in text.splitlines(keepends=True) if not _NATIVE_NOISE.match(line)]
            if rest:
                sys.stderr.write("".join(rest))
                sys.stderr.flush()

    def close(self) -> None:
        self.tmp.close()


class ProfilerHook:
    """Profiles optimizer steps [A, B): waits A-1 steps, warms up 1, records B-A."""

    def __init__(self, out_dir: str | Path, start: int, stop: int, device: torch.device):
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.start, self.stop = start, stop
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        warm = 1 if start >= 1 else 0
        if not warm:  # (torch says so as a raw UserWarning; this is the run's own warning instead)
            warn("--profile-steps from step 0: no warm-up step before the profile, so the first "
                 "step's one-off setup is in its times")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Profiler won't be using warmup")
            self.prof = profile(activities=acts, schedule=schedule(wait=max(start - warm, 0), warmup=warm,
                                                                   active=stop - start, repeat=1),
                                on_trace_ready=self._ready, profile_memory=True, record_shapes=True)
        self.done = False
        self.report = ""
        self.noise = _NativeNoise()
        with self.noise.filtered():
            self.prof.__enter__()

    def _ready(self, prof) -> None:
        trace = self.out / "trace.json"
        prof.export_chrome_trace(str(trace))  # kineto saves a trace once: the copy below is the other
        tensorboard_copy(trace, self.out / "tb")
        self.report = op_tables(prof) + "\n\n" + format_breakdown(step_breakdown(trace))
        atomic_write_text(self.out / "report.txt", self.report + "\n")
        self.done = True

    def step(self, step: int) -> None:
        """After every optimizer step (the loop calls it: the profiler's schedule counts steps)."""
        if not self.done:
            with self.noise.filtered():
                self.prof.step()
            if step >= self.stop:
                self.close()

    def close(self) -> None:
        if not self.done or self.prof.profiler is not None:
            try:
                with self.noise.filtered():
                    self.prof.__exit__(None, None, None)
            except Exception:
                pass
        self.noise.close()


def tensorboard_copy(trace: Path, tb_dir: Path) -> Path:
    """The Chrome trace where TensorBoard's PyTorch profiler plugin looks for it:
    ``tb/<host>_<pid>.<ns>.pt.trace.json``, the name ``torch.profiler.tensorboard_trace_handler``
    gives. A copy, because a profile can be exported once only (a second export raises)."""
    tb_dir.mkdir(parents=True, exist_ok=True)
    dest = tb_dir / f"{socket.gethostname()}_{os.getpid()}.{time.time_ns()}.pt.trace.json"
    atomic_write_bytes(dest, trace.read_bytes())
    return dest


def op_tables(prof: profile, top: int = 20) -> str:
    ka = prof.key_averages()
    return (f"ops by self time (top {top})\n" + ka.table(sort_by="self_cpu_time_total", row_limit=top)
            + f"\nops by memory (top {top})\n" + ka.table(sort_by="self_cpu_memory_usage", row_limit=top))


def step_breakdown(trace_path: str | Path) -> dict:
    """% of the profiled wall time in each of the engine's ``mnistflow/<phase>`` ranges."""
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    # On a GPU each range is also drawn on the GPU's timeline ("gpu_user_annotation": when its
    # kernels ran); the breakdown is of the host's step, so those would count it twice.
    ours = [e for e in spans if str(e.get("name", "")).startswith("mnistflow/")
            and e.get("cat") != "gpu_user_annotation"]
    steps = [e for e in spans if str(e.get("name", "")).startswith("ProfilerStep#")]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in steps] or \
        [(min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans))]
    wall = sum(b - a for a, b in windows)
    out = {p: 0.0 for p in PHASES}
    for e in ours:
        phase = e["name"].split("/", 1)[1]
        if phase in out:  # only the part inside the profiled steps (ranges straddle step edges)
            s, t = e["ts"], e["ts"] + e["dur"]
            out[phase] += sum(max(0.0, min(t, b) - max(s, a)) for a, b in windows)
    res = {p: 100 * v / wall for p, v in out.items()}
    res["other"] = max(0.0, 100 - sum(res.values()))
    res["wall_ms"] = wall / 1000
    res["steps"] = len(steps)
    return res


def format_breakdown(b: dict) -> str:
    lines = [f"step breakdown over {b['steps']} profiled steps ({b['wall_ms']:.1f} ms):"]
    for p in PHASES + ("other",):
        lines.append(f"  {PHASE_LABELS.get(p, p):<24} {b[p]:5.1f}%")
    return "\n".join(lines)
