"""What a deploy may write on a cluster: its own release, in a namespace it created safe or found.

The deploy runs with the platform's Kubernetes credentials, and `helm upgrade --install` would
replace any release of the same name in the namespace: another team's queue, or something
queueplane never made. So before helm runs, the release (if there is one) must be this
application's: made from queueplane's chart, for the same team and application. Helm itself refuses to
take over objects another release or nothing of Helm owns ("invalid ownership metadata").

A namespace the deploy has to create gets Pod Security ``restricted`` enforced (and the
labels that say queueplane made it), where helm's ``--create-namespace`` would leave it
without any Pod Security level. A namespace that exists is the platform's and is left as it
is, but only one that enforces ``restricted`` is deployed into: a laxer level (``baseline``,
``privileged``, no label at all, which the cluster's default admits as ``privileged``, or
``restricted`` pinned to a policy version older than the cluster's) would let the team's image
run as root or mount the node. A namespace queueplane created is checked the same way: its
labels may have been loosened since. The deploy is refused before helm runs, so nothing is
installed, and the error says which label to set.
"""

from __future__ import annotations

import json
from typing import Any

from queueplane.deploy.helm import run_helm
from queueplane.deploy.kube_access import KubeAccess, kube_client
from queueplane.deploy.render import CHART_NAME, Rendered
from queueplane.errors import DeployError, Problem, SpecInvalid

# Pod Security admission's labels; "latest" follows the cluster's version of the policy.
POD_SECURITY_LABELS = {
    **{f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")},
    **{f"pod-security.kubernetes.io/{mode}-version": "latest" for mode in ("enforce", "audit", "warn")},
}
MANAGED_BY = {"app.kubernetes.io/managed-by": "queueplane"}
ENFORCE, ENFORCE_VERSION = "pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/enforce-version"
NAMESPACE_FIELD = "/spec/deployment/namespace"


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
    return owner_of(rendered.release, rendered.namespace, access)


def owner_of(release: str, namespace: str, access: KubeAccess) -> tuple[str, list[str]] | None:
    """Who the release ``release`` in ``namespace`` belongs to (``team/application``, or what else
    it is) and the queues it runs; None when there is no such release."""
    where = ["--namespace", namespace]
    metadata = _helm_json(["get", "metadata", release, *where], access)
    if metadata is None:
        return None
    chart = str(metadata.get("chart", ""))
    if chart != CHART_NAME:
        return f"a release of chart {chart or 'unknown'}, not queueplane's", []
    values = _helm_json(["get", "values", release, *where], access) or {}
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


def namespace_policy_problem(namespace: str, labels: dict[str, str] | None, cluster_minor: int | None) -> str | None:
    """Why a deploy must not go into ``namespace`` with these labels, or None when it enforces
    Pod Security ``restricted`` at a policy version no older than the cluster's (``cluster_minor``:
    the API server's 1.x minor version; None when unknown, and then only ``latest`` will do)."""
    labels = labels or {}
    level, version = labels.get(ENFORCE), labels.get(ENFORCE_VERSION, "latest")
    ours = labels.get("app.kubernetes.io/managed-by") == MANAGED_BY["app.kubernetes.io/managed-by"]
    if level is None:
        found = (
            f"namespace {namespace} has no {ENFORCE} label, so it gets the cluster's default Pod Security level, "
            'which is "privileged" unless the API server\'s admission configuration sets another: laxer than '
            '"restricted"'
        )
    elif level != "restricted":
        found = f'namespace {namespace} enforces Pod Security "{level}" ({ENFORCE}={level}), laxer than "restricted"'
    else:
        minor = _policy_minor(version)
        if version == "latest" or (minor is not None and cluster_minor is not None and minor >= cluster_minor):
            return None
        older = f"older than the cluster's v1.{cluster_minor}" if cluster_minor is not None else "not latest"
        at = f"policy version {version}, {older}" if minor is not None else f'"{version}", not a policy version'
        found = (
            f'namespace {namespace} enforces Pod Security "restricted" at {at} ({ENFORCE_VERSION}={version}): '
            "laxer than restricted now, without the checks added since"
        )
    loosened = "; queueplane created it restricted, so its labels were loosened since" if ours else ""
    return (
        f'{found}{loosened}. A queue\'s worker deploys only into a namespace that enforces "restricted" at the '
        "cluster's current policy, so a team's image can neither run as root nor reach the node; nothing was "
        f"deployed. Set the labels with `kubectl label namespace {namespace} {ENFORCE}=restricted "
        f"{ENFORCE_VERSION}=latest --overwrite`, or name a namespace that does not exist yet (the deploy creates "
        "it restricted)."
    )


def _policy_minor(version: str) -> int | None:
    """The N of a ``v1.N`` policy version; None for anything else (``latest`` included)."""
    head, _, minor = version.partition("v1.")
    return int(minor) if head == "" and minor.isdigit() else None


def ensure_namespace(rendered: Rendered, access: KubeAccess, source: str = "") -> bool:
    """Create the release's namespace, Pod Security ``restricted``, unless it exists; True if created.

    An existing namespace (whoever made it) must enforce ``restricted``: else DeployError, one
    paragraph naming the spec's namespace field, the level found and the label to set.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    namespace = rendered.namespace
    with kube_client(access) as api:
        core = client.CoreV1Api(api)
        try:
            existing = core.read_namespace(namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
        else:
            _check_policy(source, namespace, existing.metadata.labels, api)
            return False
        labels = {**POD_SECURITY_LABELS, **MANAGED_BY, "kubernetes.io/metadata.name": namespace}
        body = client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels=labels))
        try:
            core.create_namespace(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # Created meanwhile by someone else: theirs, and checked as any existing namespace is.
            _check_policy(source, namespace, core.read_namespace(namespace).metadata.labels, api)
            return False
        return True


def _check_policy(source: str, namespace: str, labels: dict[str, str] | None, api: object) -> None:
    from kubernetes import client

    minor = None
    if (labels or {}).get(ENFORCE_VERSION, "latest") != "latest":  # only a pinned version needs the cluster's
        code = client.VersionApi(api).get_code()
        digits = "".join(ch for ch in str(code.minor) if ch.isdigit())  # "35", or "35+" on some providers
        minor = int(digits) if digits else None
    problem = namespace_policy_problem(namespace, labels, minor)
    if problem is not None:
        where = f"{source}: {NAMESPACE_FIELD}: " if source else ""
        raise DeployError(where + problem)
