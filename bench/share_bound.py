"""The share runtime's process half hosted in plain processes, no Spark: what Spark's hosting leaves of it.

The share worker's records never cross Spark: each Python worker process keeps long-lived
fetchers (ShareConsumers feeding the handler pool) and a micro-batch task only renews their
lease for one time slice and takes the outcomes settled meanwhile, as an Arrow batch
(queueplane/run/share/source.py, ``read``). This side runs exactly that in processes of its own:
the same settings the worker hands its tasks, the same ShareProcess (with the queue's
process hooks), one time slice after another, each slice's outcomes made into the Arrow batch a
task would yield, then a final draining slice. What it lacks is only Spark: the driver's
micro-batch planning, the task launches, the JVM's share of the cores and the batches' trip to
the JVM and the sink. So the worker's ratio to this side is what Spark's hosting costs, with the
slot path the same on both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.synchronize import Event

from plain_consumer_loop import spawned

from queueplane.run.outcomes import columns_batch
from queueplane.run.share.executor.process import PROCESSES


def host(stop: Event, settings_json: str) -> None:
    """One process: slices until ``stop``, then the draining slice, as the worker's tasks run them."""
    process = PROCESSES.get(settings_json)
    while not stop.is_set():
        blocks = process.run_batch()
        if blocks:
            columns_batch(blocks)  # what a task yields to Spark: the Arrow batch of the slice's outcomes
    blocks = process.run_batch(final=True)
    if blocks:
        columns_batch(blocks)
    PROCESSES.drained(settings_json)


def run(settings_json: str, processes: int) -> Callable[[], None]:
    """Start ``processes`` hosts of the runtime; returns the function that stops them and waits."""
    return spawned(host, [(settings_json,) for _ in range(processes)])
