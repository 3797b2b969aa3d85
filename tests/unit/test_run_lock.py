"""The run's lock (tests/run_lock.py): light tests together, heavy alone, paired two at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from run_lock import HEAVY, LIGHT, PAIRED, RunLock, admitted


@pytest.mark.parametrize(
    ("kind", "holders", "waiting", "enters"),
    [
        (LIGHT, [LIGHT, LIGHT], [], True),
        (LIGHT, [LIGHT], [HEAVY], False),  # a heavy test waiting keeps new light ones out
        (LIGHT, [], [PAIRED], False),
        (LIGHT, [PAIRED], [], False),
        (HEAVY, [], [LIGHT], True),
        (HEAVY, [LIGHT], [], False),
        (HEAVY, [PAIRED], [], False),
        (PAIRED, [PAIRED], [], True),
        (PAIRED, [PAIRED, PAIRED], [], False),
        (PAIRED, [HEAVY], [], False),
        (PAIRED, [LIGHT], [], False),
    ],
)
def test_who_may_start_beside_whom(kind, holders, waiting, enters):
    assert admitted(kind, holders, waiting) is enters


def _hold(lock: RunLock, kind: str, inside: list[str], release: threading.Event) -> threading.Thread:
    def run() -> None:
        with lock.held(kind):
            inside.append(kind)
            release.wait(10)
            inside.remove(kind)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _eventually(check, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_two_paired_tests_run_together_and_a_light_one_waits_for_both(tmp_path):
    lock = RunLock(tmp_path / "run.json")
    inside: list[str] = []
    first, second = threading.Event(), threading.Event()
    holders = [_hold(lock, PAIRED, inside, first), _hold(lock, PAIRED, inside, second)]
    assert _eventually(lambda: inside == [PAIRED, PAIRED])
    light = _hold(lock, LIGHT, inside, threading.Event())
    time.sleep(1)
    assert LIGHT not in inside
    first.set()
    time.sleep(1)
    assert inside == [PAIRED], "still one paired test running"
    second.set()
    assert _eventually(lambda: inside == [LIGHT])
    for thread in holders:
        thread.join(5)
    light.join(0)


def test_a_heavy_test_waits_for_the_light_ones_and_new_light_ones_wait_for_it(tmp_path):
    lock = RunLock(tmp_path / "run.json")
    inside: list[str] = []
    light_done, heavy_done = threading.Event(), threading.Event()
    _hold(lock, LIGHT, inside, light_done)
    assert _eventually(lambda: inside == [LIGHT])
    _hold(lock, HEAVY, inside, heavy_done)
    assert _eventually(lambda: json.loads((tmp_path / "run.json").read_text())["waiting"])
    _hold(lock, LIGHT, inside, threading.Event())
    time.sleep(1)
    assert inside == [LIGHT], "the second light test waits behind the heavy one"
    light_done.set()
    assert _eventually(lambda: inside == [HEAVY])
    heavy_done.set()
    assert _eventually(lambda: inside == [LIGHT])


def test_what_a_dead_process_held_is_dropped(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    (tmp_path / "run.json").write_text(json.dumps({"holders": {f"{dead_pid}:0": HEAVY}, "waiting": {}}))
    lock = RunLock(tmp_path / "run.json")
    inside: list[str] = []
    done = threading.Event()
    _hold(lock, LIGHT, inside, done)
    assert _eventually(lambda: inside == [LIGHT])
    done.set()
    assert _eventually(lambda: json.loads((tmp_path / "run.json").read_text()) == {"holders": {}, "waiting": {}})


def test_the_file_is_always_whole_for_a_reader_without_the_mutex(tmp_path):
    """The tests above (and anyone looking at a run) read the file without the mutex."""
    lock = RunLock(tmp_path / "run.json")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            with lock.held(LIGHT):
                pass

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        reads = 0
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if (tmp_path / "run.json").exists():
                assert set(json.loads((tmp_path / "run.json").read_text())) == {"holders", "waiting"}
                reads += 1
        assert reads > 100
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
