"""Commands on a running queue: status (at a glance), lag (how far behind, where it piles up) and dlq."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from queueplane.cli.common import (
    EPILOG,
    cluster_flags,
    command,
    duration_flag,
    emit,
    err,
    kube_flags,
    one_spec,
    out,
    output_flag,
    resolve_target,
)
from queueplane.errors import EXIT_OK, UsageError
from queueplane.kafka import clients
from queueplane.kafka.offsets import require_topics
from queueplane.spec.model import QueueSpec


def register(commands: Any) -> None:
    _register_status(commands)
    _register_lag(commands)
    _register_dlq(commands)


def _register_status(commands: Any) -> None:
    p = command(
        commands,
        "status",
        "a queue at a glance: topic, group and members, backlog, dead letters, release and pods",
        "Read-only, from anywhere the cluster answers: the topic (or that it is not applied yet), the "
        "group's state and members with their partitions, the backlog and how long its oldest record has "
        "waited, the dead letters pending. With --kubeconfig (or $KUBECONFIG) also the Helm release and the "
        "worker's pods.",
    )
    p.add_argument("spec", metavar="SPEC")
    kube_flags(p, "kubeconfig of the cluster (default: $KUBECONFIG if set)")
    cluster_flags(p)
    output_flag(p)
    p.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    import os

    from queueplane.deploy.kube_access import KubeAccess
    from queueplane.ops.status import kafka_status, kubernetes_status

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    queue = one_spec(args.spec, target)
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    with err.status(f"reading {queue.name}"):
        status = kafka_status(target, queue)
        if kubeconfig:
            kubernetes_status(status, queue, KubeAccess(kubeconfig, args.context, in_cluster=False))
    if args.output != "text":
        emit(args.output, status.as_dict())
        return EXIT_OK
    for name, value in _status_lines(status, args.spec):
        out.print(f"{name:<13} {value}", markup=False)
    return EXIT_OK


def _status_lines(status: Any, spec: str) -> list[tuple[str, str]]:
    from queueplane.ops.status import MISSING

    lines = [("queue", f"{status.queue} (team {status.team}, {status.group_type} group)")]
    if status.partitions is None:
        lines.append(("topic", f"{status.topic}: not there; create it with `queueplane apply {spec}`"))
    else:
        lines.append(("topic", f"{status.topic}: {status.partitions} partition(s)"))
    members = "; ".join(f"{m.client_id}@{m.host} {m.partitions or '-'}" for m in status.members)
    lines.append(("group", f"{status.group}: {status.group_state}, {len(status.members)} member(s) {members}".rstrip()))
    if status.partitions is not None:
        backlog = "unknown" if status.lag is None else f"{status.lag} record(s)"
        if status.oldest_waiting_s:
            backlog += f", the oldest waiting {status.oldest_waiting_s:.0f}s"
        lines.append(("backlog", backlog))
    pending = "topic not there" if status.dead_letters is None else f"{status.dead_letters} pending"
    lines.append(("dead letters", f"{pending} in {status.dead_letter_topic}"))
    if status.release is not None:
        r = status.release
        detail = "" if r["status"] == MISSING else f", revision {r['revision']}, updated {r['updated']}"
        lines.append(("release", f"{r['name']} in {r['namespace']}: {r['status']}{detail}"))
        for pod in status.pods or []:
            ready = "ready" if pod["ready"] else "not ready"
            lines.append(
                (pod["component"] or "pod", f"{pod['name']} {pod['phase']}, {ready}, {pod['restarts']} restart(s)")
            )
    return lines


def _register_lag(commands: Any) -> None:
    p = command(
        commands,
        "lag",
        "show how far a queue's group is behind, per partition",
        "Per partition: log-end offset, the group's committed offset and the lag, with the total; "
        "a hot partition (far above the mean lag) and a hot key (most of a partition's backlog) are flagged. "
        "Share groups show the broker's share-partition lag.",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("-w", "--watch", action="store_true", help="refresh until interrupted (Ctrl-C)")
    p.add_argument("--interval", default="2s", metavar="DURATION", help="refresh interval with --watch (2s)")
    cluster_flags(p)
    output_flag(p)
    p.set_defaults(handler=cmd_lag)


def _register_dlq(commands: Any) -> None:
    dlq_parser = commands.add_parser(
        "dlq",
        help="list or redrive a queue's dead-letter records",
        description="The dead-letter queue of any group type. Pending records are those after the "
        "position of the redrive group <group id>.dlq-redrive.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dlq_parser.set_defaults(handler=cmd_dlq)
    actions = dlq_parser.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    p = actions.add_parser("list", help="table of pending DLQ records with their error headers")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="show at most N records (50)")
    p.add_argument("--all", action="store_true", help="from the log start, already redriven records too")
    cluster_flags(p)
    output_flag(p)
    p = actions.add_parser(
        "redrive",
        help="move pending DLQ records back to the queue's topic",
        description="Move pending DLQ records back to the queue's own topic (whatever topic their headers "
        "name), to the partition they came from, rate-limited, with the "
        "delivery count reset and a redrive header. Each step is a Kafka transaction holding the records "
        "and the new DLQ position: stopped midway and run again, it neither duplicates nor loses records.",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--rate", type=float, metavar="N", help="at most N records a second (default: unlimited)")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only records whose header (queueplane. optional) or key matches, e.g. error.class=Timeout; "
        "the others stay pending",
    )
    cluster_flags(p)
    output_flag(p)


def _lag_table(queue: QueueSpec, rows: list[Any], protocol: str | None = None) -> Any:
    from rich.table import Table

    kind = queue.group.type if protocol is None else f"{queue.group.type}, protocol {protocol}"
    table = Table(title=f"{queue.name}: group {queue.group.id} ({kind}) on {queue.topic.name}")
    for column in ("partition", "log-end", "committed", "lag", "skew"):
        table.add_column(column, justify="left" if column == "skew" else "right")
    for row in rows:
        flags = []
        if row.hot_partition:
            flags.append("hot partition")
        if row.hot_key is not None:
            flags.append(f"hot key {row.hot_key!r} ({row.hot_key_share:.0%} of sampled backlog)")
        committed = "-" if row.committed is None else str(row.committed)
        lag = "?" if row.lag is None else str(row.lag)
        table.add_row(str(row.partition), str(row.log_end), committed, lag, escape(", ".join(flags)))
    from queueplane.kafka.lag import total_lag

    total = total_lag({r.partition: r.lag for r in rows})
    table.add_section()
    table.add_row("total", "", "", "?" if total is None else str(total), "")
    return table


def cmd_lag(args: argparse.Namespace) -> int:
    import time

    from rich.live import Live

    from queueplane.kafka.lag import queue_lag, total_lag
    from queueplane.ops.lag import flag_skew, key_sampler

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    queue = one_spec(args.spec, target)
    interval = duration_flag(args.interval, "--interval") or 2.0
    admin = clients.admin(target)
    require_topics(admin, target, args.spec, {queue.topic.name: "queue topic"})

    def read() -> list[Any]:
        rows = queue_lag(target, queue, admin)
        flag_skew(rows, key_sampler(target, queue))
        return rows

    def protocol() -> str | None:
        """Which group protocol the consumer group runs (KIP-848's ``consumer`` or ``classic``)."""
        if queue.group.type == "share":
            return None
        from queueplane.kafka.group_protocol import protocol_in_use

        try:
            return protocol_in_use(admin, queue.group.id)
        except Exception:  # advisory: the lag is what was asked for
            return None

    if not args.watch:
        rows = read()
        if args.output != "text":
            lags = {r.partition: r.lag for r in rows}
            emit(
                args.output,
                {"partitions": [r.as_dict() for r in rows], "total": total_lag(lags), "protocol": protocol()},
            )
        else:
            out.print(_lag_table(queue, rows, protocol()))
        return EXIT_OK
    try:
        with Live(_lag_table(queue, read(), protocol()), console=out, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(_lag_table(queue, read(), protocol()), refresh=True)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_dlq(args: argparse.Namespace) -> int:
    from queueplane.ops import dlq

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    queue = one_spec(args.spec, target)
    wanted = {queue.dead_letter.name: "dead-letter topic"}
    if args.dlq_command == "redrive":
        wanted[queue.topic.name] = "queue topic"
    require_topics(clients.admin(target), target, args.spec, wanted)
    if args.dlq_command == "list":
        if args.limit < 1:
            raise UsageError("--limit must be at least 1")
        with err.status(f"reading {queue.dead_letter.name}"):
            rows, pending = dlq.list_dead_letters(target, queue, args.limit, args.all)
        if args.output != "text":
            emit(
                args.output,
                {"topic": queue.dead_letter.name, "pending": pending, "records": [r.as_dict() for r in rows]},
            )
            return EXIT_OK
        _print_dead_letters(queue, rows, pending, args.all)
        return EXIT_OK
    if args.rate is not None and args.rate <= 0:
        raise UsageError("--rate must be a positive number of records a second")
    where = dlq.parse_where(args.where)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(f"redriving {queue.dead_letter.name}", total=None)

        def on_progress(report: Any, total: int) -> None:
            progress.update(task, total=total, completed=report.moved + report.kept)

        report = dlq.redrive(target, queue, args.rate, where, on_progress)
    if args.output != "text":
        emit(args.output, report.as_dict())
    else:
        kept = f", {report.kept} not matching kept pending" if where else ""
        out.print(
            f"redrove {report.moved} record(s) from {report.dlq_topic} to {queue.topic.name}{kept}.", markup=False
        )
        if report.other_source:
            err.print(
                f"note: {report.other_source} of them named another source topic in their headers; "
                f"a redrive writes only to the queue's own topic, {queue.topic.name}",
                markup=False,
            )
    return EXIT_OK


def _print_dead_letters(queue: QueueSpec, rows: list[Any], pending: int, include_redriven: bool) -> None:
    from datetime import UTC, datetime

    from rich.table import Table

    scope = "all records" if include_redriven else "pending"
    table = Table(title=f"{queue.dead_letter.name}: {pending} {scope}, showing {len(rows)}")
    for column in ("partition/offset", "key", "source", "deliveries", "error", "message", "last attempt", "redriven"):
        table.add_column(column, overflow="fold")
    for r in rows:
        last = r.last_attempt_ms or r.timestamp_ms
        when = datetime.fromtimestamp(last / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S") if last and last > 0 else "-"
        table.add_row(
            f"{r.partition}/{r.offset}",
            escape(r.key or "-"),
            escape(r.source or "-"),
            "-" if r.delivery_count is None else str(r.delivery_count),
            escape(r.error_class or "-"),
            escape((r.error_message or "")[:120]),
            when,
            str(r.redrive_count),
        )
    out.print(table)
