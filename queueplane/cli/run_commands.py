"""Commands that run a queue: run (its worker on Spark) and load (a test load into its topic)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from queueplane.cli.common import (
    cluster_flags,
    command,
    duration_flag,
    emit,
    err,
    one_spec,
    out,
    output_flag,
    resolve_target,
)
from queueplane.errors import EXIT_OK, UsageError
from queueplane.provision import steps
from queueplane.run.options import STARTUP_WAIT_S, RunOptions


def register(commands: Any) -> None:
    p = command(
        commands,
        "run",
        "run a queue's worker (Spark local mode here)",
        "Run the worker for one spec: Spark in local mode against the cluster (the local stack by "
        "default), until a stop condition, then print a summary. Several specs run as one worker "
        "application: one Spark driver and executor pool, a streaming query per queue, each queue "
        "with its own group, DLQ, metrics and stop condition.",
    )
    p.add_argument("spec", metavar="SPEC", nargs="+")
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
    p.add_argument(
        "--event-log-dir",
        metavar="DIR",
        help="write Spark event logs here (a folder or an object-store URL), for a Spark history server",
    )
    cluster_flags(p)
    output_flag(p)
    p.set_defaults(handler=cmd_run)

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


def cmd_run(args: argparse.Namespace) -> int:
    try:
        from queueplane.cli.run_progress import run_with_progress
    except ImportError as exc:  # the core install has no Spark runtime
        raise UsageError(
            f"queueplane run needs the worker extra ({exc.name} is not installed): pip install 'queueplane[worker]'"
        ) from None

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    if len(args.spec) == 1:
        queues = [one_spec(args.spec[0], target, wait_s=STARTUP_WAIT_S)]
    else:
        queues = steps.validate(args.spec, target, STARTUP_WAIT_S)
    options = RunOptions(
        local=args.local,
        until_idle_s=duration_flag(args.until_idle, "--until-idle"),
        max_records=args.max_records,
        max_duration_s=duration_flag(args.max_duration, "--max-duration"),
        metrics_port=args.metrics_port,
        tasks=args.tasks,
        checkpoint_dir=args.checkpoint_dir,
        max_batch_records=args.max_batch_records,
        event_log_dir=args.event_log_dir,
    )
    # Progress bars for one queue; several log a line per micro-batch, each with its queue's name.
    show = args.output == "text" and err.is_terminal and len(queues) == 1
    if not show:  # no progress bars: one log line per micro-batch instead
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)
    if len(queues) == 1:
        summaries = [run_with_progress(queues[0], target, options, err, show=show)]
    else:
        from queueplane.cli.run_progress import run_application_of

        summaries = run_application_of(queues, target, options)
    if args.output != "text":
        documents = [summary.as_dict() for summary in summaries]
        emit(args.output, documents[0] if len(documents) == 1 else documents)
    else:
        from queueplane.cli.run_progress import summary_table

        for summary in summaries:
            out.print(summary_table(summary))
    return EXIT_OK


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
