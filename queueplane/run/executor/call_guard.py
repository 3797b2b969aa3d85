"""A Python worker process that ends itself when a Kafka client call outlives its own timeout.

librdkafka can block a call far past the timeout it was given: a transactional producer's
``send_offsets_to_transaction`` waits on a coordinator request whose timeout is never checked
(librdkafka issue 5456), and after a connection that stalled and then healed it was seen still
waiting seven minutes into a 60 s call. Nothing in Python interrupts a call inside the C
library, and the task blocked there holds its micro-batch, and every record behind it, until
the stall bound marks the worker not live, which a local run never acts on.

So each such call runs under a deadline: its own timeout and ``GRACE_S``. A daemon thread that
finds a call past its deadline says which call and how long, and ends the process. Spark tries
the task again in a new process, whose clients start afresh: a transactional producer with the
same id fences the stuck one and aborts its open transaction, so nothing it wrote is read. The
process's crash journal is disowned first: the records whose handler calls were running did
not kill the process and must not be blamed for it (queueplane.run.executor.crash_journal).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

log = logging.getLogger("queueplane.worker")

# Past a call's own timeout: room for the client to return a timeout error on a loaded machine.
GRACE_S = 30.0
INTERVAL_S = 1.0
EXIT_CODE = 70  # EX_SOFTWARE: the client library failed, not the handler or the machine


class _Call(NamedTuple):
    what: str
    began: float  # monotonic
    timeout_s: float
    deadline: float  # monotonic


class CallGuard:
    """One per Python worker process and queue, beside its crash journal and memory guard."""

    def __init__(self, disown: Callable[[], None], grace_s: float = GRACE_S, interval_s: float = INTERVAL_S):
        """``disown``: called before the exit, so that the process's handler calls are not blamed."""
        self.grace_s = grace_s
        self._disown = disown
        self._interval_s = interval_s
        self._calls: dict[int, _Call] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._watch, name="qp-call-guard", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def bounded(self, what: str, timeout_s: float) -> Iterator[None]:
        """Run the block as a client call given ``timeout_s``: the process ends if it is still in it
        ``grace_s`` after that."""
        key = next(self._ids)
        began = time.monotonic()
        with self._lock:
            self._calls[key] = _Call(what, began, timeout_s, began + timeout_s + self.grace_s)
        try:
            yield
        finally:
            with self._lock:
                del self._calls[key]

    def _watch(self) -> None:
        while True:
            time.sleep(self._interval_s)
            now = time.monotonic()
            with self._lock:
                overdue = [call for call in self._calls.values() if call.deadline <= now]
            if overdue:
                self._exit(min(overdue, key=lambda call: call.began), now)

    def _exit(self, call: _Call, now: float) -> None:
        log.error(
            "the Kafka client call %s has not returned %.0fs after it began, past its own %gs timeout;"
            " this Python worker exits so that Spark tries its task again with new clients",
            call.what,
            now - call.began,
            call.timeout_s,
        )
        try:
            self._disown()
        except Exception:  # the exit must happen whatever the journal can still do
            log.exception("the call guard could not disown its process's handler calls")
        os._exit(EXIT_CODE)
