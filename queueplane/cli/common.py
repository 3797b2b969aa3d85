"""What every command shares: the consoles, the common flags, which cluster, which spec."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from queueplane.errors import EXIT_FAILED, EXIT_INVALID, EXIT_OK, EXIT_REFUSED, SpecInvalid, UsageError
from queueplane.kafka.target import ENV_BOOTSTRAP, ENV_KAFKA_CONFIG, KafkaTarget, named_target
from queueplane.provision import steps
from queueplane.spec import durations
from queueplane.spec.model import QueueSpec

EPILOG = f"""\
exit codes: {EXIT_OK} ok, {EXIT_FAILED} the cluster or a tool failed, {EXIT_INVALID} invalid input \
(nothing changed), {EXIT_REFUSED} the plan holds refused changes (nothing changed).
cluster: --bootstrap-servers / --kafka-config, else ${ENV_BOOTSTRAP} / ${ENV_KAFKA_CONFIG}, \
else the running local stack (queueplane local up)."""

# No emoji codes and no highlighting: specs, topic names and error messages are quoted as they
# are (rich would print ":x:" in a file's text as an emoji).
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def cluster_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("--bootstrap-servers", metavar="HOST:PORT[,...]", help="Kafka bootstrap servers")
    group.add_argument(
        "--kafka-config", metavar="FILE", help="librdkafka settings (key=value lines; SASL/SSL; ${ENV} references)"
    )


def output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")


def command(commands: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """A subcommand with the shared epilog (exit codes, how the cluster is chosen)."""
    return commands.add_parser(
        name, help=help, description=description, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def resolve_target(bootstrap_servers: str | None = None, kafka_config: str | None = None) -> KafkaTarget:
    """The cluster the user named, else the running local stack; UsageError says how to name one."""
    named = named_target(bootstrap_servers, kafka_config)
    if named is not None:
        return named
    from queueplane.local.stack import LocalStack

    state = LocalStack.default().running_state()
    if state is None:
        raise UsageError(
            "no Kafka cluster named and the local stack is not running: pass --bootstrap-servers or "
            f"--kafka-config, set {ENV_BOOTSTRAP}, or start one with `queueplane local up`"
        )
    return KafkaTarget({"bootstrap.servers": state.bootstrap}, f"{state.bootstrap} (local stack)", local=True)


def one_spec(path: str, target: KafkaTarget | None = None, wait_s: float = 0.0) -> QueueSpec:
    queues = steps.validate([path], target, wait_s)
    if len(queues) != 1:
        raise UsageError(f"{path}: expected one spec file, found {len(queues)}")
    return queues[0]


def duration_flag(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        return durations.parse_seconds(value)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def print_problems(exc: SpecInvalid, output: str) -> None:
    if output == "json":
        out.print_json(json.dumps({"valid": False, "problems": [p.as_dict() for p in exc.problems]}))
    for problem in exc.problems:
        err.print(problem.render(), markup=False)
    err.print(f"{len(exc.problems)} problem(s); nothing was changed.", markup=False)
