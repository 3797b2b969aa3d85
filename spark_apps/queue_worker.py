"""spark-submit entrypoint of a worker application (the Helm chart's driver pod runs this file).

    spark-submit [--master k8s://...] spark_apps/queue_worker.py --spec /etc/queueplane/spec/NAME.yaml [--spec ...]

Each spec is a queue of the application: one driver runs a streaming query per queue, on one
executor pool sized by the sum of the queues' demands. It takes the flags of `queueplane run`,
with the defaults of a driver on a cluster: Spark on the submitted master (--local for local
mode), metrics and probes on 0.0.0.0:9404, the summary as one line of JSON.

Kafka settings come from --kafka-config or $QUEUEPLANE_KAFKA_CONFIG (a librdkafka properties
file, mounted from a Secret), or --bootstrap-servers or $QUEUEPLANE_BOOTSTRAP_SERVERS.
"""

from __future__ import annotations

import argparse
import sys

from queueplane.cli.app import run_command
from queueplane.cli.worker_command import submitted_parser


def parser() -> argparse.ArgumentParser:
    return submitted_parser(__doc__ or "")


def main(argv: list[str] | None = None) -> int:
    return run_command(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
