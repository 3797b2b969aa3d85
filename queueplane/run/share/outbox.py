"""The outcome rows a share process settled and has not yet handed to a micro-batch, kept on disk too.

A share fetcher acknowledges a record as soon as its outcome is durable, and the row saying so
waits in the process for the next micro-batch (a time slice, seconds). A process that dies
meanwhile (a handler's ``os._exit``, its memory limit) took those rows with it: the records
are settled on the broker but missing from the run's counts and metrics. So each block of rows
is also appended to a file per process, emptied when a batch takes them; the next process of
the queue on the machine takes over the files of dead processes and hands their rows on.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
from pathlib import Path

from queueplane.run.crash_journal import process_tag, tag_alive
from queueplane.run.outcomes import OutcomeColumns

log = logging.getLogger("queueplane.worker")

SUFFIX = ".outbox"


class Outbox:
    """Rows settled and not yet taken, in memory and in ``<folder>/<process>.outbox``."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{process_tag()}{SUFFIX}"
        self._lock = threading.Lock()
        self._blocks: list[OutcomeColumns] = []
        self._file = self.path.open("ab", buffering=0)

    def add(self, blocks: list[OutcomeColumns]) -> None:
        """Rows settled by one fetcher cycle: one write, before the fetcher's next poll."""
        data = pickle.dumps(blocks, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._blocks.extend(blocks)
            self._file.write(data)

    def holds(self) -> bool:
        """Whether rows wait to be taken."""
        return bool(self._blocks)

    def take(self) -> list[OutcomeColumns]:
        """Every row not yet taken, this process's and dead processes' of the same queue."""
        adopted = self._adopt()
        with self._lock:
            blocks, self._blocks = self._blocks, []
            self._file.truncate(0)
        return adopted + blocks

    def _adopt(self) -> list[OutcomeColumns]:
        blocks: list[OutcomeColumns] = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            if path == self.path or tag_alive(path.name.removesuffix(SUFFIX)):
                continue
            claimed = path.with_name(f"{path.name}.{process_tag()}")
            try:
                path.rename(claimed)  # one process takes it over, whichever renames first
            except FileNotFoundError:
                continue
            blocks += _read(claimed)
            claimed.unlink(missing_ok=True)
        if blocks:
            log.warning("handing on %d outcome block(s) settled by a worker process that died", len(blocks))
        return blocks

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        if not self._blocks:
            self.path.unlink(missing_ok=True)


def _read(path: Path) -> list[OutcomeColumns]:
    """Every whole block in a dead process's file (one it was writing when it died is cut short)."""
    blocks: list[OutcomeColumns] = []
    with path.open("rb") as handle:
        while True:
            try:
                blocks += pickle.load(handle)
            except (EOFError, pickle.UnpicklingError, ValueError, AttributeError, IndexError):
                return blocks
