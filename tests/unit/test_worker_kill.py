"""A test's clean-up kills only its own workers: a worker already reaped may have lent its pid to
another process by then (pid_max is 32768 here, and the suite starts thousands of processes)."""

from __future__ import annotations

import subprocess
import sys
import time

from worker_support import kill_like_a_pod

from queueplane.local.processes import pid_alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_reaped_worker_whose_pid_another_process_took_is_left_alone():
    ended = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    ended.wait()
    other = subprocess.Popen(SLEEPER)  # another test's process
    try:
        ended.pid = other.pid  # what reuse does: the kernel gave the ended worker's pid to it
        kill_like_a_pod(ended)
        time.sleep(0.3)
        assert other.poll() is None, "another test's process was killed"
    finally:
        other.kill()
        other.wait()


def _worker_with_a_child(then: str) -> tuple[subprocess.Popen, int]:
    """A worker in a session of its own that starts a sleeping child, then runs ``then``."""
    spawner = f"import subprocess, sys, time; print(subprocess.Popen(sys.argv[1:]).pid, flush=True); {then}"
    worker = subprocess.Popen(
        [sys.executable, "-c", spawner, *SLEEPER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert worker.stdout is not None
    return worker, int(worker.stdout.readline())


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_what_is_left_of_a_reaped_workers_group_is_killed():
    leader, child = _worker_with_a_child("pass")
    leader.wait()
    assert pid_alive(child), "the worker's child outlived it, in its process group"
    kill_like_a_pod(leader)
    assert _gone(child)


def test_a_running_worker_and_everything_under_it_are_killed():
    worker, child = _worker_with_a_child("time.sleep(60)")
    kill_like_a_pod(worker)
    assert worker.returncode is not None
    assert _gone(child)
