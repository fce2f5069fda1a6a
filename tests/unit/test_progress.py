"""Progress bars (issue 19, "rough edges"): a bar with an ETA that fits the terminal (80
columns included) on a terminal, nothing extra anywhere else, and lines printed above it."""
from __future__ import annotations

import fcntl
import io
import os
import re
import struct
import sys
import termios

import pytest

from mnistflow.core import log
from mnistflow.core import progress as pg
from mnistflow.training.observe.console import ConsoleLogger
from mnistflow.training.observe.train_bar import TrainProgress

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LONG = "a-rather-long-description-that-would-not-fit-in-eighty-columns-by-itself-at-all"


class FakeTTY(io.StringIO):
    """A terminal with no descriptor: its width is ``COLUMNS``."""

    def isatty(self) -> bool:
        return True


def lines(text: str) -> list[str]:
    """What the terminal shows, line by line: each \\r or \\n starts a new one."""
    return [ln for ln in re.split(r"[\r\n]", ANSI.sub("", text)) if ln]


@pytest.fixture
def pty80():
    """A real pseudo-terminal 80 columns wide: (the stream to write, a function reading what
    it received, a function resizing it)."""
    master, slave = os.openpty()
    os.set_blocking(master, False)

    def resize(cols: int) -> None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))

    resize(80)
    stream = open(slave, "w", buffering=1, closefd=True)  # noqa: SIM115 - closed below

    def read() -> str:
        """What the terminal received since the last call."""
        stream.flush()
        got = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            got += chunk
        return got.decode("utf-8", "replace")

    yield stream, read, resize
    stream.close()
    os.close(master)


def test_a_bar_on_an_80_column_terminal_never_passes_80_columns_and_shows_an_eta(pty80):
    stream, read, _ = pty80
    shown = ""
    with pg.progress(200, LONG, "step", stream=stream) as bar:
        for i in range(10):
            bar.set_postfix_str("loss 0.1234 acc 98.7%" + (" and a postfix that keeps going on" if i % 2 else ""))
            bar.update(20)
            bar.refresh()
            shown += read()
    shown += read()
    out = lines(shown)
    assert len(out) >= 10 and all(len(ln) <= 80 for ln in out), max(out, key=len)
    assert all(re.search(r"\d+/200 \[00:\d\d<", ln) for ln in out), out  # the count and the ETA: never cut
    assert "200/200" in shown


def test_the_bar_follows_the_terminal_when_it_is_resized(pty80):
    stream, read, resize = pty80
    with pg.progress(10, "train", "step", stream=stream) as bar:
        bar.update(1)
        bar.refresh()
        wide = lines(read())
        resize(40)
        bar.update(1)
        bar.refresh()
        narrow = lines(read())
    assert max(len(ln) for ln in wide) == 80
    assert narrow and max(len(ln) for ln in narrow) == 40, narrow


def test_a_stream_without_a_descriptor_takes_its_width_from_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    tty = FakeTTY()
    with pg.progress(1000, LONG, "B", stream=tty, unit_scale=True) as bar:
        for _ in range(20):
            bar.update(50)
            bar.refresh()
    out = lines(tty.getvalue())
    assert len(out) >= 20 and all(len(ln) <= 80 for ln in out)
    assert any("<" in ln for ln in out)  # [elapsed<remaining]: the ETA


def test_nothing_is_written_when_the_stream_is_not_a_terminal():
    plain = io.StringIO()
    with pg.progress(10, "train", "step", stream=plain) as bar:
        bar.update(10)
    with pg.stages(["a", "b"], "export", stream=plain) as stage:
        stage("a")
        stage("b")
    assert plain.getvalue() == ""


def test_quiet_and_enabled_false_turn_the_bar_off_on_a_terminal():
    tty = FakeTTY()
    with pg.quiet(), pg.progress(10, "train", stream=tty) as bar:
        bar.update(10)
    with pg.progress(10, "train", enabled=False, stream=tty) as bar:
        bar.update(10)
    assert tty.getvalue() == ""
    with pg.progress(10, "train", stream=tty) as bar:  # quiet() is over
        bar.update(10)
    assert "0/10" in tty.getvalue()


def test_a_warning_printed_while_a_bar_shows_lands_on_its_own_line(monkeypatch):
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    with pg.progress(10, "train", "step") as bar:
        bar.update(3)
        log.warn("something to know")
        bar.update(3)
    assert "mnistflow: warning: something to know" in lines(tty.getvalue())
    assert re.search(r"(^|[\r\n])mnistflow: warning: something to know\n", ANSI.sub("", tty.getvalue()))


def test_stages_name_each_step_of_an_operation():
    tty = FakeTTY()
    with pg.stages(["convert to ONNX", "verify"], "export", stream=tty) as stage:
        stage("convert to ONNX")
        stage("verify")
    out = lines(tty.getvalue())
    assert any("0/2" in ln and "convert to ONNX" in ln for ln in out)
    assert any("1/2" in ln and "verify" in ln for ln in out)


# --- the training bar -------------------------------------------------------------------------

STEP = {"epoch": 0.5, "loss": 0.25, "acc": 0.9, "lr": 0.1, "img_per_s": 1000.0, "data_wait_frac": 0.0}


def run_hooks(hook, config=None) -> None:
    """Three logged steps, an evaluation, the end, as the loop calls them."""
    hook.on_train_start({"total_steps": 130, "config": config or {}})
    for s in (50, 100, 130):
        hook.on_step_end(s, dict(STEP))
    if hasattr(hook, "on_validation_end"):
        hook.on_validation_end(130, {"split": "val", "acc": 0.95, "loss": 0.2, "n": 100, "eval_s": 0.1})
    hook.on_train_end({})


def test_the_training_bar_moves_per_logged_step_with_loss_and_accuracy(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    tty = FakeTTY()
    p = TrainProgress(130, stream=tty)
    p.on_train_start({"total_steps": 130, "config": {}})
    p.on_step_end(50, dict(STEP))
    assert p.bar.n == 50
    p.bar.refresh()
    p.on_step_end(130, dict(STEP))
    p.on_train_end({})
    out = lines(tty.getvalue())
    assert any("50/130" in ln and "loss 0.250 acc 90.0%" in ln for ln in out), out
    assert all(len(ln) <= 80 for ln in out)
    assert p.bar is None  # closed at the end of training


@pytest.mark.parametrize("config", [{"quiet": True}, {"json": True}])
def test_the_training_bar_respects_quiet_and_json(config):
    tty = FakeTTY()
    run_hooks(TrainProgress(130, stream=tty), config=config)
    assert tty.getvalue() == ""


def test_the_console_keeps_its_lines_and_adds_nothing_when_not_a_terminal():
    out, err = io.StringIO(), io.StringIO()
    run_hooks(ConsoleLogger(130, stream=out, bar_stream=err))
    assert err.getvalue() == ""
    shown = out.getvalue().splitlines()
    assert shown[0].split() == ["epoch", "step", "loss", "acc", "val_loss", "val_acc", "img/s", "data", "wait"]
    assert [ln.split()[1] for ln in shown[1:]] == ["50", "100", "130"]  # a row per logged step
    # the last one (the run's end) holds the validation pass of its step, in place of its own line
    assert shown[3].split()[-4:-2] == ["0.2000", "95.00%"] and len(shown) == 4


def test_on_a_terminal_the_bar_stands_for_the_in_place_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out, err = FakeTTY(), FakeTTY()
    run_hooks(ConsoleLogger(130, stream=out, bar_stream=err))
    assert "\r" not in out.getvalue()  # no in-place row under the bar
    shown = out.getvalue().splitlines()  # the header and the run's one row (shorter than a minute)
    assert shown[0].split()[:2] == ["epoch", "step"] and shown[1].split()[:2] == ["0.50", "130"]
    assert len(shown) == 2
    assert "130/130" in err.getvalue() and all(len(ln) <= 80 for ln in lines(err.getvalue()))
