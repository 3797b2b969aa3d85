"""What the runtimes add to the handler contract in a worker process: loading a handler and its
process hooks, and the Record the share runtime reads from a Kafka message.

The contract itself (Record, Output, Retry, Reject, ...) has one home, queueplane.handler_api,
which the runtimes, the docs and queueplane.testing import. This module imports nothing heavy:
it is imported in every Python worker process before a handler runs.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

from queueplane.handler_api import Handler, Hook, Record

log = logging.getLogger("queueplane.worker")

# How long a drain or a stop waits for processing.teardown before it goes on without it.
TEARDOWN_TIMEOUT_S = 30.0


class MessageRecord(Record):
    """A Record over a confluent-kafka Message, each field read from it when the handler asks.

    The share runtime builds one per delivery: copying eight fields out of the message up
    front cost four times this, and a handler that reads only the value pays for that alone.
    """

    __slots__ = ("_message",)

    key = property(lambda self: self._message.key())
    value = property(lambda self: self._message.value())
    headers = property(lambda self: tuple(self._message.headers() or ()))
    topic = property(lambda self: self._message.topic())
    partition = property(lambda self: self._message.partition())
    offset = property(lambda self: self._message.offset())
    delivery_count = property(lambda self: self._message.delivery_count() or 1)
    timestamp = property(lambda self: self._message.timestamp()[1])

    @classmethod
    def of(cls, message: Any) -> MessageRecord:
        record = object.__new__(cls)
        _set_message(record, message)
        return record

    @classmethod
    def many(cls, messages: list[Any]) -> list[MessageRecord]:
        """One record per message, built by C-level maps: a third less than ``of`` called per message."""
        records = list(map(object.__new__, repeat(cls, len(messages))))
        deque(map(_set_message, records, messages), maxlen=0)
        return records


_set_message = MessageRecord._message.__set__  # type: ignore[attr-defined]


def load_handler(reference: str, search_paths: Iterable[str] = ()) -> Handler:
    """Import ``module:function``; ``search_paths`` (the spec's folder) come before sys.path."""
    return _load_callable(reference, search_paths)


def load_hook(reference: str, search_paths: Iterable[str] = ()) -> Hook:
    """Import a ``processing.setup`` or ``processing.teardown`` as ``load_handler`` imports a handler."""
    return _load_callable(reference, search_paths)


def _load_callable(reference: str, search_paths: Iterable[str]) -> Callable[..., Any]:
    module_name, _, function_name = reference.partition(":")
    for path in reversed(list(search_paths)):
        if path not in sys.path:
            sys.path.insert(0, path)
    module = importlib.import_module(module_name)
    handler = getattr(module, function_name, None)
    if not callable(handler):
        raise AttributeError(f"{module_name} has no callable {function_name!r}")
    return handler


class ProcessHooks:
    """A queue's ``processing.setup`` and ``processing.teardown`` in one process.

    ``start`` runs setup unless it ran since the last teardown: every runtime calls it before it
    hands the process's handler a record, so setup runs once, before the first call. ``end`` runs
    teardown if setup ran: when a process drains (its handler gets no record until the next
    ``start``) and when it ends. Teardown gets ``TEARDOWN_TIMEOUT_S``; one that raises or hangs
    is logged, and the drain or the stop goes on, since every record is settled by then.
    """

    def __init__(self, setup: Hook | None = None, teardown: Hook | None = None, names: tuple[str, str] = ("", "")):
        self.setup = setup
        self.teardown = teardown
        self.names = names
        self.up = False
        # Reentrant: a stop's signal handler may end the hooks on the thread that is starting them.
        self._lock = threading.RLock()
        self._ending: threading.Thread | None = None
        self.teardown_error: BaseException | None = None  # what the last teardown raised

    @classmethod
    def load(cls, setup: str | None, teardown: str | None, search_paths: Iterable[str] = ()) -> ProcessHooks:
        """The hooks named ``module:function``, imported as handlers are (``load_hook``)."""
        paths = list(search_paths)
        return cls(
            load_hook(setup, paths) if setup else None,
            load_hook(teardown, paths) if teardown else None,
            (setup or "", teardown or ""),
        )

    def start(self) -> None:
        """Run setup unless it ran since the last teardown. A setup that raises raises here, as a
        RuntimeError naming it: no record is handled without it, and the next ``start`` tries again."""
        with self._lock:
            if self.up:
                return
            if self.setup is not None:
                try:
                    self.setup()
                except Exception as exc:
                    raise RuntimeError(f"processing.setup {self.names[0]} raised {type(exc).__name__}: {exc}") from exc
            self.up = True

    def end(self, timeout_s: float = TEARDOWN_TIMEOUT_S) -> BaseException | None:
        """Run teardown if setup ran, waiting up to ``timeout_s`` for it (or for one already running).
        What it raised, a TimeoutError if it did not return in time, or None."""
        with self._lock:
            if self.up:
                self.up = False
                if self.teardown is not None:
                    self.teardown_error = None
                    self._ending = threading.Thread(target=self._tear_down, name="qp-teardown", daemon=True)
                    self._ending.start()
            ending = self._ending
        if ending is None:
            return None
        ending.join(timeout_s)
        if ending.is_alive():
            name = self.names[1]
            log.error("processing.teardown %s has not returned within %gs; going on without it", name, timeout_s)
            return TimeoutError(f"it has not returned within {timeout_s:g}s")
        return self.teardown_error

    def _tear_down(self) -> None:
        assert self.teardown is not None
        try:
            self.teardown()
        except BaseException as exc:
            self.teardown_error = exc
            log.exception("processing.teardown %s raised", self.names[1])
