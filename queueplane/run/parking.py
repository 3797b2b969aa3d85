"""Dead letters the DLQ refuses: what their rows say, and the error line the worker logs about them.

Every runtime parks such a record in the queue's own topic (``outcomes.parked_record``), and a
worker that meets a parked record writes it to the DLQ as it is, without a handler call. The
rows say which way it went, for the driver's metric (``queueplane_dead_letter_write_failures``,
labelled by ``outcome``); the error line says why, once per cause a minute, so a DLQ that
refuses writes leaves the worker looking broken in its log and metrics, not idle and green.
"""

from __future__ import annotations

import logging
import re
import threading
import time

from queueplane.run.dead_letters import Failure
from queueplane.run.outcomes import DLQ_WRITE_FAILED

log = logging.getLogger("queueplane.worker")

# What became of a dead letter the DLQ refused: the first word of its row's error message.
PARKED = "parked"  # written back to the queue's topic, for the DLQ to take later
RETRYING = "retrying"  # parking failed too: the record comes again (another delivery, a task retry)
LOST = "lost"  # parking failed on a share record's last delivery, through its whole lock: archived
FATES = (PARKED, RETRYING, LOST)


def refused_failure(fate: str, why: str) -> Failure:
    """The row's failure of a dead letter the DLQ refused; ``fate`` is one of ``FATES``."""
    return Failure(DLQ_WRITE_FAILED, f"{fate}: {why}")


def fate_prefix(fate: str) -> str:
    """How the error text of such a row starts (``outcomes.error_text``)."""
    return f"{DLQ_WRITE_FAILED}: {fate}:"


class RefusalLog:
    """Error lines about refused dead letters: one per cause at most every ``EVERY_S``, with the
    count since the last one. A DLQ that refuses one record refuses it on every cycle of it."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._logged: dict[str, tuple[float, int]] = {}  # cause -> (when logged, count then)

    def error(self, cause: str, line: str) -> None:
        now = time.monotonic()
        with self._lock:
            count = self._counts[cause] = self._counts.get(cause, 0) + 1
            when, then = self._logged.get(cause, (-self.EVERY_S, 0))
            if now - when < self.EVERY_S:
                return
            self._logged[cause] = (now, count)
        more = f" ({count - then} of them since the last line)" if count - then > 1 else ""
        log.error("%s%s", line, more)

    def count(self, cause: str) -> int:
        with self._lock:
            return self._counts.get(cause, 0)


REFUSALS = RefusalLog()


def cause_of(topic: str, why: object) -> str:
    """A refusal's cause for the rate limit: the topic and the error, numbers left out (offsets, sizes)."""
    return f"{topic}: {re.sub(r'[0-9]+', '#', str(why))[:160]}"
