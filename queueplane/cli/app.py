"""The `queueplane` command line: validate, plan, apply, run, and the embedded local stack.

It reads like terraform and kubectl: `plan` shows exactly what `apply` will change,
`apply` shows the plan and asks before changing anything. Errors are one paragraph on
stderr with an exit code (see queueplane.errors); a traceback only with QUEUEPLANE_DEBUG=1.
Each command group registers its own parser and handler (``*_commands.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from confluent_kafka import KafkaException

from queueplane import __version__
from queueplane.cli import deploy_commands, local_commands, ops_commands, run_commands, spec_commands, try_command
from queueplane.cli.common import EPILOG, NO_COLOR_HELP, emit_error, err, no_color, print_error, print_problems
from queueplane.errors import EXIT_FAILED, EXIT_OK, QueueplaneError, SpecInvalid
from queueplane.kafka.cluster import refusal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queueplane",
        description="Kafka queues from YAML specs: validate, plan and apply topics and group configs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"queueplane {__version__}")
    parser.add_argument("--no-color", action="store_true", help=NO_COLOR_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in (spec_commands, deploy_commands, run_commands, try_command, ops_commands, local_commands):
        group.register(commands)
    completion = commands.add_parser(
        "completion",
        help="print the shell completion script (bash or zsh)",
        description="Completion of commands, flags and spec paths, made from this parser. bash: "
        '`source <(queueplane completion bash)`; zsh: `queueplane completion zsh > "${fpath[1]}/_queueplane"`.',
    )
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(handler=lambda args: _print_completion(parser, args.shell))
    _flag_on_every_command(parser)
    return parser


SHELLS = ("bash", "zsh")
# Arguments that name files or folders complete as paths; the rest complete from the parser.
_PATH_METAVARS = {"PATH": "file", "SPEC": "file", "FILE": "file", "DIR": "directory"}


def _print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    import shtab

    kinds = {"file": shtab.FILE, "directory": shtab.DIRECTORY}

    for node in (parser, *_subparsers(parser)):
        for action in node._actions:
            kind = _PATH_METAVARS.get(str(action.metavar))
            if kind is not None:
                action.complete = kinds[kind]  # type: ignore[attr-defined]
    sys.stdout.write(shtab.complete(parser, shell=shell))
    return EXIT_OK


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command's parser below ``parser``, at any depth (`local kubernetes status` too)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += [sub, *_subparsers(sub)]
    return found


def _flag_on_every_command(parser: argparse.ArgumentParser) -> None:
    """--no-color after the command too (`queueplane plan specs --no-color`), as terraform takes it."""
    for sub in _subparsers(parser):
        sub.add_argument("--no-color", action="store_true", default=argparse.SUPPRESS, help=NO_COLOR_HELP)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command's handler; its errors end as one paragraph and an exit code.

    spark_apps/queue_worker.py comes here too, with its own parser (cli/worker_command.py).
    """
    if args.no_color:
        no_color()
    output = getattr(args, "output", "text")
    try:
        return args.handler(args)
    except SpecInvalid as exc:
        print_problems(exc, output)
        return exc.exit_code
    except QueueplaneError as exc:
        print_error(exc, output)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        return 130
    except KafkaException as exc:
        refused = refusal(exc)
        if refused is None:
            return _internal_error(exc, output)
        print_error(refused, output)
        return refused.exit_code
    except Exception as exc:
        return _internal_error(exc, output)


def _internal_error(exc: Exception, output: str) -> int:
    if os.environ.get("QUEUEPLANE_DEBUG"):
        raise exc
    emit_error(output, "InternalError", EXIT_FAILED, str(exc))
    err.print(
        f"internal error: {type(exc).__name__}: {exc}. Run again with QUEUEPLANE_DEBUG=1 for a "
        "traceback, and report it.",
        markup=False,
    )
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
