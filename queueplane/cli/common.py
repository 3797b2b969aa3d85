"""What every command shares: the consoles, the common flags, which cluster, which spec."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml
from rich.console import Console

from queueplane.errors import (
    EXIT_CHANGES,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_REFUSED,
    QueueplaneError,
    SpecInvalid,
    UsageError,
)
from queueplane.kafka.target import ENV_BOOTSTRAP, ENV_KAFKA_CONFIG, KafkaTarget, named_target
from queueplane.provision import steps
from queueplane.spec import durations
from queueplane.spec.model import QueueSpec

NO_COLOR_HELP = "plain text, no colours (as $NO_COLOR)"
EPILOG = f"""\
exit codes: {EXIT_OK} ok, {EXIT_FAILED} the cluster or a tool failed, {EXIT_INVALID} invalid input \
(nothing changed), {EXIT_REFUSED} the plan holds refused changes (nothing changed), {EXIT_CHANGES} \
changes to make (plan --detailed-exitcode).
output: -o json|yaml prints data, and errors as an object ({{"error": ...}}), on stdout; text goes to \
a terminal in colour unless --no-color or $NO_COLOR.
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


OUTPUTS = ("text", "json", "yaml")


def output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=OUTPUTS, default="text", help="output format")


def emit(output: str, data: Any) -> None:
    """Data for scripts on stdout, as JSON or YAML: the same object either way."""
    if output == "yaml":
        out.print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), markup=False, end="")
    else:
        out.print_json(json.dumps(data))


def no_color() -> None:
    """--no-color: plain text on both consoles ($NO_COLOR is honoured by rich itself)."""
    out.no_color = err.no_color = True


def emit_error(output: str, kind: str, exit_code: int, message: str) -> None:
    """Under -o json|yaml, the error as an object on stdout for scripts (people read stderr)."""
    if output in ("json", "yaml"):
        emit(output, {"error": {"kind": kind, "exit_code": exit_code, "message": message}})


def print_error(exc: QueueplaneError, output: str) -> None:
    """One paragraph on stderr, and the error object under -o json|yaml."""
    emit_error(output, type(exc).__name__, exc.exit_code, str(exc))
    err.print(f"error: {exc}", markup=False)


def kube_flags(parser: argparse.ArgumentParser, kubeconfig_help: str) -> None:
    """The cluster a command reaches with helm and the Kubernetes API, as kubectl names it."""
    parser.add_argument("--kubeconfig", metavar="FILE", help=kubeconfig_help)
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")


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
    if output in ("json", "yaml"):
        emit(output, {"valid": False, "problems": [p.as_dict() for p in exc.problems]})
    for problem in exc.problems:
        err.print(problem.render(), markup=False)
    err.print(f"{len(exc.problems)} problem(s); nothing was changed.", markup=False)
