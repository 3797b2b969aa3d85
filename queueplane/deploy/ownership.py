"""What a deploy may write on a cluster: its own release, in a namespace it created safe or found.

The deploy runs with the platform's Kubernetes credentials, and `helm upgrade --install` would
replace any release of the same name in the namespace: another team's queue, or something
queueplane never made. So before helm runs, the release (if there is one) must be this
application's: made from queueplane's chart, for the same team and application. Helm itself refuses to
take over objects another release or nothing of Helm owns ("invalid ownership metadata").

A namespace the deploy has to create gets Pod Security ``restricted`` enforced (and the
labels that say queueplane made it), where helm's ``--create-namespace`` would leave it
without any Pod Security level. A namespace that exists is the platform's and is left as it is.
"""

from __future__ import annotations

import json
from typing import Any

from queueplane.deploy.helm import run_helm
from queueplane.deploy.kube_access import KubeAccess, kube_client
from queueplane.deploy.render import CHART_NAME, Rendered
from queueplane.errors import Problem, SpecInvalid

# Pod Security admission's labels; "latest" follows the cluster's version of the policy.
POD_SECURITY_LABELS = {
    **{f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")},
    **{f"pod-security.kubernetes.io/{mode}-version": "latest" for mode in ("enforce", "audit", "warn")},
}
MANAGED_BY = {"app.kubernetes.io/managed-by": "queueplane"}


def _helm_json(args: list[str], access: KubeAccess) -> Any | None:
    """A `helm get ...` answer as JSON, or None when the release does not exist."""
    if access.context:
        args = [*args, "--kube-context", access.context]
    result = run_helm([*args, "-o", "json"], kubeconfig=access.kubeconfig, check=False, timeout=60)
    if result.returncode != 0:
        if "not found" in result.stderr:
            return None
        run_helm(args, kubeconfig=access.kubeconfig, timeout=60)  # raises HelmError with helm's message
    return json.loads(result.stdout or "null")


def release_owner(rendered: Rendered, access: KubeAccess) -> tuple[str, list[str]] | None:
    """Who the existing release belongs to (``team/name``, or what else it is) and the queues it
    runs; None when there is no release."""
    where = ["--namespace", rendered.namespace]
    metadata = _helm_json(["get", "metadata", rendered.release, *where], access)
    if metadata is None:
        return None
    chart = str(metadata.get("chart", ""))
    if chart != CHART_NAME:
        return f"a release of chart {chart or 'unknown'}, not queueplane's", []
    values = _helm_json(["get", "values", rendered.release, *where], access) or {}
    # A release made before applications held one queue, under "queue": its name was the release's.
    application = values.get("application") or values.get("queue") or {}
    queues = [str(q.get("name")) for q in values.get("queues") or [application]]
    return f"{application.get('team')}/{application.get('name')}", queues


def check_release(source: str, rendered: Rendered, access: KubeAccess) -> list[str]:
    """Refuse (exit 2, naming the spec's application field) when the release exists and is not this
    application's; else return the queues it runs that this deploy leaves out (it stops them)."""
    wanted = f"{rendered.values['application']['team']}/{rendered.values['application']['name']}"
    existing = release_owner(rendered, access)
    if existing is None:
        return []
    owner, running = existing
    if owner == wanted:
        return sorted(set(running) - {q["name"] for q in rendered.values["queues"]})
    shown = owner if owner.startswith("a release") else f"application {owner}"
    application = rendered.values["application"]["name"]
    own_name = [q["name"] for q in rendered.values["queues"]] == [application]
    raise SpecInvalid(
        [
            Problem(
                source,
                "/metadata/name" if own_name else "/spec/deployment/application",
                f'Helm release "{rendered.release}" in namespace {rendered.namespace} exists and is {shown}; '
                "a deploy never takes over another release, so nothing was deployed",
                "application names (by default the queue's name) become release names: rename the application "
                "or the queue, or deploy it to its own namespace",
            )
        ]
    )


def ensure_namespace(rendered: Rendered, access: KubeAccess) -> bool:
    """Create the release's namespace, Pod Security ``restricted``, unless it exists; True if created."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with kube_client(access) as api:
        core = client.CoreV1Api(api)
        try:
            core.read_namespace(rendered.namespace)
            return False
        except ApiException as exc:
            if exc.status != 404:
                raise
        labels = {**POD_SECURITY_LABELS, **MANAGED_BY, "kubernetes.io/metadata.name": rendered.namespace}
        body = client.V1Namespace(metadata=client.V1ObjectMeta(name=rendered.namespace, labels=labels))
        try:
            core.create_namespace(body)
        except ApiException as exc:
            if exc.status != 409:  # created meanwhile by someone else: theirs, left as it is
                raise
            return False
        return True
