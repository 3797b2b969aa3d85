"""A worker application's Helm release on a cluster: install or upgrade it, and ask whether its worker is up.

The command line (`queueplane deploy`) and the Airflow deploy task and readiness sensor all
come here, so the helm invocation and the readiness rule exist once.
"""

from __future__ import annotations

from typing import Any

from queueplane.deploy import definitions, ownership, spark_auth
from queueplane.deploy.cluster_values import merge_values
from queueplane.deploy.helm import run_helm
from queueplane.deploy.kube_access import KubeAccess
from queueplane.deploy.render import Rendered, chart_defaults

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
