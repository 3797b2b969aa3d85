"""`queueplane try`: a spec's handler on records given here, without Spark or a broker.

Each record goes through the kit's runner (queueplane.testing): the spec's setup, the handler
under its group type's deadline, its outputs checked as the worker checks them, and deliveries
until the record ends (accepted or in the DLQ), without the waits between them. What it prints
is what the worker would record of each record.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from queueplane.cli.common import command, emit, out, output_flag
from queueplane.errors import EXIT_OK, QueueplaneError, UsageError
from queueplane.spec.model import QueueSpec

MAX_SHOWN = 80  # characters of an error or an output in the table (-o json has them whole)


def register(commands: Any) -> None:
    p = command(
        commands,
        "try",
        "run a spec's handler on records given here, without Spark or Kafka",
        "Run the spec's handler (with its processing.setup and teardown) on each record as a worker "
        "would: under its deadline, with its outputs checked, delivered again after a Retry until "
        "deliveryLimit, without the backoff waits. Prints each record's outcome: accepted, dlq (with "
        "the error its DLQ headers would carry), or released (with --once).",
    )
    p.add_argument("spec", metavar="SPEC", help="the queue's spec file")
    records = p.add_mutually_exclusive_group(required=True)
    records.add_argument("--value", metavar="TEXT", action="append", help="a record's value (repeatable)")
    records.add_argument("--file", metavar="FILE", help="records' values, one a line ('-': standard input)")
    p.add_argument("--key", metavar="TEXT", help="every record's key (default: none)")
    p.add_argument("--header", metavar="NAME=VALUE", action="append", default=[], help="a header (repeatable)")
    p.add_argument("--once", action="store_true", help="one delivery each: a failure shows as released")
    output_flag(p)
    p.set_defaults(handler=cmd_try)


def cmd_try(args: argparse.Namespace) -> int:
    from queueplane import testing
    from queueplane.cli.common import one_spec

    queue = one_spec(args.spec)
    headers = [_header(text) for text in args.header]
    values = args.value if args.value is not None else _lines(args.file)
    if not values:
        raise UsageError(f"{args.file}: no records in it (one value a line)")
    records = [
        testing.make_record(value, args.key, headers, topic=queue.topic.name, offset=i)
        for i, value in enumerate(values)
    ]
    verdicts = []
    # What the handler prints goes to standard error: standard output is the result's (-o json).
    with contextlib.redirect_stdout(sys.stderr), _quiet_worker_log():
        runner = _runner(queue)
        try:
            for record in records:
                try:
                    verdicts.append(runner.deliver(record) if args.once else runner.handle(record))
                except RuntimeError as exc:  # the setup raised (ProcessHooks.start)
                    cause = exc.__cause__ or exc
                    raise QueueplaneError(
                        f"{queue.source}: /spec/processing/setup: {queue.setup} raised {type(cause).__name__}: "
                        f"{cause}; no record was handled"
                    ) from None
        finally:
            torn = runner.hooks.end()
    if torn is not None:
        raise QueueplaneError(
            f"{queue.source}: /spec/processing/teardown: {queue.teardown} raised {type(torn).__name__}: {torn} "
            "(every record's outcome above is what the worker would record)"
        ) from None
    if args.output != "text":
        counts = {o: sum(v.outcome == o for v in verdicts) for o in (testing.ACCEPTED, testing.DEAD_LETTERED)}
        if args.once:
            counts[testing.RELEASED] = sum(v.outcome == testing.RELEASED for v in verdicts)
        emit(
            args.output,
            {
                "spec": queue.source,
                "queue": queue.name,
                "group": queue.group.type,
                "counts": counts,
                "records": [{"record": i + 1, **v.as_dict()} for i, v in enumerate(verdicts)],
            },
        )
    else:
        out.print(_table(queue, verdicts))
    return EXIT_OK


def _runner(queue: QueueSpec) -> Any:
    """The kit's runner for the spec, or a UsageError naming the handler or hook that will not import."""
    from queueplane import testing
    from queueplane.run.executor.handler import load_handler

    paths = queue.handler_search_paths
    loaded: dict[str, Any] = {}
    for field, reference in (("handler", queue.handler), ("setup", queue.setup), ("teardown", queue.teardown)):
        if reference is None:
            continue
        try:
            loaded[field] = load_handler(reference, paths)
        except Exception as exc:
            raise UsageError(
                f"{queue.source}: /spec/processing/{field}: cannot import {reference}: {type(exc).__name__}: "
                f"{exc}. It is looked for in {paths[0]}, in {paths[1]} and on PYTHONPATH."
            ) from None
    return testing.HandlerRunner(
        loaded["handler"],
        group_type=queue.group.type,
        lock_duration_s=queue.group.lock_duration_ms / 1000,
        delivery_limit=queue.group.delivery_limit,
        output_topic=queue.output_topic,
        setup=loaded.get("setup"),
        teardown=loaded.get("teardown"),
    )


@contextlib.contextmanager
def _quiet_worker_log() -> Iterator[None]:
    """The runtimes' log (a teardown's traceback) stays out: this command reports it in one paragraph."""
    logger = logging.getLogger("queueplane.worker")
    kept = logger.propagate
    logger.propagate = False
    quiet = logging.NullHandler()
    logger.addHandler(quiet)
    try:
        yield
    finally:
        logger.removeHandler(quiet)
        logger.propagate = kept


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UsageError(f"--header {text!r}: a header is NAME=VALUE, for example --header trace-id=abc")
    return name, value


def _lines(path: str) -> list[str]:
    """The file's lines, each a record's value (its line end dropped; blank lines skipped)."""
    try:
        text = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"--file {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UsageError(f"--file {path}: not UTF-8 text (byte {exc.start}); give one value a line") from None
    return [line for line in lines if line.strip()]


def _table(queue: QueueSpec, verdicts: list[Any]) -> Any:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{queue.name}: {queue.handler} ({queue.group.type} group)")
    for column in ("record", "key", "outcome", "deliveries", "error or outputs"):
        table.add_column(column, justify="right" if column in ("record", "deliveries") else "left")
    for i, verdict in enumerate(verdicts, 1):
        shown = verdict.as_dict()
        if verdict.error is not None:
            detail = verdict.error
        else:
            detail = "; ".join(f"{o['topic']}: {o['value']}" for o in shown["outputs"]) or "no outputs"
        if len(detail) > MAX_SHOWN:
            detail = detail[: MAX_SHOWN - 1] + "…"
        table.add_row(str(i), escape(shown["key"] or ""), verdict.outcome, str(verdict.deliveries), escape(detail))
    return table
