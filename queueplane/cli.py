"""The `queueplane` command line: validate, plan, apply, and the embedded local stack.

It reads like terraform and kubectl: `plan` shows exactly what `apply` will change,
`apply` shows the plan and asks before changing anything. Errors are one paragraph on
stderr with an exit code (see queueplane.errors); a traceback only with QUEUEPLANE_DEBUG=1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from queueplane import __version__, durations, workflow
from queueplane.connection import ENV_BOOTSTRAP, ENV_KAFKA_CONFIG, named_target, resolve_target
from queueplane.errors import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_REFUSED,
    QueueplaneError,
    SpecInvalid,
    UsageError,
)
from queueplane.model import QueueSpec
from queueplane.plan import Plan
from queueplane.worker.runner import RunOptions

EPILOG = f"""\
exit codes: {EXIT_OK} ok, {EXIT_FAILED} the cluster or a tool failed, {EXIT_INVALID} invalid input \
(nothing changed), {EXIT_REFUSED} the plan holds refused changes (nothing changed).
cluster: --bootstrap-servers / --kafka-config, else ${ENV_BOOTSTRAP} / ${ENV_KAFKA_CONFIG}, \
else the running local stack (queueplane local up)."""

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("--bootstrap-servers", metavar="HOST:PORT[,...]", help="Kafka bootstrap servers")
    group.add_argument(
        "--kafka-config", metavar="FILE", help="librdkafka settings (key=value lines; SASL/SSL; ${ENV} references)"
    )


def _output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")


def _command(commands: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """A subcommand with the shared epilog (exit codes, how the cluster is chosen)."""
    return commands.add_parser(
        name, help=help, description=description, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queueplane",
        description="Kafka queues from YAML specs: validate, plan and apply topics and group configs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"queueplane {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = _command(
        commands,
        "validate",
        "check specs against the schema and the rules",
        "Check specs (files or directories). Offline, with Kafka's default "
        "share-group bounds, unless a cluster is named; then with its bounds.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH")
    _cluster_flags(p)
    _output_flag(p)

    p = _command(
        commands,
        "plan",
        "show what apply would change on the cluster",
        "Diff the specs against the live cluster: + create, ~ change, ! refused. Changes nothing.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH")
    _cluster_flags(p)
    _output_flag(p)

    p = _command(
        commands,
        "apply",
        "make the cluster match the specs",
        "Plan, show the plan, ask, then apply it. The cluster checks every "
        "request in a dry run first; a failure reports what was applied.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("-y", "--yes", action="store_true", help="apply without asking")
    _cluster_flags(p)
    _output_flag(p)

    p = _command(
        commands,
        "run",
        "run a queue's worker (Spark local mode here)",
        "Run the worker for one spec: Spark in local mode against the cluster (the local stack by "
        "default), until a stop condition, then print a summary.",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--local", action="store_true", default=True, help="Spark in local mode (the default here)")
    p.add_argument("--until-idle", metavar="DURATION", help="stop after this long without records, e.g. 10s")
    p.add_argument("--max-records", type=int, metavar="N", help="stop after N records ended accepted or in the DLQ")
    p.add_argument("--max-duration", metavar="DURATION", help="stop after this long in any case")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.add_argument(
        "--tasks",
        type=int,
        metavar="N",
        help="parallel Spark tasks per micro-batch (default: share groups, the spec's executor cores; "
        "else the machine's cores)",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="Spark checkpoint folder, kept across runs (default: a new temporary one; kmq: per group in the home)",
    )
    p.add_argument(
        "--max-batch-records",
        type=int,
        metavar="N",
        help="consumer and kmq groups: most records per micro-batch (consumer 50000, kmq maxInFlight per partition)",
    )
    _cluster_flags(p)
    _output_flag(p)

    p = _command(
        commands,
        "load",
        "produce a realistic test load into a queue's topic",
        "Produce JSON orders with ids (some poison, some slow) into the spec's topic.",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--count", type=int, required=True, metavar="N")
    p.add_argument("--keys", type=int, default=64, metavar="K", help="distinct keys (customers), default 64")
    p.add_argument("--poison-rate", type=float, default=0.0, metavar="R", help="share of records that are not JSON")
    p.add_argument("--slow-rate", type=float, default=0.0, metavar="R", help="share of records marked slow")
    p.add_argument("--seed", type=int, default=7)
    _cluster_flags(p)
    _output_flag(p)

    add_lag_command(commands)
    add_dlq_command(commands)
    p = _command(
        commands,
        "render",
        "render a queue's Helm release (values and Kubernetes manifests)",
        "Helm values from the spec, then `helm template` of charts/queue-worker; every object is checked "
        "against the Kubernetes API schema and the platform policy. Prints the manifests, or writes "
        "values.yaml and manifests.yaml to --output-dir.",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--output-dir", metavar="DIR", help="write values.yaml and manifests.yaml here")

    local = commands.add_parser(
        "local",
        help="the embedded local Kafka broker (127.0.0.1)",
        description="One real Apache Kafka broker on loopback with share groups "
        "enabled; state and logs under .queueplane/local/.",
    )
    local_cmds = local.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    local_cmds.add_parser("up", help="fetch the jars if needed, start the broker, print bootstrap.servers")
    down = local_cmds.add_parser("down", help="stop the broker")
    down.add_argument("--purge", action="store_true", help="also delete its data and logs")
    status = local_cmds.add_parser("status", help="show whether the broker runs, and where")
    _output_flag(status)
    kafka = local_cmds.add_parser(
        "kafka",
        help="run a Kafka CLI tool against the local broker",
        description="Run one of Kafka's own tools with --bootstrap-server set, e.g. "
        "`queueplane local kafka topics --describe`.",
    )
    kafka.add_argument(
        "tool",
        help="topics, configs, consumer-groups, share-groups, groups, features, "
        "console-consumer, console-share-consumer, console-producer",
    )
    kafka.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the tool")
    return parser


# -- rendering ---------------------------------------------------------------------------------

_STYLES = {"create": "green", "change": "yellow", "refuse": "red"}


def render_plan(plan: Plan, console: Console) -> None:
    console.print(f"Cluster: {plan.cluster}")
    if not plan.changes:
        console.print(f"No changes. The cluster matches {len(plan.specs)} spec(s).")
        return
    by_spec: dict[str, list] = {}
    for change in plan.changes:
        by_spec.setdefault(change.spec, []).append(change)
    kind_width = max(len(c.kind) for c in plan.changes)
    target_width = max(len(c.target) for c in plan.changes)
    for spec, changes in by_spec.items():
        console.print(f"\n[bold]{spec}[/bold]")
        for change in changes:
            style = _STYLES[change.action]
            line = f"{change.kind:<{kind_width}}  {change.target:<{target_width}}  {change.describe()}"
            console.print(f"  [{style}]{change.symbol}[/{style}] {escape(line)}")
    counts = plan.counts()
    console.print(f"\nPlan: {counts['create']} to create, {counts['change']} to change, {counts['refuse']} refused.")


def _print_problems(exc: SpecInvalid, output: str) -> None:
    if output == "json":
        out.print_json(json.dumps({"valid": False, "problems": [p.as_dict() for p in exc.problems]}))
    for problem in exc.problems:
        err.print(problem.render(), markup=False)
    err.print(f"{len(exc.problems)} problem(s); nothing was changed.", markup=False)


# -- commands ----------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    target = named_target(args.bootstrap_servers, args.kafka_config)
    queues = workflow.validate(args.paths, target)
    if args.output == "json":
        out.print_json(
            json.dumps(
                {
                    "valid": True,
                    "specs": [
                        {"file": q.source, "name": q.name, "team": q.team, "group": q.group.type} for q in queues
                    ],
                }
            )
        )
    else:
        bounds = f"bounds of {target.label}" if target else "Kafka's default share-group bounds"
        for q in queues:
            out.print(f"ok  {q.source}  {q.team}/{q.name} ({q.group.type})", markup=False)
        out.print(f"{len(queues)} spec(s) valid ({bounds}).", markup=False)
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    with err.status("reading the cluster"):
        planned = workflow.plan(args.paths, target)
    if args.output == "json":
        out.print_json(json.dumps(planned.plan.as_dict()))
    else:
        render_plan(planned.plan, out)
    return EXIT_REFUSED if planned.plan.refused else EXIT_OK


def cmd_apply(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    with err.status("reading the cluster"):
        planned = workflow.plan(args.paths, target)
    plan = planned.plan
    if args.output == "text":
        render_plan(plan, out)
    plan.raise_if_refused()
    if not plan.changes:
        if args.output == "json":
            out.print_json(json.dumps({"plan": plan.as_dict(), "applied": []}))
        return EXIT_OK
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("apply needs confirmation: run it in a terminal, or pass --yes")
        answer = err.input(f"Apply {len(plan.changes)} change(s) to {plan.cluster}? Only 'yes' applies: ")
        if answer.strip() != "yes":
            err.print("Apply cancelled; nothing was changed.")
            return EXIT_OK
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("applying", total=len(plan.changes))

        def on_step(title: str, count: int) -> None:
            progress.update(task, description=title, advance=count)

        report = workflow.apply(planned, on_step)
    if args.output == "json":
        out.print_json(json.dumps({"plan": plan.as_dict(), **report.as_dict()}))
    else:
        counts = plan.counts()
        out.print(f"Apply complete: {counts['create']} created, {counts['change']} changed.")
    return EXIT_OK


def cmd_local(args: argparse.Namespace) -> int:
    from queueplane.local.stack import LocalStack

    stack = LocalStack.default()
    if args.local_command == "up":
        with err.status("local Kafka") as status:
            state = stack.up(say=lambda message: status.update(f"local Kafka: {message}"))
        out.print(f"bootstrap.servers={state.bootstrap}", markup=False)
        return EXIT_OK
    if args.local_command == "down":
        stopped = stack.down(purge=args.purge)
        out.print("stopped" if stopped else "not running", markup=False)
        return EXIT_OK
    if args.local_command == "status":
        info = stack.status()
        if args.output == "json":
            out.print_json(json.dumps(info))
        else:
            for key, value in info.items():
                out.print(f"{key}: {value}", markup=False)
        return EXIT_OK if info["running"] else EXIT_FAILED
    command = stack.tool_command(args.tool, args.args)
    return subprocess.run(command).returncode


def _one_spec(path: str, target: object | None = None) -> QueueSpec:
    queues = workflow.validate([path], target)  # type: ignore[arg-type]
    if len(queues) != 1:
        raise UsageError(f"{path}: expected one spec file, found {len(queues)}")
    return queues[0]


def _duration_flag(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        return durations.parse_seconds(value)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def cmd_run(args: argparse.Namespace) -> int:
    from queueplane.worker.progress import run_with_progress

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    queue = _one_spec(args.spec, target)
    options = RunOptions(
        local=args.local,
        until_idle_s=_duration_flag(args.until_idle, "--until-idle"),
        max_records=args.max_records,
        max_duration_s=_duration_flag(args.max_duration, "--max-duration"),
        metrics_port=args.metrics_port,
        tasks=args.tasks,
        checkpoint_dir=args.checkpoint_dir,
        max_batch_records=args.max_batch_records,
    )
    show = args.output == "text" and err.is_terminal
    if not show:  # no progress bars: one log line per micro-batch instead
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)
    summary = run_with_progress(queue, target, options, err, show=show)
    if args.output == "json":
        out.print_json(json.dumps(summary.as_dict()))
    else:
        from queueplane.worker.progress import summary_table

        out.print(summary_table(summary))
    return EXIT_OK


def cmd_load(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from queueplane.load import produce_load

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    queue = _one_spec(args.spec)
    if args.count < 1 or args.keys < 1 or not (0 <= args.poison_rate <= 1) or not (0 <= args.slow_rate <= 1):
        raise UsageError("--count and --keys must be at least 1; rates lie between 0 and 1")
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task(f"producing to {queue.topic.name}", total=args.count)
        report = produce_load(
            target,
            queue.topic.name,
            args.count,
            args.keys,
            args.poison_rate,
            args.slow_rate,
            args.seed,
            on_progress=lambda n: progress.update(task, completed=n),
        )
    result = {"topic": report.topic, "count": report.count, "poison": report.poison, "slow": report.slow}
    if args.output == "json":
        out.print_json(json.dumps(result))
    else:
        out.print(f"produced {report.count} records to {report.topic} ({report.poison} poison, {report.slow} slow)")
    return EXIT_OK


# -- lag and dlq -------------------------------------------------------------------------------


def add_lag_command(commands: Any) -> None:
    p = _command(
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
    _cluster_flags(p)
    _output_flag(p)


def add_dlq_command(commands: Any) -> None:
    dlq_parser = commands.add_parser(
        "dlq",
        help="list or redrive a queue's dead-letter records",
        description="The dead-letter queue of any group type. Pending records are those after the "
        "position of the redrive group <group id>.dlq-redrive.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = dlq_parser.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    p = actions.add_parser("list", help="table of pending DLQ records with their error headers")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="show at most N records (50)")
    p.add_argument("--all", action="store_true", help="from the log start, already redriven records too")
    _cluster_flags(p)
    _output_flag(p)
    p = actions.add_parser(
        "redrive",
        help="move pending DLQ records back to their source topic",
        description="Move pending DLQ records back to the topic they came from, rate-limited, with the "
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
    _cluster_flags(p)
    _output_flag(p)


def _lag_table(queue: QueueSpec, rows: list[Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"{queue.name}: group {queue.group.id} ({queue.group.type}) on {queue.topic.name}")
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
    from queueplane.lag import total_lag

    total = total_lag({r.partition: r.lag for r in rows})
    table.add_section()
    table.add_row("total", "", "", "?" if total is None else str(total), "")
    return table


def cmd_lag(args: argparse.Namespace) -> int:
    import time

    from rich.live import Live

    from queueplane.lag import admin_client, flag_skew, key_sampler, queue_lag, total_lag

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    queue = _one_spec(args.spec, target)
    interval = _duration_flag(args.interval, "--interval") or 2.0
    admin = admin_client(target)

    def read() -> list[Any]:
        rows = queue_lag(target, queue, admin)
        flag_skew(rows, key_sampler(target, queue))
        return rows

    if not args.watch:
        rows = read()
        if args.output == "json":
            lags = {r.partition: r.lag for r in rows}
            out.print_json(json.dumps({"partitions": [r.as_dict() for r in rows], "total": total_lag(lags)}))
        else:
            out.print(_lag_table(queue, rows))
        return EXIT_OK
    try:
        with Live(_lag_table(queue, read()), console=out, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(_lag_table(queue, read()), refresh=True)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_dlq(args: argparse.Namespace) -> int:
    from queueplane import dlq_tools

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    queue = _one_spec(args.spec, target)
    if args.dlq_command == "list":
        if args.limit < 1:
            raise UsageError("--limit must be at least 1")
        with err.status(f"reading {queue.dead_letter.name}"):
            rows, pending = dlq_tools.list_dead_letters(target, queue, args.limit, args.all)
        if args.output == "json":
            out.print_json(
                json.dumps(
                    {"topic": queue.dead_letter.name, "pending": pending, "records": [r.as_dict() for r in rows]}
                )
            )
            return EXIT_OK
        _print_dead_letters(queue, rows, pending, args.all)
        return EXIT_OK
    if args.rate is not None and args.rate <= 0:
        raise UsageError("--rate must be a positive number of records a second")
    where = dlq_tools.parse_where(args.where)
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

        report = dlq_tools.redrive(target, queue, args.rate, where, on_progress)
    if args.output == "json":
        out.print_json(json.dumps(report.as_dict()))
    else:
        kept = f", {report.kept} not matching kept pending" if where else ""
        out.print(
            f"redrove {report.moved} record(s) from {report.dlq_topic} to {queue.topic.name}{kept}.", markup=False
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


def cmd_render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from queueplane.render import render

    queue = _one_spec(args.spec)
    with err.status(f"rendering {queue.name}"):
        rendered = render(queue, output_dir=Path(args.output_dir) if args.output_dir else None)
    if args.output_dir is None:
        out.print(rendered.manifests, markup=False, end="")
        return EXIT_OK
    kinds = ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in rendered.objects)
    out.print(f"release {rendered.release} in namespace {rendered.namespace}: {kinds}", markup=False)
    out.print(f"wrote {rendered.values_file} and {rendered.values_file.with_name('manifests.yaml')}", markup=False)
    out.print(
        f"install: helm upgrade --install {rendered.release} {rendered.chart} --namespace {rendered.namespace} "
        f"--create-namespace --values {rendered.values_file}",
        markup=False,
    )
    return EXIT_OK


COMMANDS = {
    "validate": cmd_validate,
    "plan": cmd_plan,
    "apply": cmd_apply,
    "run": cmd_run,
    "load": cmd_load,
    "lag": cmd_lag,
    "dlq": cmd_dlq,
    "render": cmd_render,
    "local": cmd_local,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except SpecInvalid as exc:
        _print_problems(exc, getattr(args, "output", "text"))
        return exc.exit_code
    except QueueplaneError as exc:
        err.print(f"error: {exc}", markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        return 130
    except Exception as exc:
        if os.environ.get("QUEUEPLANE_DEBUG"):
            raise
        err.print(
            f"internal error: {type(exc).__name__}: {exc}. Run again with QUEUEPLANE_DEBUG=1 for a "
            "traceback, and report it.",
            markup=False,
        )
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
