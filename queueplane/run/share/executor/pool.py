"""The handler pool of a share-group worker process: a poll's calls, run in chunks by threads.

A poll's records all go to the pool at once, so one slow record holds up no other record
locked by the same poll. Quick calls go to one thread together in chunks (a hand-over per
record cost more than a trivial call); a call stuck for STUCK_S hands the calls queued
behind it to other threads. A call's outputs are handed to the producer and its thread goes
on to the next call: the call settles when the broker has them. A poll is a whole producer
batch of the queue's topic, thousands of records however small ``max.poll.records`` is, and a
thread that waited for each call's outputs (a broker round trip) did not get through one
before the acquisition lock ran out.

An output reported refused shared its record batch with others, and the broker refuses a batch
whole: the call's result is then ``SUSPECT`` (its refused outputs in ``Poll.suspects``), and the
fetcher writes them again alone before it decides (queueplane.run.executor.failed_writes).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

from confluent_kafka import Message, Producer

from queueplane.handler_api import Handler, Output, Record, Reject, outputs_of
from queueplane.run.dead_letters import Failure
from queueplane.run.executor.crash_journal import CrashJournal
from queueplane.run.executor.failed_writes import fingerprint
from queueplane.run.executor.handler import MessageRecord
from queueplane.run.outcomes import (
    DEAD_LETTERED,
    RELEASED,
    ProducedRecord,
    produce,
    refused_write,
)
from queueplane.run.share.executor.isolated import IsolatedCalls
from queueplane.run.share.settings import ACCEPTED_RESULT, CHUNK_S, ROOM_ROUNDS, STUCK_S, Result

log = logging.getLogger("queueplane.worker")

# A call whose outputs were reported refused with their record batch: not decided until they are
# written again alone (ShareFetcher._confirm_suspects). Never a row's outcome.
SUSPECT = "suspect"


class PoolHost(Protocol):
    """What the pool needs of its process: the handler, where outputs go (a producer whose
    delivery callbacks another thread serves), the crash journal its calls are noted in, and
    the children suspects are called in."""

    handler: Handler
    producer: Producer
    journal: CrashJournal
    isolated: IsolatedCalls

    def output_record(self, output: Output, record: Record) -> ProducedRecord: ...


class Poll:
    """The records of one poll, their results and their deadline: the fetcher waits on one
    condition for all of them.

    Results and in-flight counts are lists indexed like the records, not an object per call:
    a trivial handler's record cost more in that object than in the handler. Pool threads
    write a result without the lock and report finished calls once per chunk; only the moves
    that must not cross the fetcher giving up on the poll take the condition: a call starting
    to produce outputs, and its outputs' delivery settling it.
    """

    __slots__ = (
        "abandoned",
        "cond",
        "deadline",
        "inflight",
        "offsets",
        "partitions",
        "producing",
        "records",
        "results",
        "suspects",
        "unsettled",
    )

    def __init__(self, messages: list[Message], deadline: float):
        self.cond = threading.Condition(threading.Lock())
        self.records = MessageRecord.many(messages)
        # Each record's place, read in one pass (a record's own fields are read from its message
        # at each access): the crash journal notes it before every call. Polled records all have
        # both (queueplane.kafka.consumed); the C accessors mapped keep this pass cheap.
        self.partitions = cast(list[int], list(map(Message.partition, messages)))
        self.offsets = cast(list[int], list(map(Message.offset, messages)))
        self.results: list[Result | None] = [None] * len(messages)  # None until the call ends
        self.inflight = [0] * len(messages)  # calls running in the pool when each call started
        self.unsettled = len(messages)
        self.deadline = deadline
        self.abandoned = False  # the deadline passed: results written from now on are not waited for
        self.producing: set[int] = set()  # calls whose outputs are on their way to the broker
        self.suspects: dict[int, list[ProducedRecord]] = {}  # SUSPECT calls' outputs reported refused

    def finished(self, count: int) -> None:
        with self.cond:
            self.unsettled -= count
            if self.unsettled <= 0:
                self.cond.notify_all()


class Chunk:
    """Calls of one poll, as indices into its records, that one pool thread runs in turn.

    ``todo`` is an iterator because taking its next index is one step under the interpreter
    lock: the thread and a fetcher splitting the chunk off a stuck call both take indices from
    it, and each is taken exactly once. ``since`` is when the thread started the call it is in,
    0 while no call of it runs.
    """

    __slots__ = ("isolated", "poll", "since", "slot", "todo")

    def __init__(self, poll: Poll, indices: Sequence[int], isolated: bool = False):
        self.poll = poll
        self.todo: Iterator[int] = iter(indices)
        self.since = 0.0
        self.isolated = isolated  # suspects: each call in a child process (queueplane.run.share.executor.isolated)
        self.slot = -1  # the crash journal slot of the thread running it


class Outputs:
    """One call's outputs on their way: the call settles when the last is delivered.

    ``left`` counts outputs handed to the producer and not yet reported; ``sealed`` says every
    output was handed over (or handing over failed), so a report that brings ``left`` to 0
    before that settles nothing. ``items`` are the outputs handed over, ``refused`` those
    reported refused: suspects, since their batch may have been refused for another record's
    size. All of it is changed under the poll's condition.
    """

    __slots__ = ("error", "index", "items", "left", "poll", "refused", "sealed", "started")

    def __init__(self, poll: Poll, index: int, started: float):
        self.poll, self.index, self.started = poll, index, started
        self.left = 0
        self.sealed = False
        self.error: Exception | None = None
        self.items: list[ProducedRecord] = []
        self.refused: list[tuple[ProducedRecord, Exception]] = []

    def delivered(self, err: Any, message: Any) -> None:
        """The producer's delivery callback, on its serving thread."""
        with self.poll.cond:
            self.left -= 1
            if err is not None:
                refused = refused_write(err)
                item = self._item(message) if refused is not None else None
                if refused is not None and item is not None:
                    self.refused.append((item, refused))
                elif self.error is None:
                    self.error = refused or RuntimeError(f"output delivery failed: {err}")
            self._settle()

    def _item(self, message: Any) -> ProducedRecord | None:
        """The output a delivery report is about, found by its bytes."""
        print_ = fingerprint(message.topic(), message.key(), message.value())
        return next((item for item in self.items if fingerprint(item[0], item[1], item[2]) == print_), None)

    def seal(self, error: Exception | None = None) -> None:
        with self.poll.cond:
            self.sealed = True
            if error is not None and self.error is None:
                self.error = error
            self._settle()

    def _settle(self) -> None:
        if not self.sealed or self.left:
            return
        poll, index = self.poll, self.index
        if poll.results[index] is None:  # not given up on by the fetcher in the meantime
            error = self.error
            if error is None and self.refused:
                poll.results[index] = (SUSPECT, Failure.of(self.refused[0][1]), self.started)
                poll.suspects[index] = [item for item, _ in self.refused]
            elif error is None:
                poll.results[index] = ACCEPTED_RESULT
            elif isinstance(error, Reject):  # InvalidOutput: refused on every delivery alike
                poll.results[index] = (DEAD_LETTERED, Failure.of(error), self.started)
            else:
                poll.results[index] = (RELEASED, Failure.of(error), self.started)
        poll.producing.discard(index)
        poll.unsettled -= 1
        poll.cond.notify_all()


class HandlerPool:
    """``size`` daemon threads running handler calls for every fetcher of the process.

    Threads take chunks: as many calls of one poll as make about CHUNK_S of handler time, by
    the running mean of the calls so far (one call a chunk until there is one). A call stuck
    past its deadline keeps its thread (a Python thread cannot be stopped); the pool starts a
    replacement so the number of usable threads stays ``size``.
    """

    def __init__(self, host: PoolHost, size: int):
        self.host = host
        self.size = size
        self.chunks: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # notified when queued chunks fall below ROOM_ROUNDS rounds
        self.live = 0
        self.inflight = 0  # threads inside a chunk, so calls running at once
        self.queued = 0  # chunks handed in and not yet taken by a thread
        self.mean_call_s = CHUNK_S  # running mean of handler calls; unknown counts as slow
        for _ in range(size):
            self._spawn()

    def chunk_size(self, calls: int) -> int:
        return max(1, min(calls, int(CHUNK_S / max(self.mean_call_s, 1e-7))))

    def submit(self, poll: Poll, indices: Sequence[int], size: int = 1, isolated: bool = False) -> list[Chunk]:
        """Hand the calls of ``indices`` to the threads in chunks of ``size``; the chunks, for the
        fetcher's stuck check and deadline."""
        chunks = [Chunk(poll, indices[i : i + size], isolated) for i in range(0, len(indices), size)]
        with self.lock:
            self.queued += len(chunks)
        put = self.chunks.put
        for chunk in chunks:
            put(chunk)
        return chunks

    def split_stuck(self, chunks: list[Chunk]) -> list[Chunk]:
        """Calls waiting behind a call that has run STUCK_S go to other threads, one a chunk;
        the new chunks."""
        now = time.monotonic()
        split: list[Chunk] = []
        for chunk in chunks:
            if chunk.since and now - chunk.since >= STUCK_S:
                waiting = list(chunk.todo)  # one step: the chunk's thread takes none of these after it
                if waiting:
                    split += self.submit(chunk.poll, waiting, isolated=chunk.isolated)
        return split

    def wait_for_room(self, timeout: float) -> bool:
        """Whether fewer chunks wait than ROOM_ROUNDS rounds of the threads (waiting up to ``timeout``).

        Fetchers acquire more records only then: records acquired while the pool is far behind
        would wait in its queue while their acquisition lock runs down. A few rounds stay
        queued, so the threads have work while a fetcher's poll is on its way.
        """
        with self.room:
            return self.room.wait_for(lambda: self.queued < ROOM_ROUNDS * self.size, timeout)

    def _spawn(self) -> None:
        with self.lock:
            self.live += 1
        threading.Thread(target=self._loop, name="qp-handler", daemon=True).start()

    def replace_stuck(self) -> None:
        self._spawn()

    def _loop(self) -> None:
        calling, slot = self.host.journal.thread_calls()
        while True:
            chunk = self.chunks.get()
            chunk.slot = slot
            with self.lock:
                self.queued -= 1
                if self.queued == ROOM_ROUNDS * self.size - 1:
                    self.room.notify_all()
                self.inflight += 1
            try:
                self._run(chunk, calling)
            except BaseException:  # handler errors are results; anything else must not cost the pool a thread
                log.exception("a handler thread failed a chunk; continuing")
            with self.lock:
                self.inflight -= 1
                if self.live > self.size:  # a replacement took this thread's place while it was stuck
                    self.live -= 1
                    return

    def _run(self, chunk: Chunk, calling: Callable[[int, int], None]) -> None:
        """Run the chunk's calls until its iterator is exhausted; report how many ended, once.

        The handler call is inline, with its verdicts, because it is the loop of the hot path.
        Each call's record goes in the thread's slot of the crash journal first: if the process
        dies in it, the next process knows the record was in a call.
        """
        poll = chunk.poll
        records, results, inflight, deadline = poll.records, poll.results, poll.inflight, poll.deadline
        partitions, offsets = poll.partitions, poll.offsets
        handler, monotonic = self.host.handler, time.monotonic
        if chunk.isolated:  # the call runs in a child: this process does not die in it
            handler, calling = self._isolated_call(deadline), _unnoted
        ended = ran = 0
        began = monotonic()
        try:
            for i in chunk.todo:
                now = chunk.since = monotonic()
                ended += 1
                if now >= deadline:
                    results[i] = (RELEASED, Failure("Timeout", "the lock ran out before the handler started"), 0.0)
                    continue
                inflight[i] = self.inflight
                ran += 1
                calling(partitions[i], offsets[i])
                try:
                    returned = handler(records[i])
                    if returned is not None:
                        outputs = outputs_of(returned)
                        if outputs:
                            if self._produce(poll, i, outputs, now):
                                ended -= 1  # its delivery settles it
                            continue
                except Reject as exc:
                    results[i] = (DEAD_LETTERED, Failure.of(exc), now)
                    continue
                except BaseException as exc:  # Retry, any other exception, sys.exit(): another delivery
                    results[i] = (RELEASED, Failure.of(exc), now)
                    continue
                results[i] = ACCEPTED_RESULT
        finally:
            chunk.since = 0.0
            self.host.journal.idle()
            poll.finished(ended)
            if ran and not chunk.isolated:  # once a chunk, from its calls' mean: cheaper than per call
                self.mean_call_s += 0.1 * ((monotonic() - began) / ran - self.mean_call_s)

    def _isolated_call(self, deadline: float) -> Handler:
        """The handler for a suspect: its call in a child process, killed at the poll's deadline."""
        host = self.host

        def call(record: Record) -> list[Output]:
            return host.isolated.call(host.journal, record, deadline - time.monotonic())

        return call

    def _produce(self, poll: Poll, index: int, outputs: list[Output], started: float) -> bool:
        """Hand call ``index``'s outputs to the producer, unless the fetcher gave up on the poll;
        whether its delivery settles it (else its result is set here).

        The call joins ``poll.producing`` under the poll's condition: the fetcher, giving up at
        the deadline, waits longer for calls whose outputs are on their way, and must either see
        this one among them or have marked the poll abandoned before it starts.
        """
        with poll.cond:
            if poll.abandoned:  # released already: its outputs must not appear
                poll.results[index] = (RELEASED, Failure("Timeout", "the handler returned after its deadline"), started)
                return False
            poll.producing.add(index)
        pending = Outputs(poll, index, started)
        error: Exception | None = None
        try:
            record = poll.records[index]
            for item in [self.host.output_record(o, record) for o in outputs]:
                with poll.cond:
                    pending.left += 1
                    pending.items.append(item)
                try:
                    produce(self.host.producer, item, pending.delivered)
                except BaseException:
                    with poll.cond:
                        pending.left -= 1
                    raise
        except Exception as exc:  # InvalidOutput (a Reject) or the client refusing: no more outputs of it
            error = exc
        pending.seal(error)
        return True


def _unnoted(_partition: int, _offset: int) -> None:
    """A suspect's call runs in a child: the parent does not die in it, so its slot stays empty."""
