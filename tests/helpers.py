"""Helpers shared by test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "specs" / "examples"
# Each example team's specs and handler package share a folder: specs/examples/<team>/.
EXAMPLE_SPECS = sorted(EXAMPLES.glob("*/*.yaml"))
# What an error line or a Java stack trace looks like in a worker's log (Spark's log4j layout,
# Python's logging, a trace's frames and causes): a normal start and run print none.
TROUBLE = re.compile(r"\bERROR\b|Traceback|Exception\b|^\s+at [\w.$]+\(", re.MULTILINE)


def run_cli(
    args: list[str], env: dict[str, str], cwd: Path = REPO, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would (no stdin, so apply never prompts)."""
    return subprocess.run(
        [sys.executable, "-m", "queueplane.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def tagged_examples(directory: Path, tag: str) -> dict[str, Path]:
    """The example specs under ``directory``/<team>/, with topics and group ids made unique by ``tag``.

    DAG ids stay those of the examples; the Kafka names cannot clash with other tests' on the
    shared broker. Each spec's handler package is copied beside it, as it sits beside the
    example. Returns the spec files by dag_id.
    """
    out: dict[str, Path] = {}
    for source in EXAMPLE_SPECS:
        doc = yaml.safe_load(source.read_text())
        spec = doc["spec"]
        spec["topic"]["name"] = f"{tag}.{spec['topic']['name']}"
        spec["group"]["id"] = f"{tag}-{spec['group']['id']}"
        for section, key in (("deadLetter", "topic"), ("markers", "topic")):
            if key in spec.get(section, {}):
                spec[section][key] = f"{tag}.{spec[section][key]}"
        output = spec.get("processing", {}).get("output")
        if output:
            output["topic"] = f"{tag}.{output['topic']}"
        meta = doc["metadata"]
        path = directory / meta["team"] / source.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        package = spec["processing"]["handler"].split(".")[0]
        if (EXAMPLES / package).is_dir() and not (path.parent / package).exists():
            # The team folder is also the handler's package: its code, not the example spec in it.
            code_only = shutil.ignore_patterns("__pycache__", "*.yaml")
            shutil.copytree(EXAMPLES / package, path.parent / package, ignore=code_only)
        out[f"queue__{meta['team']}__{meta['name']}"] = path
    return out


# How another user of a shared host could have prepared a queue's private folder before its worker.
PLANTED_FOLDERS = ("another user's", "world-writable", "a symlink")


def plant_folder(parent: Path, how: str) -> Path:
    """``parent/kitchen`` as another user could leave it (one of ``PLANTED_FOLDERS``): owned by
    uid 12345 (the tests run as root, who may give files away), mode 0777, or a symbolic link
    to a folder elsewhere."""
    folder = parent / "kitchen"
    if how == "a symlink":
        (parent / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(parent / "elsewhere")
        return folder
    folder.mkdir(mode=0o700)
    if how == "another user's":
        os.chown(folder, 12345, 12345)
    else:
        folder.chmod(0o777)
    return folder


def unique_tag() -> str:
    return f"af{uuid.uuid4().hex[:8]}"


def wait_for(what: str, check, timeout_s: float, every_s: float = 2.0):
    """``check()``'s first truthy answer, asked every ``every_s``; past ``timeout_s``, an error naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


class Reported:
    """What the delivery callback is given for a failed write: the record as it was produced."""

    def __init__(self, topic: str, key: bytes | None, value: bytes | None):
        self._topic, self._key, self._value = topic, key, value

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


class AloneProducer:
    """Stands in for the producer that writes a suspect alone: it answers each write at the next
    flush, refusing those whose (topic, value) the test names, as the broker refuses a batch of
    one record too large for its topic; ``written`` keeps every write handed to it."""

    def __init__(self, refused: set[tuple[str, bytes]] | None = None):
        self.refused = refused or set()
        self.written: list[tuple[str, bytes | None, bytes | None]] = []
        self._waiting: list[tuple[Reported, object]] = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, partition=None) -> None:
        self.written.append((topic, key, value))
        self._waiting.append((Reported(topic, key, value), on_delivery))

    def flush(self, timeout: float = -1) -> int:
        from confluent_kafka import KafkaError

        waiting, self._waiting = self._waiting, []
        for message, callback in waiting:
            refused = (message.topic(), message.value()) in self.refused
            callback(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if refused else None, message)
        return 0


def close_spark_gateway() -> None:
    """Stop the driver's JVM a test module started in the test process.

    `SparkSession.stop()` keeps pyspark's gateway for a next session. Left open, the JVM lives as
    long as the pytest process, and py4j's finalizers log into closed streams as it exits: a
    traceback printed after the run's last result.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    gateway.proc.stdin.close()  # the JVM ends when its stdin does
    gateway.proc.wait(timeout=30)
    SparkContext._gateway = SparkContext._jvm = None
