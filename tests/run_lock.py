"""The lock a run's pytest processes share: who may use the machine beside whom.

Light tests share it with each other. A heavy test has it alone. A heavy test marked
``heavy(paired=True)`` may have it beside one other such test and nothing else: the fault tests
mostly wait (for an outage to end, a fault to heal) and together still leave the machine idle
part of the time, while beside the light tests, which keep both cores busy, their workers would
fall behind the locks and bounds they are timed by.

The holders and waiters live in a small JSON file under the temporary folder, read and written
under an exclusive `flock` of a file beside it; each process polls until the rules let it in.
An entry names its process, so a process that died (a crash, a timeout's kill) is dropped from
the file and cannot hold the run up. A heavy test waiting keeps new light tests out, so the
light tests that follow each other do not starve it.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from queueplane.local.processes import pid_alive

LIGHT, HEAVY, PAIRED = "light", "heavy", "paired"
KINDS = (LIGHT, HEAVY, PAIRED)
POLL_S = 0.2
_tokens = itertools.count()


def admitted(kind: str, holders: list[str], waiting: list[str]) -> bool:
    """May a test of ``kind`` start beside ``holders``, with ``waiting`` (the others) waiting?"""
    if kind == LIGHT:
        return all(k == LIGHT for k in [*holders, *waiting])
    if kind == HEAVY:
        return not holders
    return all(k == PAIRED for k in holders) and len(holders) < 2


class RunLock:
    """The lock of one run, kept in ``path`` (JSON) and guarded by ``path`` + ``.mutex``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mutex = path.with_name(path.name + ".mutex")

    @contextmanager
    def held(self, kind: str) -> Iterator[None]:
        if kind not in KINDS:
            raise ValueError(f"no such kind of test: {kind!r}")
        token = f"{os.getpid()}:{next(_tokens)}"
        with self._state() as state:
            state["waiting"][token] = kind
        try:
            while not self._enter(token, kind):
                time.sleep(POLL_S)
            yield
        finally:
            with self._state() as state:
                state["waiting"].pop(token, None)
                state["holders"].pop(token, None)

    def _enter(self, token: str, kind: str) -> bool:
        with self._state() as state:
            waiting = [k for t, k in state["waiting"].items() if t != token]
            if not admitted(kind, list(state["holders"].values()), waiting):
                return False
            del state["waiting"][token]
            state["holders"][token] = kind
            return True

    @contextmanager
    def _state(self) -> Iterator[dict[str, dict[str, str]]]:
        """The file's holders and waiters (those of dead processes dropped), written back after."""
        with open(self.mutex, "a") as mutex:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            try:
                text = self.path.read_text() if self.path.exists() else ""
                state = json.loads(text) if text else {"holders": {}, "waiting": {}}
                for entries in state.values():
                    for token in [t for t in entries if not pid_alive(int(t.split(":", 1)[0]))]:
                        del entries[token]
                yield state
                written = self.path.with_name(f"{self.path.name}.{os.getpid()}")
                written.write_text(json.dumps(state))
                os.replace(written, self.path)  # whole: a reader without the mutex never sees half
            finally:
                fcntl.flock(mutex, fcntl.LOCK_UN)
