"""What a share-group worker process is told by the driver, and the pool's and fetchers' tuning."""

from __future__ import annotations

from dataclasses import dataclass

from queueplane.run.dead_letters import Failure
from queueplane.run.outcomes import (
    ACCEPTED,
)
from queueplane.run.settings import QueueSettings

HANDLER_SHARE_OF_LOCK = 0.7  # a handler gets 70% of the lock; the rest is for outputs and the ack
FETCHER_SHARE = 4  # one ShareConsumer per this many handler threads (at least two a process)
# A poll may acquire this many rounds of the pool's threads: fewer fetch round trips per record
# (a quick handler's throughput was bound by them at 8 records a poll), while the pool's room
# check keeps acquired records from queueing behind a busy pool.
POLL_ROUNDS = 8
ROOM_ROUNDS = 4
# A pool thread takes a poll's calls in chunks of about this much handler time: a quick handler's
# calls go to one thread together instead of waking a thread per record (each hand-over cost more
# than a trivial call), while calls of 2 ms or more still go one to a thread.
CHUNK_S = 0.002
# A chunk whose running call has taken this long hands its calls not yet started to other threads,
# so one slow or hung record holds up no other record for longer than this.
STUCK_S = 0.05
# While a poll's calls run, what they accepted is acknowledged and committed this often: a poll is a
# whole producer batch (thousands of records), and a killed worker's unsent acknowledgements come
# back as duplicates.
ACK_EVERY_S = 0.1
# How long a process remembers the records it accepted, so that one delivered again after its
# acknowledgement was lost is accepted without a call (queueplane.run.share.executor.accepted): the
# redelivery comes once the lock runs out and a fetch reaches the record again, which a network
# fault can put off by tens of seconds. At least ACCEPTED_MEMORY_LOCKS locks.
ACCEPTED_MEMORY_S = 120.0
ACCEPTED_MEMORY_LOCKS = 10
# A share fetch's longest wait on the broker (librdkafka's fetch.wait.max.ms, 500 by default;
# fetcher.py says why it is shorter). An idle consumer asks 10 times a second.
FETCH_WAIT_MS = 100
# A micro-batch's time slice. Each batch costs Spark a fixed amount of driver and executor work
# (planning, the task round trip, the sink), so longer slices cost less per record and per idle
# second (docs/benchmarks.md has the figures). Acknowledgements do not wait for it; only the
# outcome rows do.
SLICE_MS = 3000
# A process that returned no outcome for this long is idle: its batches wait past the slice
# until an outcome settles, up to IDLE_SLICE_MS (process.py says why). Short runs (tests, a
# drain) never get there.
IDLE_AFTER_S = 30.0
IDLE_SLICE_MS = 15_000
# Fetchers keep acquiring this long past a batch's time slice, to bridge the driver's pause
# before the next batch; without a renewal they stop and only settle what they hold.
LEASE_GRACE_S = 3.0
# A process whose lease has been over this long (no task of a batch came) drains its consumers and
# closes them: a fetch sent by an empty poll acquires what arrives after it, and a consumer killed
# with its executor (a scale-down whose draining batch gave this process no task) returned that
# one delivery higher. The next task starts new consumers.
IDLE_LEAVE_S = 3.0
# A draining consumer whose last poll came back empty polls until one brings records (it then holds
# nothing unhandled) for at most this long: a queue that brings nothing in that time has nothing
# for the fetch that is out to acquire either.
DRAIN_POLL_S = 2.0
# But not while another consumer of the process polled records, or the queue's topic grew, within
# DRAIN_POLL_S: the queue is trickling, not idle, and feeds whichever open fetch comes first, so
# this one's may acquire the next records, which come back one delivery higher once it has left
# (docs/runtimes.md). The topic's growth shows the records other processes' fetches took too.
# Its siblings leave as their polls bring records, and then the trickle comes to it; it leaves
# with a fetch out after DRAIN_POLL_MAX_S at the latest.
DRAIN_POLL_MAX_S = 5.0
# How long after a scale-down's drain was asked for every process of the queue has let go of
# the group: a process's last lease ends at most LEASE_GRACE_S after the batch before the drain,
# it drains IDLE_LEAVE_S after that, on an idle queue for DRAIN_POLL_S; one second for the close
# itself. (A drain on a trickling queue can take up to DRAIN_POLL_MAX_S: the driver then waits for
# the group to empty, for at most one lock more.)
DRAIN_SETTLE_S = LEASE_GRACE_S + IDLE_LEAVE_S + DRAIN_POLL_S + 1.0


@dataclass(frozen=True, kw_only=True)
class ShareSettings(QueueSettings):
    """Everything an executor needs, sent from the driver as JSON (no spec parsing on executors)."""

    topic: str
    # The group's share.delivery.count.limit (deliveryLimit and the reserve deliveries): a record
    # released on this delivery is archived by the broker.
    broker_delivery_limit: int
    slots: int = 8
    max_poll_records: int = 5
    batch_ms: int = SLICE_MS
    idle_batch_ms: int = IDLE_SLICE_MS


# A call's verdict: its outcome, its failure, and when its handler started (monotonic; 0.0 when it
# never did, and then the poll's time stands in for it in the DLQ headers).
Result = tuple[str, Failure | None, float]
ACCEPTED_RESULT: Result = (ACCEPTED, None, 0.0)
# A redelivered record a dead process's rows counted already (queueplane.run.share.executor.outbox): it is
# acknowledged ACCEPT without a call and without a row. Never a row's outcome.
ALREADY_COUNTED = "already_counted"
ALREADY_COUNTED_RESULT: Result = (ALREADY_COUNTED, None, 0.0)
# ... one they dead-lettered: its DLQ copy is written, so it is acknowledged REJECT without a
# call, a row or another copy. Never a row's outcome either.
ALREADY_DEAD = "already_dead_lettered"
ALREADY_DEAD_RESULT: Result = (ALREADY_DEAD, None, 0.0)
