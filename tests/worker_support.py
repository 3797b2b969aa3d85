"""Test queues for the worker: a spec, a handler module next to it, and an event log.

The handler runs in Spark's Python worker processes, so it reports what it did by
appending JSON lines to files in the queue's folder, which the test reads afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
from confluent_kafka import Consumer, Producer
from helpers import REPO
from specs_factory import dump

from queueplane.kafka.target import KafkaTarget
from queueplane.local.processes import pid_alive
from queueplane.provision import steps

HANDLER_SOURCE = '''
"""Test handler: behaviour per record from its JSON value; every call logged."""
import json, os, random, sys, threading, time
from queueplane import Output, Reject, Retry

LOG_DIR = "{log_dir}"


def _reject(order):
    raise Reject(f"order {order['id']} refused")


def _hog(order):
    """Takes memory until its process is ended; written to, so it is resident. Stops at 4 GiB, so a
    memory guard that failed fails the test instead of taking the machine."""
    held = []
    while len(held) < 64:
        held.append(b"x" * (64 << 20))
    raise RuntimeError("took 4 GiB and was not stopped")


def _reject_until_fixed(order):
    """Refused until the team fixes its handler (the test creates the file ``fixed``)."""
    if os.path.exists(os.path.join(os.path.dirname(LOG_DIR), "fixed")):
        return Output({"id": order["id"]})
    raise Reject(f"order {order['id']} refused until the fix")


MISBEHAVIOUR = {  # handlers that break the contract, each in its own way (or refuse the record)
    "reject": _reject,
    "reject_until_fixed": _reject_until_fixed,
    "exit": lambda order: sys.exit(3),
    "os_exit": lambda order: os._exit(1),  # the Python worker process dies with the call
    "bad_return": lambda order: 42,
    "bad_header": lambda order: Output({"id": order["id"]}, headers={"h": 5}),
    "unserialisable": lambda order: {"id": order["id"], "at": object()},
    "huge": lambda order: Output(b"x" * order["size"], topic=order.get("to")),
    "hang_forever": lambda order: time.sleep(3600),  # on every delivery
    "memory_hog": _hog,
}


def _log(event):
    os.makedirs(LOG_DIR, exist_ok=True)
    with open(os.path.join(LOG_DIR, f"{os.getpid()}.jsonl"), "a") as handle:
        handle.write(json.dumps(event) + "\\n")


def handle(record):
    start = time.time()
    event = {"offset": record.offset, "partition": record.partition, "dc": record.delivery_count,
             "key": record.key.decode() if record.key is not None else None,
             "pid": os.getpid(), "thread": threading.get_ident(), "start": start,
             "headers": [[k, None if v is None else v.decode(errors="backslashreplace")] for k, v in record.headers]}
    try:
        order = record.json()
    except Exception:
        event.update(id=None, end=time.time(), result="not-json")
        _log(event)
        raise
    event["id"] = order["id"]
    mode = order.get("mode", "ok")
    if mode == "quick":  # no output, nothing to wait for: a call of a few microseconds
        event.update(end=time.time(), result="ok")
        _log(event)
        return None
    if mode == "hang":
        _log(dict(event, result="started"))
    misbehaving = MISBEHAVIOUR.get(mode)
    if misbehaving is not None:
        event.update(end=time.time(), result=mode)
        _log(event)
        return misbehaving(order)
    try:
        if mode == "retry":
            raise Retry("always retry")
        if record.delivery_count < order.get("fail_until", 0):
            raise Retry("not yet")
        if mode == "hang" and record.delivery_count == order.get("hang_at", 1):
            time.sleep(order.get("hang_s", 10))
        if order.get("sleep_ms"):
            time.sleep(order["sleep_ms"] / 1000)
        if order.get("until_file"):  # held until the test creates the file (at most until_s)
            deadline = start + order.get("until_s", 60)
            while not os.path.exists(order["until_file"]) and time.time() < deadline:
                time.sleep(0.05)
        if order.get("random_ms"):
            time.sleep(random.uniform(0, order["random_ms"]) / 1000)
        event["result"] = "ok"
        return Output({"id": order["id"]}, key=record.key, topic=order.get("to"))  # "to": a topic of its choosing
    except Retry:
        event["result"] = "retry"
        raise
    finally:
        event["end"] = time.time()
        _log(event)
'''


@dataclass
class TestQueue:
    folder: Path
    spec_path: Path
    topic: str
    dlq: str
    output: str
    group: str

    def events(self) -> list[dict]:
        """The calls logged so far. Only lines ended by their newline count: a handler may be
        writing the last one as the test reads, or have been killed (kill -9) halfway through it."""
        out = []
        for file in (self.folder / "events").glob("*.jsonl"):
            complete = file.read_text().split("\n")[:-1]  # what follows the last newline is unfinished
            out += [json.loads(line) for line in complete if line]
        return out

    def count_events(self) -> int:
        """How many calls are logged so far, without parsing them: cheap enough to poll often."""
        return sum(file.read_bytes().count(b"\n") for file in (self.folder / "events").glob("*.jsonl"))


# Records in flight per partition for the fault tests' queues, against make_queue's usual 100: a
# kmq worker's micro-batch is this many per partition (each gets its start marker at once), and
# at 300 records a batch kmq finished a 20,000-record burst a minute or more after the other runtimes.
FAULT_TESTS_IN_FLIGHT = 1000


def make_queue(
    tmp_path: Path,
    kafka: KafkaTarget,
    *,
    partitions: int = 2,
    concurrency: int = 4,
    lock: str = "5s",
    delivery_limit: int = 3,
    group_type: str = "share",
    ordering: str = "none",
    exactly_once: bool = False,
    retry: dict[str, str] | None = None,
    access: dict[str, object] | None = None,
    memory_limit: str | None = None,
    max_in_flight: int = 100,
    start_from: str = "earliest",
) -> TestQueue:
    tag = uuid.uuid4().hex[:8]
    module = f"qp_handler_{tag}"
    folder = tmp_path / f"queue-{tag}"
    folder.mkdir()
    (folder / f"{module}.py").write_text(HANDLER_SOURCE.replace("{log_dir}", str(folder / "events")))
    topic = f"{tag}.work"
    doc = {
        "apiVersion": "queueplane.io/v1",
        "kind": "Queue",
        "metadata": {"name": f"w-{tag}", "team": "test"},
        "spec": {
            "topic": {"name": topic, "partitions": partitions},
            "group": {
                "type": group_type,
                "id": f"g-{tag}",
                "lockDuration": lock,
                "deliveryLimit": delivery_limit,
                "maxInFlight": max_in_flight,
                "ordering": ordering,
                "startFrom": start_from,
            },
            "processing": {
                "handler": f"{module}:handle",
                "concurrency": concurrency,
                "output": {"topic": f"{topic}.out"},
                "exactlyOnce": exactly_once,
            },
        },
    }
    if retry:
        doc["spec"]["retry"] = retry
    if access:
        doc["spec"]["access"] = access
    if memory_limit:
        doc["spec"]["processing"]["memoryLimit"] = memory_limit
    spec_path = folder / "queue.yaml"
    spec_path.write_text(dump(doc))
    steps.apply(steps.plan([str(spec_path)], kafka))
    return TestQueue(folder, spec_path, topic, f"{topic}.dlq", f"{topic}.out", f"g-{tag}")


def idempotent_producer(kafka: KafkaTarget) -> Producer:
    """The tests' producer. Idempotent: on a busy machine a request can time out and be retried,
    and a plain producer's retry can write a batch twice and out of order (measured in CI: a key's
    records out of produce order), which the tests would charge to the worker."""
    return Producer({**kafka.settings, "enable.idempotence": True})


def default_key(i: int) -> bytes:
    """The key of the ``i``-th record when a test names none: 16 keys, so per-key order is exercised."""
    return f"k{i % 16}".encode()


def produce(
    kafka: KafkaTarget,
    topic: str,
    values: list[bytes],
    keys: list[bytes] | None = None,
    headers: list[list[tuple[str, bytes | None]]] | None = None,
) -> None:
    """``headers``: each record's list (empty: the record has none)."""
    producer = idempotent_producer(kafka)
    for i, value in enumerate(values):
        extra = {"headers": headers[i]} if headers and headers[i] else {}
        producer.produce(topic, value=value, key=(keys[i] if keys else default_key(i)), **extra)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


class SteadyLoad(threading.Thread):
    """``rate`` records a second to each topic, paced by the clock, from ``start()`` until ``stop()``.

    One idempotent producer for the whole load: a producer per second (its id handshake, its
    flush) took longer than the second on a busy machine, and the load ran at a third of its
    rate for three times as long. ``gate``: produce only while it is set (a test's broker
    outage is not the producer's to ride out). Ids run from ``first_id``; ``stop()`` says how
    many went to each topic.
    """

    def __init__(
        self,
        kafka: KafkaTarget,
        topics: list[str],
        rate: int,
        *,
        first_id: int = 0,
        sleep_ms: int = 2,
        gate: threading.Event | None = None,
    ):
        super().__init__(name="steady-load", daemon=True)
        self.kafka, self.topics, self.rate = kafka, topics, rate
        self.first_id, self.sleep_ms, self.gate = first_id, sleep_ms, gate
        self.count = 0
        self.failure: BaseException | None = None
        self._stop_requested = threading.Event()

    def run(self) -> None:
        producer = idempotent_producer(self.kafka)
        next_second = time.monotonic()
        try:
            while not self._stop_requested.is_set():
                if self.gate is not None and not self.gate.is_set():
                    while not (self.gate.wait(0.2) or self._stop_requested.is_set()):
                        pass  # stop() is seen while the gate is closed too
                    next_second = time.monotonic()
                    continue
                ids = range(self.first_id + self.count, self.first_id + self.count + self.rate)
                for topic in self.topics:
                    for i in ids:
                        producer.produce(topic, value=order(i, sleep_ms=self.sleep_ms), key=default_key(i))
                assert producer.flush(60) == 0, "the load's records were not all written"
                self.count += self.rate
                next_second += 1
                self._stop_requested.wait(max(0.0, next_second - time.monotonic()))
        except BaseException as exc:  # the test sees it at stop()
            self.failure = exc

    def stop(self) -> int:
        self._stop_requested.set()
        self.join(120)
        assert not self.is_alive(), "the steady load did not stop within 120 s"
        assert self.failure is None, f"the steady load failed: {self.failure!r}"
        return self.count


def order(i: int, **fields: object) -> bytes:
    return json.dumps({"id": f"id-{i:06d}", **fields}).encode()


def recovered_after(queue: TestQueue, fault_ended: float) -> float:
    """Seconds from the end of a fault (epoch) until the queue's handler next accepted a record."""
    after = [e["start"] for e in queue.events() if e.get("result") == "ok" and e["start"] >= fault_ended]
    assert after, f"{queue.topic}: nothing handled after the fault ended"
    return min(after) - fault_ended


def overlap_peak(events: list[dict]) -> int:
    """Most handler calls running at the same moment, from their start and end times."""
    points = sorted(
        itertools.chain.from_iterable(((e["start"], 1), (e["end"], -1)) for e in events), key=lambda p: (p[0], p[1])
    )
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak


def read_all(
    kafka: KafkaTarget, topic: str, expect_at_least: int = 0, timeout_s: float = 30, *, committed_only: bool = True
) -> list:
    """Every record of a topic (read_committed unless asked), waiting until at least ``expect_at_least`` arrived."""
    consumer = Consumer(
        {
            **kafka.settings,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        }
    )
    consumer.subscribe([topic])
    records, deadline, quiet_since = [], time.monotonic() + timeout_s, time.monotonic()
    while time.monotonic() < deadline:
        batch = consumer.consume(500, 0.5)
        good = [m for m in batch if not m.error()]
        records += good
        if good:
            quiet_since = time.monotonic()
        elif len(records) >= expect_at_least and time.monotonic() - quiet_since > 2:
            break
    consumer.close()
    return records


def cluster_flags(kafka: KafkaTarget, folder: Path) -> list[str]:
    """How a command reaches ``kafka``: its bootstrap address, or a properties file beside the
    queue when it needs more (SASL_SSL credentials)."""
    if set(kafka.settings) == {"bootstrap.servers"}:
        return ["--bootstrap-servers", kafka.bootstrap]
    properties = folder / f"kafka-{abs(hash(tuple(sorted(kafka.settings.items()))))}.properties"
    properties.write_text("".join(f"{k}={v}\n" for k, v in kafka.settings.items()))
    return ["--kafka-config", str(properties)]


def worker_command(queue: TestQueue, kafka: KafkaTarget, args: tuple[str, ...]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "queueplane",
        "run",
        str(queue.spec_path),
        *cluster_flags(kafka, queue.folder),
        "-o",
        "json",
        *args,
    ]


def run_worker(queue: TestQueue, kafka: KafkaTarget, *args: str, timeout: float = 300) -> dict:
    """`queueplane run` in a subprocess, as a user runs it; returns its JSON summary."""
    return run_worker_logged(queue, kafka, *args, timeout=timeout)[0]


def run_worker_logged(queue: TestQueue, kafka: KafkaTarget, *args: str, timeout: float = 300) -> tuple[dict, str]:
    """The same, with the worker's log (its standard error) beside the summary."""
    try:
        result = subprocess.run(
            worker_command(queue, kafka, args), capture_output=True, text=True, timeout=timeout, cwd=REPO
        )
    except subprocess.TimeoutExpired as ran_on:  # its log is what says why: kept whole, its end shown
        log = ran_on.stderr.decode(errors="replace") if isinstance(ran_on.stderr, bytes) else ran_on.stderr or ""
        with (queue.folder / "worker.log").open("a") as kept:
            kept.write(log)
        where = queue.folder / "worker.log"
        raise AssertionError(f"the worker ran past {timeout}s ({where}):\n{log[-3000:]}") from None
    with (queue.folder / "worker.log").open("a") as kept:  # whole, beside the queue's files: a message keeps its end
        kept.write(result.stderr)
    with (queue.folder / "summaries.jsonl").open("a") as kept:
        kept.write(result.stdout.strip() + "\n")
    assert result.returncode == 0, (result.returncode, result.stdout[-3000:], result.stderr[-3000:])
    return json.loads(result.stdout), result.stderr


_started: list[subprocess.Popen] = []


def start_worker(queue: TestQueue, kafka: KafkaTarget, *args: str, log: Path | None = None) -> subprocess.Popen:
    """The same command, left running (to be killed, or scraped for metrics); its log appended to ``log``."""
    worker = subprocess.Popen(
        worker_command(queue, kafka, args),
        stdout=subprocess.PIPE,
        stderr=log.open("a") if log is not None else subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    _started.append(worker)
    return worker


class Supervised:
    """A worker started again when it gives up, as its Deployment would, at most ``limit`` times.

    Fault tests use it: a worker that exits with an error under a fault (Kafka gone too long, a
    Spark Python worker not connecting back in time on a starved machine) is allowed to, as long
    as the records it left are handled by the next one. The restarts are counted and reported.
    """

    def __init__(self, queue: TestQueue, kafka: KafkaTarget, *args: str, log: Path, limit: int = 2):
        self.queue, self.kafka, self.args, self.log, self.limit = queue, kafka, args, log, limit
        self.restarts = 0
        self.process = start_worker(queue, kafka, *args, log=log)

    def _again(self) -> None:
        self.restarts += 1
        assert self.restarts <= self.limit, f"gave up {self.restarts} times: " + self.log.read_text()[-3000:]
        self.process = start_worker(self.queue, self.kafka, *self.args, log=self.log)

    def running(self) -> bool:
        """True while a worker runs, starting one again if the last gave up; False once one ended well."""
        code = self.process.poll()
        if code is not None and code != 0:
            self._again()
            return True
        return code is None

    def wait_for(self, what: str, check, timeout_s: float, every_s: float = 0.5):
        """``check()``'s first truthy answer while a worker runs; an error with the log's tail if
        one ends well first or ``timeout_s`` passes, so a worker that stalled says why."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            if not self.running():
                raise AssertionError(f"the worker ended before {what}:\n{self.log.read_text()[-3000:]}")
            time.sleep(every_s)
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}:\n{self.log.read_text()[-3000:]}")

    def summary(self, timeout: float = 600) -> dict:
        """The JSON summary of the first worker that ends well."""
        while self.process.wait(timeout) != 0:
            self._again()
        return json.loads(self.process.stdout.read())


def pause_like_a_zombie(worker: subprocess.Popen) -> list[psutil.Process]:
    """SIGSTOP the worker and every process under it: a pod frozen (a long pause, a partition) that
    will go on later from where it stood. Returns them, for ``resume``."""
    tree: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(worker.pid)
        for _ in range(2):  # again after stopping: a process forked while the first list was taken
            for process in [root, *root.children(recursive=True)]:
                if process not in tree:
                    tree.append(process)
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.suspend()
    return tree


def resume(tree: list[psutil.Process]) -> None:
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.resume()


def kill_like_a_pod(worker: subprocess.Popen) -> None:
    """SIGKILL the worker and every process under it at once, as when its pod dies.

    Spark's Python daemon puts itself and the Python workers it forks in a process group of
    their own, so killing the worker's group alone left them handling records for about half a
    second after the driver was gone. Every process is stopped first, so none goes on while the
    others die, and the daemon forks no new worker in between.
    """
    if worker.poll() is not None:
        _kill_orphans(worker.pid)
        return
    tree = pause_like_a_zombie(worker)  # its pid is its own until it is reaped, whether it runs or not
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    worker.wait(30)


def _kill_orphans(pgid: int) -> None:
    """What is left of a reaped worker's process group. Its pid is free once reaped, and the
    kernel reuses pids quickly where pid_max is 32768: a process that has it now belongs to
    another test, perhaps one running beside this one. While any process of the group lives,
    the kernel keeps the pid unused, so a pid that names no process is the group's, if any of
    the group is left."""
    if pid_alive(pgid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def stop_started_workers() -> None:
    """Kill every process group start_worker began that is still there.

    A failed assertion skips a test's own clean-up, and a worker left retrying against the
    test's broker, gone with the test, would take CPU from every test after it.
    """
    while _started:
        kill_like_a_pod(_started.pop())
