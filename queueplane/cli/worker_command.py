"""The worker's command line, written once: its flags, the RunOptions they make, and the run.

Two commands start a worker application: `queueplane run` (a person, Spark in local mode) and
spark_apps/queue_worker.py (spark-submit: the chart's driver pod, a Spark cluster). Both build
their parser with ``add_worker_flags`` and run with ``run_worker``, so each flag exists in both
with one meaning. The few defaults that follow from where the command runs are a ``Place``,
and each of those flags' help names both defaults:

- ``--local/--no-local``: local mode at a workstation, the submitted master under spark-submit;
- ``--metrics-port`` and ``--metrics-host``: nothing served unless asked, on 127.0.0.1, at a
  workstation; 0.0.0.0:9404 in a pod, where Prometheus and the kubelet's probes ask;
- ``-o``: a table for a person, JSON for a pod's log;
- with no cluster named, `queueplane run` uses the running local stack; the entrypoint never
  guesses a cluster (queueplane.kafka.target.named_target).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from queueplane.cli.common import NO_COLOR_HELP, OUTPUTS, cluster_flags, duration_flag, emit, err, out, resolve_target
from queueplane.errors import UsageError
from queueplane.kafka.target import ENV_BOOTSTRAP, ENV_KAFKA_CONFIG, KafkaTarget, named_target
from queueplane.provision import steps
from queueplane.run.driver.options import STARTUP_WAIT_S, RunOptions, RunSummary

if TYPE_CHECKING:
    from queueplane.run.driver.application import QueueJob
    from queueplane.spec.model import QueueSpec

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class Place:
    """Where a worker command runs: the defaults that follow from it. Every other default is shared."""

    local: bool  # Spark in local mode, else on the master spark-submit was given
    metrics_port: int | None
    metrics_host: str
    output: str
    guess_local_stack: bool  # with no cluster named, use the running local stack (a workstation only)


WORKSTATION = Place(local=True, metrics_port=None, metrics_host="127.0.0.1", output="text", guess_local_stack=True)
SUBMITTED = Place(local=False, metrics_port=9404, metrics_host="0.0.0.0", output="json", guess_local_stack=False)


def add_worker_flags(parser: argparse.ArgumentParser, place: Place) -> None:
    """Every flag a worker takes, with ``place``'s defaults."""
    parser.add_argument(
        "spec", metavar="SPEC", nargs="*", help="a queue spec (YAML); several run as one worker application"
    )
    parser.add_argument(
        "--spec",
        dest="spec_flags",
        metavar="SPEC",
        action="append",
        default=[],
        help="a queue spec, as SPEC (repeat for each queue; the chart's form)",
    )
    parser.add_argument(
        "--local",
        action=argparse.BooleanOptionalAction,
        default=place.local,
        help="Spark in local mode, in this process's JVM; --no-local: on the master Spark was given (spark-submit "
        "--master, or $PYSPARK_SUBMIT_ARGS) (default: local with `queueplane run`, the submitted master with "
        "spark_apps/queue_worker.py)",
    )
    stop = parser.add_argument_group("when to stop (default: on SIGTERM or SIGINT, after draining)")
    stop.add_argument("--until-idle", metavar="DURATION", help="stop after this long without records, e.g. 10s")
    stop.add_argument("--max-records", metavar="N", help="stop after N records ended accepted or in the DLQ")
    stop.add_argument("--max-duration", metavar="DURATION", help="stop after this long in any case, e.g. 30m")
    metrics = parser.add_argument_group("metrics, health probes and status")
    metrics.add_argument(
        "--metrics-port",
        metavar="PORT",
        default=None if place.metrics_port is None else str(place.metrics_port),
        help="serve Prometheus metrics, /livez and /readyz on PORT (default: none with `queueplane run`, "
        "9404 with spark_apps/queue_worker.py)",
    )
    metrics.add_argument(
        "--metrics-host",
        metavar="ADDRESS",
        default=place.metrics_host,
        help="the address to serve them on (default: 127.0.0.1 with `queueplane run`; 0.0.0.0 with "
        "spark_apps/queue_worker.py, for Prometheus and the probes)",
    )
    metrics.add_argument(
        "--status-namespace",
        metavar="NAMESPACE",
        help="in a pod: report each queue's status to its Queue object (named after it) in NAMESPACE, "
        "through the pod's service account",
    )
    spark = parser.add_argument_group("Spark")
    spark.add_argument(
        "--tasks",
        metavar="N",
        help="parallel Spark tasks per micro-batch (default: share groups, the spec's executor cores; "
        "else the machine's cores)",
    )
    spark.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="Spark checkpoint folder, kept across runs: a path or an object-store URL (default: a new "
        "temporary one; kmq: per group in the home)",
    )
    spark.add_argument(
        "--max-batch-records",
        metavar="N",
        help="consumer and kmq groups: most records per micro-batch (consumer 50000, kmq maxInFlight per partition)",
    )
    spark.add_argument(
        "--event-log-dir",
        metavar="DIR",
        help="write Spark event logs here (a folder or an object-store URL), for a Spark history server",
    )
    scaling = parser.add_argument_group("autoscaling (on a cluster; the spec sets the bounds and the target)")
    scaling.add_argument(
        "--scale-interval",
        metavar="DURATION",
        help="how often the controller decides, and the wait after a change before scaling up (default 10s)",
    )
    scaling.add_argument(
        "--scale-down-cooldown", metavar="DURATION", help="the wait after a change before scaling down (default 60s)"
    )
    cluster_flags(parser)
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default=place.output,
        help="the summary's format (default: text with `queueplane run`, json with spark_apps/queue_worker.py)",
    )
    parser.set_defaults(handler=lambda args: run_worker(args, place))


def run_options(args: argparse.Namespace) -> RunOptions:
    """The flags as RunOptions; a bad value is a UsageError naming its flag."""
    scaling: dict[str, float] = {}
    interval_s = duration_flag(args.scale_interval, "--scale-interval")
    if interval_s is not None:
        if interval_s <= 0:
            raise UsageError("--scale-interval: must be longer than 0s")
        scaling["interval_s"] = scaling["up_cooldown_s"] = interval_s
    cooldown_s = duration_flag(args.scale_down_cooldown, "--scale-down-cooldown")
    if cooldown_s is not None:
        scaling["down_cooldown_s"] = cooldown_s
    return RunOptions(
        local=args.local,
        until_idle_s=duration_flag(args.until_idle, "--until-idle"),
        max_records=count_flag(args.max_records, "--max-records"),
        max_duration_s=duration_flag(args.max_duration, "--max-duration"),
        metrics_port=count_flag(args.metrics_port, "--metrics-port", most=65535),
        metrics_host=args.metrics_host,
        tasks=count_flag(args.tasks, "--tasks"),
        checkpoint_dir=args.checkpoint_dir,
        max_batch_records=count_flag(args.max_batch_records, "--max-batch-records"),
        scaling=scaling,
        event_log_dir=args.event_log_dir,
    )


def count_flag(value: str | None, flag: str, most: int | None = None) -> int | None:
    """A whole number of at least 1 (and at most ``most``), or None when the flag is not given."""
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1 or (most is not None and number > most):
        bounds = "a whole number of at least 1" if most is None else f"a whole number from 1 to {most}"
        raise UsageError(f"{flag}: {value!r} is not {bounds}")
    return number


def spec_paths(args: argparse.Namespace) -> list[str]:
    paths = [*args.spec, *args.spec_flags]
    if not paths:
        raise UsageError("name the queue specs to run: SPEC ... or --spec SPEC")
    return paths


def status_namespace(args: argparse.Namespace) -> str | None:
    namespace = args.status_namespace
    if namespace is not None and (not namespace or "/" in namespace):
        raise UsageError(f"--status-namespace: {namespace!r} is not a namespace name")
    return namespace


def target_of(args: argparse.Namespace, place: Place) -> KafkaTarget:
    if place.guess_local_stack:
        return resolve_target(args.bootstrap_servers, args.kafka_config)
    target = named_target(args.bootstrap_servers, args.kafka_config)
    if target is None:
        raise UsageError(
            f"no Kafka cluster named: pass --bootstrap-servers or --kafka-config, or set {ENV_BOOTSTRAP} "
            f"or {ENV_KAFKA_CONFIG}"
        )
    return target


def run_worker(args: argparse.Namespace, place: Place) -> int:
    """Run the named queues as one worker application until each one's stop condition; print what they did."""
    # Every flag is read before anything connects: a bad one is said at once.
    options = run_options(args)
    paths, namespace = spec_paths(args), status_namespace(args)
    try:
        from queueplane.cli.run_progress import run_with_progress
        from queueplane.run.driver.application import run_application
    except ImportError as exc:  # the core install has no Spark runtime
        raise UsageError(
            f"the worker needs the worker extra ({exc.name} is not installed): pip install 'queueplane[worker]'"
        ) from None
    target = target_of(args, place)
    queues = steps.validate(paths, target, wait_s=STARTUP_WAIT_S)
    jobs = [_job(queue, target, options, namespace) for queue in queues]
    # Progress bars for one queue on a terminal; otherwise a log line per micro-batch, each with its queue's name.
    show = args.output == "text" and err.is_terminal and len(jobs) == 1
    if not show:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT, force=True)
        # py4j logs every call between Python and the JVM at INFO: the log would be little else.
        logging.getLogger("py4j").setLevel(logging.WARNING)
    summaries = run_with_progress(jobs[0], target, options, err) if show else run_application(jobs, target, options)
    _print(summaries, args.output)
    return 0


def _job(queue: QueueSpec, target: KafkaTarget, options: RunOptions, namespace: str | None) -> QueueJob:
    from queueplane.kafka.lag import queue_backlog
    from queueplane.ops.status import queue_reads
    from queueplane.run.driver.application import QueueJob
    from queueplane.run.driver.queue_status import InClusterStatusPatch

    watched = options.metrics_port is not None or namespace is not None  # gauges or a status read them
    return QueueJob(
        queue,
        backlog=queue_backlog(target, queue),
        reads=queue_reads(target, queue) if watched else None,
        status_patch=InClusterStatusPatch(f"{namespace}/{queue.name}") if namespace is not None else None,
    )


def _print(summaries: list[RunSummary], output: str) -> None:
    if output == "text":
        from queueplane.cli.run_progress import summary_table

        for summary in summaries:
            out.print(summary_table(summary))
        return
    documents = [summary.as_dict() for summary in summaries]
    data = documents[0] if len(documents) == 1 else documents
    if output == "json":  # one line: a pod's log keeps it whole, and scripts read it as one document
        print(json.dumps(data), flush=True)
    else:
        emit(output, data)


def submitted_parser(description: str) -> argparse.ArgumentParser:
    """The parser of spark_apps/queue_worker.py: `queueplane run`'s flags, with SUBMITTED's defaults."""
    parser = argparse.ArgumentParser(
        prog="queue_worker.py", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_worker_flags(parser, SUBMITTED)
    parser.add_argument("--no-color", action="store_true", help=NO_COLOR_HELP)
    return parser
