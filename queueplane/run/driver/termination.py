"""SIGTERM as a stop condition, so a pod asked to stop drains instead of dying mid-batch.

Kubernetes stops a pod by sending SIGTERM to its first process, then SIGKILL once
``terminationGracePeriodSeconds`` have passed. The worker treats the first as one more reason
to stop: the driver finishes the batch in hand (a share group's fetchers settle and acknowledge
what they hold, a consumer group commits its offsets), stops the query and Spark, and exits 0.
Without a handler, Python would die at once and leave acquired records locked until their
acquisition lock expires, and the batch in flight to be redone.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("queueplane.worker")


class Termination:
    """Set once the process is asked to stop; installed for as long as the worker runs."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._previous: Callable[[int, FrameType | None], Any] | int | signal.Handlers | None = None
        self._installed = False

    def install(self) -> None:
        # Python lets only the main thread set handlers; a worker run from another thread (an
        # embedding program) leaves signals to that program.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
            self._installed = True

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        if not self.requested.is_set():
            log.warning("SIGTERM: finishing the batch in hand, settling what the worker holds, then stopping")
        self.requested.set()
