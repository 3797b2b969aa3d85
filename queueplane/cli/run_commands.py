"""Commands that run a queue: run (its worker on Spark; cli/worker_command.py) and load (a test load into its topic)."""

from __future__ import annotations

import argparse
from typing import Any

from queueplane.cli.common import cluster_flags, command, emit, err, one_spec, out, output_flag, resolve_target
from queueplane.cli.worker_command import WORKSTATION, add_worker_flags
from queueplane.errors import EXIT_OK, UsageError


def register(commands: Any) -> None:
    p = command(
        commands,
        "run",
        "run a queue's worker (Spark local mode here)",
        "Run the worker for one spec: Spark in local mode against the cluster (the local stack by "
        "default), until a stop condition, then print a summary. Several specs run as one worker "
        "application: one Spark driver and executor pool, a streaming query per queue, each queue "
        "with its own group, DLQ, metrics and stop condition. spark_apps/queue_worker.py, which "
        "spark-submit runs, takes the same flags.",
    )
    add_worker_flags(p, WORKSTATION)

    p = command(
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
    cluster_flags(p)
    output_flag(p)
    p.set_defaults(handler=cmd_load)


def cmd_load(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from queueplane.ops.load import produce_load

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    queue = one_spec(args.spec)
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
    if args.output != "text":
        emit(args.output, result)
    else:
        out.print(f"produced {report.count} records to {report.topic} ({report.poison} poison, {report.slow} slow)")
    return EXIT_OK
