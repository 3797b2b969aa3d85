"""Commands on a worker application's Helm release: render (values and manifests, checked) and deploy
(helm upgrade). An application is one spec, or several that name the same spec.deployment.application."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from queueplane.cli.common import command, duration_flag, err, kube_flags, out
from queueplane.deploy.cluster_values import from_flags
from queueplane.errors import EXIT_OK
from queueplane.provision import steps


def register(commands: Any) -> None:
    p = command(
        commands,
        "render",
        "render a worker application's Helm release (values and Kubernetes manifests)",
        "Helm values from the specs of one application (one spec, or all that name the same "
        "spec.deployment.application), then `helm template` of charts/queue-worker; every object is checked "
        "against the Kubernetes API schema and the platform policy. Prints the manifests, or writes "
        "values.yaml and manifests.yaml to --output-dir. No cluster is asked: the same specs and values give "
        "the same manifests; --api-versions says what the target cluster serves beyond Kubernetes' own.",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC")
    p.add_argument("--output-dir", metavar="DIR", help="write values.yaml and manifests.yaml here")
    p.add_argument(
        "--api-versions",
        action="append",
        default=[],
        metavar="GROUP/VERSION/KIND",
        help="a kind the target cluster serves, as helm template's --api-versions (e.g. "
        "monitoring.coreos.com/v1/PodMonitor, monitoring.coreos.com/v1/PrometheusRule: the chart's PodMonitor "
        "and PrometheusRule render only where named); repeatable",
    )
    _values_flag(p)
    p.set_defaults(handler=cmd_render)

    p = command(
        commands,
        "deploy",
        "install or upgrade a worker application with Helm",
        "Render the release as `render` does (every object checked), then `helm upgrade --install "
        "--rollback-on-failure --wait`: a failed upgrade rolls back (a share queue's old worker runs on "
        "meanwhile). Give every spec of the application: the release runs exactly the queues given. The cluster "
        "is --kubeconfig (else $KUBECONFIG, else ~/.kube/config); the Airflow deploy task does the same.",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC")
    kube_flags(p, "kubeconfig of the cluster")
    _values_flag(p)
    p.add_argument("--timeout", default="10m", metavar="DURATION", help="how long helm waits for the worker (10m)")
    p.add_argument("--dry-run", action="store_true", help="render and check, print the helm command, change nothing")
    p.set_defaults(handler=cmd_deploy)


def _values_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--values",
        action="append",
        default=[],
        metavar="FILE",
        help="cluster values (YAML) over the spec's: kafka secrets, checkpoint volume, pull secrets, image; repeatable",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one cluster value over the --values files, as helm's --set (e.g. image.tag=1.2.3); repeatable",
    )


def cmd_render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from queueplane.deploy.render import left_out_note, render

    queues = steps.validate(args.specs)
    with err.status(f"rendering {queues[0].application}"):
        rendered = render(
            queues,
            output_dir=Path(args.output_dir) if args.output_dir else None,
            overrides=from_flags(args.values, args.set),
            api_versions=args.api_versions,
        )
    if rendered.left_out:
        err.print(left_out_note(rendered.left_out), markup=False)
    if args.output_dir is None:
        out.print(rendered.manifests, markup=False, end="")
        return EXIT_OK
    kinds = ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in rendered.objects)
    out.print(f"release {rendered.release} in namespace {rendered.namespace}: {kinds}", markup=False)
    out.print(f"wrote {rendered.values_file} and {rendered.values_file.with_name('manifests.yaml')}", markup=False)
    out.print(
        f"install: helm upgrade --install {rendered.release} {rendered.chart} --namespace {rendered.namespace} "
        f"--values {rendered.values_file} (or queueplane deploy, which also checks the release is this application's "
        "and creates a missing namespace with Pod Security restricted)",
        markup=False,
    )
    return EXIT_OK


def cmd_deploy(args: argparse.Namespace) -> int:
    from queueplane.deploy import release
    from queueplane.deploy.kube_access import KubeAccess, default_kubeconfig
    from queueplane.deploy.render import render

    queues = steps.validate(args.specs)
    timeout_s = int(duration_flag(args.timeout, "--timeout") or release.HELM_TIMEOUT_S)
    access = KubeAccess(args.kubeconfig or default_kubeconfig(), args.context, in_cluster=False)
    with tempfile.TemporaryDirectory(prefix="queueplane-deploy-") as folder:
        with err.status(f"rendering {queues[0].application}"):
            rendered = render(queues, output_dir=Path(folder), overrides=from_flags(args.values, args.set))
        if args.dry_run:
            argv = " ".join(["helm", *release.upgrade_args(rendered, access, timeout_s)])
            out.print(f"dry run: release {rendered.release} rendered and checked; would run: {argv}", markup=False)
            return EXIT_OK
        with err.status(f"helm upgrade --install {rendered.release} (namespace {rendered.namespace})"):
            output = release.upgrade(queues[0].source, rendered, access, timeout_s)
    out.print(output, markup=False, end="")
    return EXIT_OK
