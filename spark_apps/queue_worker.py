"""spark-submit entrypoint of a worker application (the Helm chart runs this file).

    spark-submit [--master k8s://...] spark_apps/queue_worker.py --spec /etc/queueplane/spec/NAME.yaml [--spec ...]

Each --spec is a queue of the application: one driver runs a streaming query per queue, on one
executor pool sized by the sum of the queues' demands.

Kafka settings come from $QUEUEPLANE_KAFKA_CONFIG (a librdkafka properties file, mounted
from a Secret) or $QUEUEPLANE_BOOTSTRAP_SERVERS; metrics are served on --metrics-port.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from queueplane.errors import QueueplaneError, SpecInvalid, UsageError
from queueplane.kafka.lag import queue_backlog
from queueplane.kafka.target import named_target
from queueplane.ops.status import queue_reads
from queueplane.provision import steps
from queueplane.run.driver import QueueJob, run_application
from queueplane.run.options import STARTUP_WAIT_S, RunOptions
from queueplane.run.queue_status import InClusterStatusPatch
from queueplane.spec import durations


def _scaling(args: argparse.Namespace) -> dict[str, float]:
    overrides = {}
    try:
        if args.scale_interval:
            overrides["interval_s"] = durations.parse_seconds(args.scale_interval)
            overrides["up_cooldown_s"] = overrides["interval_s"]
        if args.scale_down_cooldown:
            overrides["down_cooldown_s"] = durations.parse_seconds(args.scale_down_cooldown)
    except ValueError as exc:
        raise UsageError(f"--scale-interval / --scale-down-cooldown: {exc}") from None
    return overrides


def _status_patch(resource: str) -> InClusterStatusPatch:
    try:
        return InClusterStatusPatch(resource)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="queue_worker", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--spec", required=True, action="append", help="a queue spec (YAML); repeat for each queue of the application"
    )
    parser.add_argument("--metrics-port", type=int, default=9404)
    parser.add_argument("--metrics-host", default="0.0.0.0")
    parser.add_argument("--local", action="store_true", help="Spark local mode instead of the submitted master")
    parser.add_argument("--until-idle", help="stop after this long without records (tests, contract runs)")
    parser.add_argument("--max-records", type=int)
    parser.add_argument("--checkpoint-dir", help="streaming checkpoint: a mounted volume path or an object-store URL")
    parser.add_argument("--max-batch-records", type=int, help="consumer and kmq groups: most records per micro-batch")
    parser.add_argument("--scale-interval", help="autoscaling decision interval (default 10s)")
    parser.add_argument("--scale-down-cooldown", help="wait after a change before scaling down (default 60s)")
    parser.add_argument("--event-log-dir", help="Spark event logs (for a history server): a path or object-store URL")
    parser.add_argument(
        "--status-namespace",
        metavar="NAMESPACE",
        help="report each queue's status to its Queue object (named after it) here, through the pod's service account",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    # py4j logs every call between Python and the JVM at INFO: the pod's log would be little else.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        target = named_target()
        if target is None:
            raise QueueplaneError("set QUEUEPLANE_BOOTSTRAP_SERVERS or QUEUEPLANE_KAFKA_CONFIG")
        queues = steps.validate(args.spec, target, wait_s=STARTUP_WAIT_S)
        options = RunOptions(
            local=args.local,
            until_idle_s=durations.parse_seconds(args.until_idle) if args.until_idle else None,
            max_records=args.max_records,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            checkpoint_dir=args.checkpoint_dir,
            max_batch_records=args.max_batch_records,
            scaling=_scaling(args),
            event_log_dir=args.event_log_dir,
        )
        jobs = [
            QueueJob(
                queue,
                backlog=queue_backlog(target, queue),
                reads=queue_reads(target, queue),
                status_patch=_status_patch(f"{args.status_namespace}/{queue.name}") if args.status_namespace else None,
            )
            for queue in queues
        ]
        summaries = run_application(jobs, target, options)
    except SpecInvalid as exc:
        for problem in exc.problems:
            print(problem.render(), file=sys.stderr)
        return exc.exit_code
    except QueueplaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    shown = [summary.as_dict() for summary in summaries]
    print(json.dumps(shown[0] if len(shown) == 1 else shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
