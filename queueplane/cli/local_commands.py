"""`queueplane local`: the embedded Kafka broker on 127.0.0.1 and Kafka's own tools against it."""

from __future__ import annotations

import argparse
import json
import subprocess
from typing import Any

from queueplane.cli.common import err, out, output_flag
from queueplane.errors import EXIT_FAILED, EXIT_OK


def register(commands: Any) -> None:
    local = commands.add_parser(
        "local",
        help="the embedded local Kafka broker (127.0.0.1)",
        description="One real Apache Kafka broker on loopback with share groups "
        "enabled; state and logs under .queueplane/local/.",
    )
    local_cmds = local.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    local_cmds.add_parser(
        "fetch",
        help="fetch and build everything queueplane needs ahead of time (Kafka and connector jars, helm, API schemas)",
    )
    local_cmds.add_parser("up", help="fetch the jars if needed, start the broker, print bootstrap.servers")
    down = local_cmds.add_parser("down", help="stop the broker")
    down.add_argument("--purge", action="store_true", help="also delete its data and logs")
    status = local_cmds.add_parser("status", help="show whether the broker runs, and where")
    output_flag(status)
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
    local.set_defaults(handler=cmd_local)


def cmd_local(args: argparse.Namespace) -> int:
    from queueplane.local.stack import LocalStack

    if args.local_command == "fetch":
        from queueplane.prefetch import fetch_all

        fetch_all(lambda line: err.print(line, markup=False))
        return EXIT_OK
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
