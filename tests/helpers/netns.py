"""Several "machines" on one: Linux network namespaces joined by a switch, made and removed by a test.

    with Machines(3) as m:            # 10.213.N.1, .2, .3 on a bridge of their own
        m.popen(0, ["python", ...])   # a process inside machine 0's namespace
        m.kill(1)                     # every process of machine 1, at once (kill -9)

Each machine is a namespace ``<prefix>m<i>`` with loopback and one interface, ``mf0``, holding
``10.213.N.<i+1>/24``; its other end is in a namespace ``<prefix>sw`` that holds only a bridge
(the switch). Nothing is made in the host's own namespace: no address, no route, no interface
(so nothing can be routed out, and two tests never share a name). Files are shared (the same
filesystem): the "storage every node sees" of a real cluster. Everything is removed on exit,
after a failure too; processes still running in a namespace are killed first.

Needs root, ``ip`` (iproute2) and a kernel with network namespaces: :func:`unavailable` says
why not, for a skip.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SUBNET = 10, 213  # 10.213.N.0/24, N chosen per instance


def unavailable() -> str | None:
    """Why namespaces cannot be made here (a reason for a skip), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    name = f"mfprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Machines:
    """``n`` machines as network namespaces on one bridge; a context manager."""

    def __init__(self, n: int, interface: str = "mf0"):
        self.n, self.interface = n, interface
        self.prefix = f"mf{os.getpid() % 100000}x{time.monotonic_ns() % 1000}"
        self.net = 1 + (os.getpid() + time.monotonic_ns()) % 250  # the third byte: 1..250
        self.switch = f"{self.prefix}sw"
        self.names = [f"{self.prefix}m{i}" for i in range(n)]
        self.procs: list[tuple[int, subprocess.Popen]] = []

    def addr(self, i: int) -> str:
        return f"{SUBNET[0]}.{SUBNET[1]}.{self.net}.{i + 1}"

    def __enter__(self) -> Machines:
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, ns in enumerate(self.names):
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                # both ends made straight in their namespaces: the host's never holds either
                _ip("link", "add", self.interface, "netns", ns, "type", "veth", "peer", "name", f"p{i}",
                    "netns", self.switch)
                _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
                _ip("-n", self.switch, "link", "set", f"p{i}", "up")
                _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", self.interface)
                _ip("-n", ns, "link", "set", self.interface, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def popen(self, i: int, cmd: list[str], **kw) -> subprocess.Popen:
        """``cmd`` started inside machine ``i`` (``ip netns exec``: it execs, so the Popen's pid is
        the command's own)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[i], *cmd], **kw)
        self.procs.append((i, proc))
        return proc

    def pids(self, i: int) -> list[int]:
        """Every process running in machine ``i``'s namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.names[i]], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill(self, i: int) -> None:
        """kill -9 of every process of machine ``i`` (the machine "dies")."""
        for pid in self.pids(i):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for j, proc in self.procs:
            if j == i:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass

    def close(self) -> None:
        """Kill what still runs in the namespaces, then delete them (their interfaces go with them)."""
        for i, ns in enumerate(self.names):
            try:
                self.kill(i)
            except (OSError, ValueError):
                pass
        for ns in [*self.names, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
