"""The share-group baseline a team would write instead of a worker: confluent-kafka ShareConsumers.

Set up as its users would set it up for a quick handler, and matched to the worker it is
compared with:
- as many processes as the worker's executor has Python workers, each with as many consumer
  threads as the worker runs fetchers per process (two; one polls while another works);
- implicit acknowledgement: every record of a poll is accepted by the next poll, so the
  acknowledgements ride on fetches and no commit waits on the broker (the cheapest mode; the
  worker's acknowledgements also ride on its next poll);
- ``max.poll.records`` and ``fetch.wait.max.ms`` given by the caller (the benchmark passes the
  poll size that served this loop best, and the worker's fetch wait).

A record counts as finished when the handler returns, as the worker's handler marks it: each
process writes its handler's finishing times to ``marks/finished-loop-<pid>`` when it stops.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from array import array
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from confluent_kafka import ShareConsumer

CONSUMERS_PER_PROCESS = 2


def _consume(config: dict[str, Any], topic: str, finished: list[float], done: Synchronized, stop: Event) -> None:
    consumer = ShareConsumer(config)
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            messages = consumer.poll(0.2)
            handled = 0
            for message in messages:
                if message.error() is None:
                    finished.append(time.time())  # the trivial handler: what the worker's does
                    handled += 1
            if handled:
                with done.get_lock():
                    done.value += handled
    finally:
        consumer.close()  # acknowledges the last poll's records


def process_main(
    settings: dict[str, Any], group: str, topic: str, poll: dict[str, Any], marks: str, done: Synchronized, stop: Event
) -> None:
    """One process: its consumer threads until ``stop``, then its finishing times to a file."""
    finished: list[float] = []
    threads = []
    for i in range(CONSUMERS_PER_PROCESS):
        config = {
            **settings,
            **poll,
            "group.id": group,
            "share.acknowledgement.mode": "implicit",
            "client.id": f"plain-share-{os.getpid()}-{i}",
        }
        thread = threading.Thread(target=_consume, args=(config, topic, finished, done, stop))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    with open(Path(marks) / f"finished-loop-{os.getpid()}", "wb") as handle:
        array("d", finished).tofile(handle)


def run(
    settings: dict[str, Any], group: str, topic: str, poll: dict[str, Any], processes: int, marks: Path
) -> tuple[Callable[[], int], Callable[[], None]]:
    """Start the loops; returns how many records they handled so far, and the function that stops them."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    done = context.Value("q", 0)
    loops = [
        context.Process(target=process_main, args=(settings, group, topic, poll, str(marks), done, stop))
        for _ in range(processes)
    ]
    for loop in loops:
        loop.start()

    def finish() -> None:
        stop.set()
        for loop in loops:
            loop.join(60)
            if loop.is_alive():
                loop.kill()

    return (lambda: done.value), finish
