"""The ordering rules of the consumer-group runtime, as pure functions and one small tracker.

Kept apart from the runtime so the rules (which slot a key runs in, how far offsets may be
committed) can be checked without Spark or a broker.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

FNV_OFFSET_BASIS = 0x811C9DC5
FNV_PRIME = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32 bits: stable across processes and versions, unlike Python's hash()."""
    h = FNV_OFFSET_BASIS
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    return h


def key_slot(key: bytes | None, slots: int) -> int:
    """The slot a key runs in; keyless records share slot 0, so they keep their offset order too."""
    if key is None or slots <= 1:
        return 0
    return fnv1a_32(key) % slots


class ContiguousOffsets:
    """Offsets handed out in order, completed in any order; how far everything is done.

    ``watermark`` is the next offset a restart must process: every offset below it that was
    handed out is complete. A payload given with a completion comes back from ``advance``
    once the watermark has passed it, in offset order (exactly-once writes them then).
    """

    def __init__(self) -> None:
        self._open: deque[int] = deque()
        self._done: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.watermark: int | None = None

    def add(self, offsets: list[int]) -> None:
        """Offsets handed out, in offset order."""
        with self._lock:
            self._open.extend(offsets)
            if self.watermark is None and offsets:
                self.watermark = offsets[0]

    def complete(self, offset: int, payload: Any = None) -> None:
        with self._lock:
            self._done[offset] = payload

    def complete_many(self, offsets: list[int], payloads: list[Any]) -> None:
        """``complete`` for many offsets under one lock."""
        with self._lock:
            self._done.update(zip(offsets, payloads, strict=True))

    def advance(self, end: int | None = None) -> list[Any]:
        """Move the watermark over the completed prefix; ``end`` is where it lands once all is done."""
        released = []
        with self._lock:
            while self._open and self._open[0] in self._done:
                offset = self._open.popleft()
                released.append(self._done.pop(offset))
                self.watermark = offset + 1
            if not self._open and end is not None and (self.watermark is None or end > self.watermark):
                self.watermark = end
        return released

    @property
    def unfinished(self) -> int:
        """Offsets handed out and not completed yet."""
        with self._lock:
            return len(self._open) - len(self._done)
