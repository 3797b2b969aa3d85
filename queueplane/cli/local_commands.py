"""`queueplane local`: the embedded Kafka broker on 127.0.0.1 and Kafka's own tools against it."""

from __future__ import annotations

import argparse
import subprocess
from typing import Any

from queueplane.cli.common import emit, err, out, output_flag
from queueplane.errors import EXIT_FAILED, EXIT_OK


def register(commands: Any) -> None:
    local = commands.add_parser(
        "local",
        help="the embedded local Kafka broker (127.0.0.1)",
        description="One real Apache Kafka broker on loopback with share groups "
        "enabled; state and logs under .queueplane/local/.",
    )
    local_cmds = local.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    fetch = local_cmds.add_parser(
        "fetch",
        help="fetch and build ahead of time what a target needs (Kafka and connector jars, helm, the local cluster)",
        description="Fetch or build, into ~/.cache/queueplane ($QUEUEPLANE_CACHE), what one target uses: "
        "demo (Kafka's jars, Spark's Kafka connector), kubernetes (also the local cluster, helm, the worker "
        "image), check (the tests but the local cluster's) or test (everything).",
    )
    # The tiers are queueplane.prefetch.TIERS, spelt out here: the CLI imports nothing it does not run.
    fetch.add_argument(
        "--for",
        dest="tier",
        choices=("demo", "kubernetes", "check", "test"),
        default="test",
        help="the target to fetch for (default: test, everything)",
    )
    up = local_cmds.add_parser("up", help="fetch the jars if needed, start the broker, print bootstrap.servers")
    up.add_argument(
        "--secure",
        action="store_true",
        help="also a SASL_SSL listener (SCRAM-SHA-512 over TLS, a local CA) and the StandardAuthorizer; "
        "prints a client properties file for its super user",
    )
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
    _register_kubernetes(local_cmds)
    local.set_defaults(handler=cmd_local)


def _register_kubernetes(local_cmds: Any) -> None:
    kube = local_cmds.add_parser(
        "kubernetes",
        help="a real single-node Kubernetes on this machine, to deploy workers to with Helm",
        description="Kubernetes built from Go modules, containerd and runc from Debian, the worker "
        "image built here; the admin kubeconfig is written to .queueplane/local/kubeconfig.",
    )
    actions = kube.add_subparsers(dest="kubernetes_command", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start the cluster (and import the worker image), print the kubeconfig path")
    up.add_argument("--no-worker-image", action="store_true", help="do not build or import the queue worker image")
    down = actions.add_parser("down", help="stop the cluster and every pod")
    down.add_argument("--purge", action="store_true", help="also delete its state, certificates and network rules")
    status = actions.add_parser("status", help="show whether the cluster runs, its daemons and memory")
    output_flag(status)
    kubectl = actions.add_parser(
        "kubectl",
        help="kubectl of the cluster's version with its kubeconfig (queueplane local kubernetes kubectl get pods -A)",
    )
    kubectl.add_argument("args", nargs=argparse.REMAINDER, help="arguments for kubectl")


def cmd_local(args: argparse.Namespace) -> int:
    from queueplane.local.stack import LocalStack

    if args.local_command == "fetch":
        from queueplane.prefetch import fetch_all

        fetch_all(lambda line: err.print(line, markup=False), tier=args.tier)
        return EXIT_OK
    if args.local_command == "kubernetes":
        return _cmd_kubernetes(args)
    stack = LocalStack.default()
    if args.local_command == "up":
        stack.secure = args.secure
        with err.status("local Kafka") as status:
            state = stack.up(say=lambda message: status.update(f"local Kafka: {message}"))
        out.print(f"bootstrap.servers={state.bootstrap}", markup=False)
        if args.secure:
            properties = stack.tls_dir / "admin.properties"
            settings = stack.secure_settings()
            properties.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
            properties.chmod(0o600)
            out.print(f"SASL_SSL: --kafka-config {properties}", markup=False)
        return EXIT_OK
    if args.local_command == "down":
        stopped = stack.down(purge=args.purge)
        out.print("stopped" if stopped else "not running", markup=False)
        return EXIT_OK
    if args.local_command == "status":
        info = stack.status()
        if args.output != "text":
            emit(args.output, info)
        else:
            for key, value in info.items():
                out.print(f"{key}: {value}", markup=False)
        return EXIT_OK if info["running"] else EXIT_FAILED
    command = stack.tool_command(args.tool, args.args)
    return subprocess.run(command).returncode


def _cmd_kubernetes(args: argparse.Namespace) -> int:
    from queueplane.local.kubernetes.cluster import LocalKubernetes

    cluster = LocalKubernetes()
    action = args.kubernetes_command
    if action == "up":
        from queueplane.local.kubernetes import images
        from queueplane.local.kubernetes.values import write_local_values
        from queueplane.local.stack import LocalStack

        with err.status("local Kubernetes") as status:
            info = cluster.up(
                say=lambda message: status.update(f"local Kubernetes: {message}"),
                worker_image=not args.no_worker_image,
            )
            # The broker listens on the node address too once the cluster's bridge exists.
            kafka = LocalStack.default().up(say=lambda message: status.update(f"local Kafka: {message}"), pods=True)
        out.print(f"KUBECONFIG={info['kubeconfig']}", markup=False)
        if not args.no_worker_image and kafka.pod_bootstrap:
            path = write_local_values(
                cluster.home / "cluster-values.yaml", images.worker_image().reference, kafka.pod_bootstrap
            )
            out.print(f"cluster values for `queueplane deploy --values`: {path}", markup=False)
        return EXIT_OK
    if action == "down":
        stopped = cluster.down(purge=args.purge)
        out.print("stopped" if stopped else "not running", markup=False)
        return EXIT_OK
    if action == "kubectl":
        return subprocess.run(cluster.kubectl_command(*args.args)).returncode
    info = cluster.status()
    if args.output != "text":
        emit(args.output, info)
    else:
        for key, value in info.items():
            out.print(f"{key}: {value}", markup=False)
    return EXIT_OK if info["running"] else EXIT_FAILED
