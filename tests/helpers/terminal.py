"""Running mnistflow in a pseudo-terminal, and reading back what a terminal would show."""
from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import time

CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def run_in_pty(args: list[str], cols: int = 80, rows: int = 30, env: dict | None = None,
               cwd: str | os.PathLike | None = None, timeout: float = 300,
               pause_s: float = 0.0) -> tuple[int, str]:
    """``python -m mnistflow ARGS`` with stdin, stdout and stderr on one pseudo-terminal of
    ``cols`` x ``rows``; returns (exit code, every byte it wrote, decoded). ``pause_s``: the
    terminal stops reading that long after the first bytes, as a slow one does (a writer
    blocks once its buffer is full), so a run that writes much lasts at least that long."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    e = {**os.environ, **(env or {})}
    e.pop("COLUMNS", None)
    e.pop("LINES", None)
    proc = subprocess.Popen([sys.executable, "-m", "mnistflow", *args], stdin=slave, stdout=slave,
                            stderr=slave, env=e, cwd=cwd, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        if not out and pause_s:
            time.sleep(pause_s)
        out += chunk
        if time.monotonic() > deadline:
            proc.kill()
            break
    os.close(master)
    return proc.wait(timeout=30), out.decode("utf-8", "replace")


def segments(raw: str) -> list[str]:
    """Every stretch of text written between two line starts (\\r or \\n), escape sequences
    taken out: what each write put on one terminal line (none should pass its width)."""
    return [s for s in re.split(r"[\r\n]", CSI.sub("", raw)) if s]


def screen(raw: str, cols: int = 80) -> list[str]:
    """The lines a terminal of ``cols`` columns holds at the end (the scrollback included):
    \\r, \\n, erase-line (ESC [K), cursor up (ESC [A) and auto-wrap, as tqdm and mnistflow use them."""
    lines, row, col = [""], 0, 0
    i = 0
    raw = raw.replace("\r\n", "\n")
    while i < len(raw):
        m = CSI.match(raw, i)
        if m:
            n = int(m.group(1) or 1) if m.group(1).isdigit() else 1
            if m.group(2) == "K":
                lines[row] = lines[row][:col]
            elif m.group(2) == "A":
                row = max(row - n, 0)
            i = m.end()
            continue
        c = raw[i]
        i += 1
        if c == "\r":
            col = 0
        elif c == "\n":
            row += 1
            col = 0
            if row == len(lines):
                lines.append("")
        elif c >= " ":
            if col == cols:  # auto-wrap
                row, col = row + 1, 0
                if row == len(lines):
                    lines.append("")
            line = lines[row].ljust(col)
            lines[row] = line[:col] + c + line[col + 1:]
            col += 1
    return [ln.rstrip() for ln in lines]
