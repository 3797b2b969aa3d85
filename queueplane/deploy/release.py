"""A worker application's Helm release on a cluster: install or upgrade it, ask whether its worker
is up, and uninstall it when its queues' specs are removed.

The command line (`queueplane deploy`, `queueplane apply`) and the Airflow deploy task,
readiness sensor and removal task all come here, so the helm invocations and the readiness
rule exist once.
"""

from __future__ import annotations

import os
from typing import Any

from queueplane.deploy import definitions, ownership, spark_auth
from queueplane.deploy.cluster_values import merge_values
from queueplane.deploy.helm import run_helm
from queueplane.deploy.kube_access import KubeAccess
from queueplane.deploy.render import Rendered, chart_defaults
from queueplane.errors import QueueplaneError

HELM_TIMEOUT_S = 600


def worker_deployment(objects: list[dict[str, Any]]) -> str:
    """The name of the worker's (driver's) Deployment among the rendered objects."""
    names = [obj["metadata"]["name"] for obj in objects if obj.get("kind") == "Deployment"]
    if len(names) != 1:
        raise ValueError(f"the rendered chart holds {len(names)} Deployments, expected the driver's one")
    return str(names[0])


def upgrade_args(rendered: Rendered, access: KubeAccess, timeout_s: int = HELM_TIMEOUT_S) -> list[str]:
    """`helm upgrade --install --rollback-on-failure --wait` of the rendered release (Helm 4's --atomic)."""
    args = [
        "upgrade",
        "--install",
        rendered.release,
        str(rendered.chart),
        "--namespace",
        rendered.namespace,  # made or checked beforehand: Pod Security restricted (ownership.ensure_namespace)
        "--values",
        str(rendered.values_file),
        "--rollback-on-failure",  # a failed upgrade rolls back to the release that worked
        "--wait",
        "--timeout",
        f"{timeout_s}s",
    ]
    if access.context:
        args += ["--kube-context", access.context]
    return args


def upgrade(source: str, rendered: Rendered, access: KubeAccess, timeout_s: int = HELM_TIMEOUT_S) -> str:
    """Install or upgrade the release of the application whose spec is at ``source`` and wait for
    it; returns helm's output, after a line per cluster-wide definition written and one naming
    any queue the release ran and no longer does.

    Refuses (SpecInvalid, nothing deployed) when the release exists and is not this application's,
    and (DeployError, nothing deployed) when its namespace exists and enforces a Pod Security level
    laxer than ``restricted``; creates a missing namespace ``restricted`` first (see ownership.py),
    then the Secret of Spark's RPC authentication the render names, once (see spark_auth.py), and
    brings the Queue definition and its admission policy up to the chart's when the release has
    Queue objects (see definitions.py).
    """
    left_out = ownership.check_release(source, rendered, access)
    ownership.ensure_namespace(rendered, access, source)
    spark_auth.ensure_secret(rendered, access)
    notes = []
    if merge_values(chart_defaults(), rendered.values)["queueResource"]["enabled"]:
        notes = definitions.ensure_definitions(access)
    result = run_helm(upgrade_args(rendered, access, timeout_s), kubeconfig=access.kubeconfig, timeout=timeout_s + 60)
    if left_out:
        notes.append(
            f"stopped queue(s) {', '.join(left_out)}: application {rendered.release} ran them, and their specs were "
            "not among those deployed (their Queue objects are gone; their topics and groups are untouched)"
        )
    return "".join(f"{note}\n" for note in notes) + result.stdout


def deployment_verdict(namespace: str, name: str, status: Any) -> tuple[bool, str]:
    """Whether the worker's Deployment (its ``V1DeploymentStatus``, None if it does not exist yet) is
    available with a ready replica, and a line saying so."""
    if status is None:
        return False, f"deployment {namespace}/{name} does not exist yet"
    available = any(c.type == "Available" and c.status == "True" for c in status.conditions or [])
    ready = status.ready_replicas or 0
    return available and ready > 0, f"deployment {namespace}/{name}: {ready} ready, available={available}"


def uninstall_problem(namespace: str, release: str, application: str, access: KubeAccess | None) -> str | None:
    """Why apply must not uninstall ``release`` (None: it is ``application``'s, team/name, or gone).

    A removal uninstalls only a release of queueplane's chart made for the removed queue's
    application: never another team's, nor one queueplane did not make.
    """
    if access is None:
        return "no Kubernetes cluster to uninstall it from: give --kubeconfig (or the Kubernetes connection)"
    if not access.in_cluster and (not access.kubeconfig or not os.path.isfile(access.kubeconfig)):
        return f"no kubeconfig at {access.kubeconfig or '(none)'} to uninstall it with: give --kubeconfig"
    try:
        found = ownership.owner_of(release, namespace, access)
    except QueueplaneError as exc:
        return str(exc)
    if found is None or found[0] == application:
        return None
    shown = found[0] if found[0].startswith("a release") else f"application {found[0]}"
    return f"the release is {shown}, not {application}'s: a removal never uninstalls another release"


def uninstall(namespace: str, release: str, access: KubeAccess, timeout_s: int = HELM_TIMEOUT_S) -> str | None:
    """`helm uninstall --wait` of the release: its pods get SIGTERM and drain (run/driver/termination.py),
    and the chart's objects, the Queue object among them, are gone when it returns. A release
    already gone counts as uninstalled. The error text, or None."""
    args = ["uninstall", release, "--namespace", namespace, "--wait", "--timeout", f"{timeout_s}s"]
    if access.context:
        args += ["--kube-context", access.context]
    result = run_helm(args, kubeconfig=access.kubeconfig, check=False, timeout=timeout_s + 60)
    if result.returncode == 0 or "not found" in result.stderr:
        return None
    return " ".join(result.stderr.strip().splitlines()[-3:]) or f"helm uninstall exit code {result.returncode}"
