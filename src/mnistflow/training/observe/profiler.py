"""``train --profile-steps A:B`` and ``mnistflow profile``: the PyTorch profiler over a few
steps of a real run, a Chrome trace, TensorBoard profiler files, the op tables by time and by
memory, and a breakdown of the step (from the named ranges of ``training.engine.profiled``)."""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from mnistflow.core.errors import display
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


# What the profiler's C++ side (kineto, c10) writes straight to file descriptor 2: stage markers
# on every start and stop, and, while it records memory, a note on each block freed that was
# allocated before it started (from any step in the window). Not for a user.
_NATIVE_NOISE = re.compile(rb"^(?:USDT:|STAGE:|\[W\d+ [^\]]*\] Memory block of unknown size was allocated "
                           rb"before the profiling started)")
_NOISE_STARTS = (b"USDT:", b"STAGE:", b"[W")


class _NativeNoise:
    """Filters file descriptor 2 between :meth:`start` and :meth:`stop`: it becomes a pipe, and
    a thread copies what comes through to the real stderr as it comes (a progress bar keeps
    moving), less the lines that match ``_NATIVE_NOISE``. Only a line that may still become
    noise (it starts like one) waits for its end. ``stop`` also runs at exit, so an error line
    printed after a failure still gets out."""

    def __init__(self) -> None:
        self._saved: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._saved is not None:
            return
        sys.stderr.flush()
        r, w = os.pipe()
        self._saved = os.dup(2)
        os.dup2(w, 2)
        os.close(w)  # fd 2 is the pipe's one writer now: restoring it ends the copy
        self._thread = threading.Thread(target=_copy, args=(r, os.dup(self._saved)), daemon=True,
                                        name="mnistflow-profiler-stderr")
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        if self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._saved = None
        self._thread.join(timeout=5)  # (a child process still holding the pipe: not waited for)
        atexit.unregister(self.stop)

    @contextlib.contextmanager
    def filtered(self):
        self.start()
        try:
            yield
        finally:
            self.stop()


def _copy(r: int, out: int) -> None:
    """Copy the pipe ``r`` to ``out`` until its writer is gone, without the native noise."""
    def put(data: bytes) -> None:
        while data:
            data = data[os.write(out, data):]

    pending = b""
    try:
        while chunk := os.read(r, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            put(b"".join(line + b"\n" for line in lines if not _NATIVE_NOISE.match(line)))
            if pending and not any(p.startswith(pending[:len(p)]) for p in _NOISE_STARTS):
                put(pending)  # (a bar's "\r..." redraw has no newline: it goes at once)
                pending = b""
        if pending and not _NATIVE_NOISE.match(pending):
            put(pending)
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(out)


class ProfilerHook:
    """Profiles optimizer steps [A, B): waits A-1 steps, warms up 1, records B-A. From its start
    to :meth:`close` the profiler's native lines on stderr are held back (``_NativeNoise``)."""

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
        self.done = self.closed = False
        self.report = ""
        self.noise = _NativeNoise()
        self.noise.start()
        self.prof.__enter__()

    def _ready(self, prof) -> None:
        trace = self.out / "trace.json"
        prof.export_chrome_trace(str(trace))  # kineto saves a trace once: the copy below is the other
        tb = tensorboard_copy(trace, self.out / "tb")
        ka = prof.key_averages()
        breakdown = format_breakdown(step_breakdown(trace))
        atomic_write_text(self.out / "report.txt", op_tables(ka) + "\n\n" + breakdown + "\n")
        self.report = "\n\n".join([narrow_tables(ka, self.out / "report.txt"), breakdown,
                                    files_note(self.out, trace, tb)])
        self.done = True

    def step(self, step: int) -> None:
        """After every optimizer step (the loop calls it: the profiler's schedule counts steps)."""
        if not self.done:
            self.prof.step()
            if step >= self.stop:
                self.close()

    def close(self) -> None:
        """Stop profiling (when the run ended before B) and give stderr back; once."""
        if self.closed:
            return
        self.closed = True
        try:
            if not self.done or self.prof.profiler is not None:
                self.prof.__exit__(None, None, None)
        except Exception:  # (a failure while a run is failing already: the first error is the news)
            pass
        finally:
            self.noise.stop()


def tensorboard_copy(trace: Path, tb_dir: Path) -> Path:
    """The Chrome trace where TensorBoard's PyTorch profiler plugin looks for it:
    ``tb/<host>_<pid>.<ns>.pt.trace.json``, the name ``torch.profiler.tensorboard_trace_handler``
    gives. A copy, because a profile can be exported once only (a second export raises)."""
    tb_dir.mkdir(parents=True, exist_ok=True)
    dest = tb_dir / f"{socket.gethostname()}_{os.getpid()}.{time.time_ns()}.pt.trace.json"
    atomic_write_bytes(dest, trace.read_bytes())
    return dest


def op_tables(ka, top: int = 20) -> str:
    """PyTorch's own op tables (every column, 200 wide): for report.txt."""
    return (f"ops by self time (top {top})\n" + ka.table(sort_by="self_cpu_time_total", row_limit=top)
            + f"\nops by memory (top {top})\n" + ka.table(sort_by="self_cpu_memory_usage", row_limit=top))


def _time(us: float) -> str:
    return f"{us / 1e6:.2f} s" if us >= 1e6 else f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.0f} us"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _table(title: str, cols: list[tuple[str, int]], rows: list[tuple], width: int = 79) -> str:
    """A fixed-width table whose first column (the op) takes what the others leave of ``width``."""
    name_w = width - sum(w + 2 for _, w in cols)
    fmt = [(name_w, "<")] + [(w, ">") for _, w in cols]
    lines = [title, "  ".join(f"{t:{a}{w}}" for t, (w, a) in zip(["op"] + [c for c, _ in cols], fmt))]
    for r in rows:
        name = r[0] if len(r[0]) <= name_w else r[0][:name_w - 1] + "~"
        lines.append("  ".join(f"{c:{a}{w}}" for c, (w, a) in zip((name, *r[1:]), fmt)).rstrip())
    return "\n".join(lines)


def narrow_tables(ka, full: Path, top: int = 10) -> str:
    """The top ops by self time and by memory, within 80 columns (report.txt has the rest)."""
    ops = [e for e in ka if not str(e.key).startswith(("ProfilerStep#", "mnistflow/"))]
    total = sum(e.self_cpu_time_total for e in ops) or 1.0
    gpu = any(e.self_device_time_total for e in ops)
    by_time = sorted(ops, key=lambda e: e.self_device_time_total if gpu else e.self_cpu_time_total,
                     reverse=True)[:top]
    cols = [("self CPU", 9), ("%", 6), ("CPU total", 9)] + ([("self GPU", 9)] if gpu else []) + [("calls", 6)]
    rows = [(str(e.key), _time(e.self_cpu_time_total), f"{100 * e.self_cpu_time_total / total:.1f}%",
             _time(e.cpu_time_total)) + ((_time(e.self_device_time_total),) if gpu else ()) + (e.count,)
            for e in by_time]
    mem_key = (lambda e: e.self_device_memory_usage) if gpu else (lambda e: e.self_cpu_memory_usage)
    by_mem = [e for e in sorted(ops, key=mem_key, reverse=True)[:top] if mem_key(e) > 0]
    mcols = [("self CPU mem", 12), ("CPU mem", 10)] + ([("self GPU mem", 12)] if gpu else []) + [("calls", 6)]
    mrows = [(str(e.key), _bytes(e.self_cpu_memory_usage), _bytes(e.cpu_memory_usage))
             + ((_bytes(e.self_device_memory_usage),) if gpu else ()) + (e.count,) for e in by_mem]
    return "\n\n".join([
        _table(f"ops by self time (top {len(rows)} of {len(ops)}; all, with every column: {full.name})",
               cols, rows),
        _table(f"ops by memory (top {len(mrows)})", mcols, mrows)])


def files_note(out: Path, trace: Path, tb: Path) -> str:
    """Where the profile went, and how to open each file."""
    return "\n".join([
        f"profile written to {display(out)}",
        f"  {trace.name:<11} Chrome trace: open in https://ui.perfetto.dev or chrome://tracing",
        f"  {tb.parent.name + '/':<11} for TensorBoard's profiler plugin (pip install torch-tb-profiler):",
        f"  {'':<11} tensorboard --logdir {display(tb.parent)}",
        f"  {'report.txt':<11} the op tables with every column, and the step breakdown"])


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
