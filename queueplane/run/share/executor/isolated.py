"""A share suspect's handler call, run in a child process of its own.

A record that was in a handler call when its process died (os._exit, a crash in native code,
its memory limit) is a suspect (queueplane.run.executor.crash_journal). On a share queue a process that
dies takes every record it has acquired with it: the broker delivers each again, one delivery
count higher, so a suspect that killed process after process would push the records beside it
toward the delivery limit too. So a suspect's next calls run in a child process, started for
that call: if the handler kills it, only the child dies, the parent counts the crash and
releases the record (the broker's count reaches ``deliveryLimit`` and the fetcher then sends it
to the DLQ), and nothing else the parent holds is touched. A suspect that only ran beside the
culprit returns, is cleared, and its outputs are written by the parent as any call's are.

A child costs a Python start and the handler's import (a few hundred milliseconds), which only
records that were in a call when a process died ever pay. It gets the parent's memory limit,
and is killed at the poll's deadline like a hung call is given up.

Run as ``python -m queueplane.run.share.executor.isolated``: a pickled ``Job`` on stdin (a pipe from the
parent to its own child), the verdict written as JSON into ``Job.verdict_path``. That file is in
a folder made for the call (``mkdtemp``, 0700) inside the queue's private folder
(queueplane.run.executor.private_dirs), and the parent reads it as data: the outputs' key, value and
headers as the bytes they encode to (base64), the failures as their class and message. Nothing
in it is run, so a verdict that is not the child's could at worst give a wrong answer for the
one call, never run code in the parent.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queueplane.handler_api import Output, Record, Reject, outputs_of
from queueplane.run.dead_letters import Carried, Failure
from queueplane.run.executor.crash_journal import CrashJournal, worker_died
from queueplane.run.executor.handler import ProcessHooks, load_handler
from queueplane.run.executor.memory_guard import guard
from queueplane.run.executor.outputs import output_record


class ChildFailed(Carried, Exception):
    """The call failed in the child (an exception, its death, its deadline): another delivery."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


class ChildRejected(Carried, Reject):
    """The call refused the record in the child (Reject, or outputs that cannot be written): the DLQ."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True)
class Job:
    """One call for a child: what to load, the record, where its outputs go, where to answer."""

    handler: str
    search_paths: list[str]
    record: Record
    output_topic: str | None
    memory_limit_mi: int | None
    verdict_path: str
    hooks: tuple[str | None, str | None] = (None, None)  # processing.setup and teardown, run around the call


# What a child answers: ("returned", outputs), ("raised", failure, rejected) or ("ended", failure)
# (its memory guard ended it). No answer at all: it died.
Verdict = tuple


def plain(record: Record) -> Record:
    """The record as plain fields (a share call's record reads them from a Kafka message, which
    does not cross to another process)."""
    return Record(
        key=record.key,
        value=record.value,
        headers=tuple(record.headers),
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        delivery_count=record.delivery_count,
        timestamp=record.timestamp,
    )


class IsolatedCalls:
    """Runs a process's suspect calls in children and keeps their crashes in the process's journal."""

    def __init__(
        self,
        handler: str,
        search_paths: list[str],
        output_topic: str | None,
        memory_limit_mi: int | None,
        hooks: tuple[str | None, str | None] = (None, None),
    ) -> None:
        self.handler = handler
        self.hooks = hooks
        self.search_paths = search_paths
        self.output_topic = output_topic
        self.memory_limit_mi = memory_limit_mi
        # The child imports queueplane and the handler from where this process does.
        self._env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def call(self, journal: CrashJournal, record: Record, timeout_s: float) -> list[Output]:
        """The handler's outputs for ``record``, called in a child; raises ChildRejected or ChildFailed."""
        with tempfile.TemporaryDirectory(prefix="suspect-", dir=journal.folder) as folder:
            verdict_path = os.path.join(folder, "verdict")
            job = Job(
                self.handler,
                self.search_paths,
                plain(record),
                self.output_topic,
                self.memory_limit_mi,
                verdict_path,
                self.hooks,
            )
            child = subprocess.Popen(
                [sys.executable, "-m", "queueplane.run.share.executor.isolated"], stdin=subprocess.PIPE, env=self._env
            )
            assert child.stdin is not None
            with child.stdin:
                child.stdin.write(pickle.dumps(job))
            try:
                code = child.wait(max(0.0, timeout_s))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                raise ChildFailed(Failure("Timeout", "the handler ran past its deadline")) from None
            verdict = _read(verdict_path)
        if verdict is None or verdict[0] == "ended":
            reason = verdict[1] if verdict is not None else None
            crashes = journal.crashed(record.partition, record.offset, reason)
            failure = worker_died(crashes, reason)
            if reason is None:
                failure = Failure(failure.error_class, f"{failure.message}; the last time with exit status {code}")
            raise ChildFailed(failure)
        journal.cleared(record.partition, record.offset)  # it came back: it did not kill its process
        if verdict[0] == "raised":
            _, failure, rejected = verdict
            raise ChildRejected(failure) if rejected else ChildFailed(failure)
        return verdict[1]


def _read(path: str) -> Verdict | None:
    """The child's verdict, or None when it left none (it died) or one that is not a verdict."""
    try:
        return _verdict(json.loads(Path(path).read_bytes()))
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None


def _answer(path: str, verdict: Verdict) -> None:
    partial = f"{path}.partial"
    Path(partial).write_bytes(json.dumps(_written(verdict)).encode())
    os.replace(partial, path)


def _written(verdict: Verdict) -> dict[str, Any]:
    """A verdict as the JSON the parent reads (``_verdict``)."""
    if verdict[0] == "returned":
        return {"returned": [_output_fields(output) for output in verdict[1]]}
    failure: Failure = verdict[1]
    fields = {"error_class": failure.error_class, "message": failure.message}
    if verdict[0] == "raised":
        return {"raised": fields, "rejected": bool(verdict[2])}
    return {"ended": fields}


def _verdict(raw: Any) -> Verdict:
    """A verdict from its JSON; ValueError, TypeError or KeyError if it is not one ``_written`` makes."""
    if type(raw) is not dict or len(raw) > 2:
        raise ValueError("a verdict is an object")
    if "returned" in raw and len(raw) == 1:
        if type(raw["returned"]) is not list:
            raise TypeError("outputs are a list")
        return ("returned", [_output(fields) for fields in raw["returned"]])
    if "raised" in raw and type(raw.get("rejected")) is bool:
        return ("raised", _failure(raw["raised"]), raw["rejected"])
    if "ended" in raw and len(raw) == 1:
        return ("ended", _failure(raw["ended"]))
    raise ValueError("no such verdict")


def _output_fields(output: Output) -> dict[str, Any]:
    """An output as the bytes it encodes to: what the parent produces is what the handler returned."""
    key, value, headers = output.encoded()
    return {
        "key": _b64(key),
        "value": _b64(value),
        "headers": None if output.headers is None else [[name, _b64(header)] for name, header in headers],
        "topic": output.topic,
    }


def _output(fields: Any) -> Output:
    if type(fields) is not dict or fields.keys() != {"key", "value", "headers", "topic"}:
        raise ValueError("an output is {key, value, headers, topic}")
    headers = fields["headers"]
    if headers is not None:
        if type(headers) is not list or not all(type(h) is list and len(h) == 2 and type(h[0]) is str for h in headers):
            raise TypeError("headers are [name, base64] pairs")
        headers = {name: _unb64(header) or b"" for name, header in headers}
    topic = fields["topic"]
    if topic is not None and type(topic) is not str:
        raise TypeError("a topic is text")
    return Output(_unb64(fields["value"]), key=_unb64(fields["key"]), headers=headers, topic=topic)


def _failure(fields: Any) -> Failure:
    if type(fields) is not dict or fields.keys() != {"error_class", "message"}:
        raise ValueError("a failure is {error_class, message}")
    if type(fields["error_class"]) is not str or type(fields["message"]) is not str:
        raise TypeError("a failure's class and message are text")
    return Failure(fields["error_class"], fields["message"])


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes | None:
    if text is None:
        return None
    if type(text) is not str:
        raise TypeError("bytes are base64 text")
    return base64.b64decode(text, validate=True)


def _child() -> None:
    job: Job = pickle.loads(sys.stdin.buffer.read())
    guard(job.memory_limit_mi, lambda reason: _answer(job.verdict_path, ("ended", reason)))
    handler = load_handler(job.handler, job.search_paths)
    hooks = ProcessHooks()
    try:
        hooks = ProcessHooks.load(*job.hooks, job.search_paths)
        hooks.start()
        outputs = outputs_of(handler(job.record))
        for output in outputs:  # refused here as in the parent (InvalidOutput), and sure to cross back
            output_record(output, job.record, job.output_topic)
        verdict: Verdict = ("returned", outputs)
        _written(verdict)
    except Reject as exc:
        verdict = ("raised", Failure.of(exc), True)
    except BaseException as exc:  # Retry, any other exception, sys.exit(): another delivery
        verdict = ("raised", Failure.of(exc), False)
    _answer(job.verdict_path, verdict)
    hooks.end()


if __name__ == "__main__":
    _child()
