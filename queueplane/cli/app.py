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

from queueplane import __version__
from queueplane.cli import deploy_commands, local_commands, ops_commands, run_commands, spec_commands
from queueplane.cli.common import EPILOG, err, print_problems
from queueplane.errors import EXIT_FAILED, QueueplaneError, SpecInvalid


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queueplane",
        description="Kafka queues from YAML specs: validate, plan and apply topics and group configs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"queueplane {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in (spec_commands, deploy_commands, run_commands, ops_commands, local_commands):
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except SpecInvalid as exc:
        print_problems(exc, getattr(args, "output", "text"))
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
