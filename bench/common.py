"""What every worker benchmark shares: its own broker, specs applied to it, the steady-rate rule, results.

Each benchmark runs on a broker of its own in a temporary folder (nothing shared with a
checkout's broker or spec cache), and measures the worker and its baseline the same way:
steady throughput over the middle of the run (see ``steady_rate``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from queueplane.kafka import clients
from queueplane.kafka.target import KafkaTarget
from queueplane.local.stack import LocalStack
from queueplane.ops.load import QUEUE_PRODUCER
from queueplane.provision import steps

RESULTS = Path(__file__).resolve().parent / "results"
# Steady state: the records finished between these two fractions of the run (ramp-up and tail left out).
STEADY_FROM, STEADY_TO = 0.1, 0.9
console = Console(stderr=True)


@contextlib.contextmanager
def bench_broker(prefix: str) -> Iterator[tuple[Path, KafkaTarget]]:
    """A temporary folder (queueplane's home for the run) and a real local broker in it, removed after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.environ["QUEUEPLANE_HOME"] = tmp
        folder = Path(tmp)
        stack = LocalStack(folder / "local")
        with console.status("starting a local Kafka broker for the benchmark"):
            state = stack.up()
        try:
            yield folder, KafkaTarget({"bootstrap.servers": state.bootstrap}, state.bootstrap)
        finally:
            stack.down(purge=True)


def apply_queue(
    folder: Path, target: KafkaTarget, group: dict[str, Any], with_output: bool = False, **spec: Any
) -> dict[str, Any]:
    """Write a queue spec with a fresh name into ``folder``, apply it, and say where it lives.

    ``spec`` holds the spec's other sections (topic settings, processing); the topic and the
    group get unique names, and ``with_output`` gives the handler an output topic of its own.
    """
    tag = uuid.uuid4().hex[:6]
    names = {"path": folder / f"bench-{tag}.yaml", "topic": f"bench.{tag}", "group": f"bench-{tag}"}
    topic = {"name": names["topic"], **spec.pop("topic", {})}
    if with_output:
        names["output"] = f"{names['topic']}.out"
        spec["processing"] = {**spec["processing"], "output": {"topic": names["output"]}}
    doc = {
        "apiVersion": "queueplane.io/v1",
        "kind": "Queue",
        "metadata": {"name": f"bench-{group['type']}-{tag}", "team": "bench"},
        "spec": {"topic": topic, "group": {"id": names["group"], **group}, **spec},
    }
    names["path"].write_text(yaml.safe_dump(doc))
    steps.apply(steps.plan([str(names["path"])], target))
    return names


def steady_rate(finished_at: Sequence[float], total: int | None = None) -> float:
    """Records/s between the 10th and the 90th percentile of finishing times.

    Start-up (Spark planning the first batch, Python workers forking, consumers joining the
    group one after another) and the tail (the last slots running dry) are not throughput;
    the middle of the run is, and every run and baseline is cut the same way. ``total``: how
    many records the run finished, where the last few finishing times may not have been
    written down before the process ended.
    """
    times = sorted(finished_at)
    total = max(total or 0, len(times))
    first, last = int(total * STEADY_FROM), min(int(total * STEADY_TO), len(times)) - 1
    if last - first < 10:
        return 0.0
    span = times[last] - times[first]
    return round((last - first) / span, 1) if span > 0 else 0.0


def full_rate(finished_at: Sequence[float]) -> float:
    """Records/s from the first finish to the last, for comparison with the steady figure."""
    span = max(finished_at) - min(finished_at)
    return round(len(finished_at) / span, 1) if span > 0 else 0.0


def goal(
    name: str, measured: float, baseline: float, at_least: float | None = None, at_most: float | None = None
) -> dict[str, Any]:
    """One goal of the issue's table: measured / baseline, against its bound (bench/goals.py prints them)."""
    ratio = round(measured / baseline, 3) if baseline else 0.0
    met = (at_least is None or ratio >= at_least) and (at_most is None or ratio <= at_most)
    bound = f">= {at_least}" if at_least is not None else f"<= {at_most}"
    return {"goal": name, "ratio": ratio, "bound": bound, "met": met, "measured": measured, "baseline": baseline}


def save(name: str, result: dict[str, Any], figure: Any) -> None:
    """``bench/results/NAME.json`` and ``NAME.png``, and the figures on stdout."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    figure.tight_layout()
    figure.savefig(RESULTS / f"{name}.png", dpi=110)
    print(json.dumps(result, indent=2))


@contextlib.contextmanager
def profiled(name: str, enabled: bool = True) -> Iterator[None]:
    """py-spy samples this process and its children (Spark's Python workers) while the block runs.

    Written to ``bench/results/NAME-profile.txt`` (py-spy's collapsed stacks, for a flame graph
    tool) and summarised in ``NAME-profile-top.txt``: where the Python time goes, by the
    function on top of the stack and by the functions anywhere on it. Only the thread holding
    the interpreter lock is sampled (``--gil``): a thread waiting for a queue, a fetch or the
    lock itself costs no interpreter time, and counting it hid where the time went (the share
    pool's idle threads were a fifth of the samples). Sampling does not pause the processes
    (``--nonblocking``), so the run it watches keeps its pace.
    """
    if not enabled:
        yield
        return
    RESULTS.mkdir(exist_ok=True)
    raw = RESULTS / f"{name}-profile.txt"
    binary = str(Path(sys.executable).with_name("py-spy"))
    sampling = ["--subprocesses", "--nonblocking", "--gil", "--rate", "50", "--format", "raw"]
    spy = subprocess.Popen(
        [binary, "record", "--pid", str(os.getpid()), *sampling, "--output", str(raw)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(120)
    if raw.is_file():
        summary = profile_summary(raw.read_text())
        (RESULTS / f"{name}-profile-top.txt").write_text(summary)
        console.print(summary)


def profile_summary(collapsed: str, top: int = 25) -> str:
    """The share of samples per function: on top of the stack (self) and anywhere on it (total)."""
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        if not frames:
            continue
        samples += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            anywhere[frame] += int(count)
    if not samples:
        return "no samples\n"
    lines = [f"{samples} samples of the thread holding the interpreter lock (all processes)", "", "self  function"]
    lines += [f"{n / samples:5.1%} {frame}" for frame, n in own.most_common(top)]
    lines += ["", "total function"]
    lines += [f"{n / samples:5.1%} {frame}" for frame, n in anywhere.most_common(top)]
    return "\n".join(lines) + "\n"


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (benchmarks run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Records per micro-batch of the sides that read through Spark's Kafka source (the kmq worker,
# the Spark pass-through baselines): what consumer queues held per batch before they ran as
# members, kept so that those sides pay their per-batch costs as often as before.
SPARK_BATCH_RECORDS = 50_000


def fill(target: KafkaTarget, topic: str, count: int) -> None:
    """``count`` small orders into ``topic``, keyed over 64 keys, all acknowledged before it returns."""
    producer = clients.producer(target.settings, {**QUEUE_PRODUCER})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=str(i % 64).encode(), value=b'{"id": %d}' % i)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
