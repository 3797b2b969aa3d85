"""Processes and ports of the local stack: free ports, liveness, a stop that always ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Collection

HOST = "127.0.0.1"  # everything the local stack starts listens on loopback only


def free_port(host: str, avoid: Collection[int] = ()) -> int:
    """A port the kernel just gave out on ``host``: free unless another process races for it.

    ``avoid``: ports picked already and not yet listened on (one broker's listeners). The
    kernel may give the same port out twice in a row once its socket is closed.
    """
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port


def free_ports(host: str, count: int) -> list[int]:
    """``count`` different ports, each as ``free_port`` gives one."""
    ports: list[int] = []
    while len(ports) < count:
        ports.append(free_port(host, avoid=ports))
    return ports


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether the process ended within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def terminate(pid: int, grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; returns once the process is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_gone(pid, grace_s):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while pid_alive(pid):
        time.sleep(0.05)
