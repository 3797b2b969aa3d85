"""The chart's cluster-wide objects on a cluster, brought up to the chart's by the deploy before helm.

They are the Queue CustomResourceDefinition (crds/) and the Queue admission policy with its
binding (cluster/). Helm installs crds/ with a release's first install only, never upgrades
it, and takes nothing but CRDs from there; but the Queue object's spec schema follows the
spec's JSON Schema (crd_schema.py), and a release's Queue objects only fit the definition
of the chart that renders them. So each deploy reads each object: a missing one is created,
one whose ``queueplane.io/definition-digest`` annotation differs from the chart's copy is
replaced, a current one is left alone (one read, no write). A deploy whose credentials may not
read them goes on unchecked (the API server still refuses a Queue its definition does not
admit); one that must write and may not is refused before helm runs, saying what a cluster
admin applies.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

from queueplane.deploy.kube_access import KubeAccess, kube_client
from queueplane.deploy.render import chart_cluster_objects
from queueplane.errors import DeployError

DIGEST_ANNOTATION = "queueplane.io/definition-digest"
APPLY_BY_HAND = "kubectl apply --server-side -f charts/queue-worker/crds/ -f charts/queue-worker/cluster/"


def definition_digest(obj: dict[str, Any]) -> str:
    """The chart's copy of one object, as a digest its live copy carries once a deploy wrote it."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def stamped(obj: dict[str, Any]) -> dict[str, Any]:
    """The chart's copy with its digest annotation, as the deploy writes it."""
    body = copy.deepcopy(obj)
    body["metadata"].setdefault("annotations", {})[DIGEST_ANNOTATION] = definition_digest(obj)
    return body


def _calls(kind: str, api_client: Any) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """read, create and replace for one kind of the chart's cluster-wide objects."""
    from kubernetes import client

    if kind == "CustomResourceDefinition":
        crds = client.ApiextensionsV1Api(api_client)
        return (
            crds.read_custom_resource_definition,
            crds.create_custom_resource_definition,
            crds.replace_custom_resource_definition,
        )
    admission = client.AdmissionregistrationV1Api(api_client)
    if kind == "ValidatingAdmissionPolicy":
        return (
            admission.read_validating_admission_policy,
            admission.create_validating_admission_policy,
            admission.replace_validating_admission_policy,
        )
    if kind == "ValidatingAdmissionPolicyBinding":
        return (
            admission.read_validating_admission_policy_binding,
            admission.create_validating_admission_policy_binding,
            admission.replace_validating_admission_policy_binding,
        )
    raise ValueError(f"the chart ships a cluster-wide {kind}, which the deploy does not know how to write")


def _refused(label: str, state: str, exc: Any) -> DeployError:
    return DeployError(
        f"{label} on the cluster is {state}, and this deploy's credentials may not write it "
        f"({exc.status} {exc.reason}); nothing was deployed. A cluster admin applies the chart's definitions "
        f"({APPLY_BY_HAND}), or grants the deployer get, create and update on them (docs/kubernetes.md)"
    )


def ensure_definitions(access: KubeAccess) -> list[str]:
    """Create or replace each of the chart's cluster-wide objects that is missing or not the chart's;
    returns a line per object written, or per object it could not read."""
    from kubernetes.client.exceptions import ApiException

    said = []
    with kube_client(access) as api_client:
        for obj in chart_cluster_objects():
            kind, name = obj["kind"], obj["metadata"]["name"]
            label = f"{kind} {name}"
            read, create, replace = _calls(kind, api_client)
            body, wanted = stamped(obj), definition_digest(obj)
            for attempt in range(2):  # a concurrent deploy may write between our read and write
                try:
                    live = json.loads(read(name, _preload_content=False).data)
                except ApiException as exc:
                    if exc.status == 403:
                        said.append(f"note: {label}: not readable with these credentials; deployed without checking it")
                        break
                    if exc.status != 404:
                        raise
                    live = None
                annotations = (live or {}).get("metadata", {}).get("annotations") or {}
                if live is not None and annotations.get(DIGEST_ANNOTATION) == wanted:
                    break
                try:
                    if live is None:
                        create(body)
                    else:
                        body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
                        replace(name, body)
                except ApiException as exc:
                    if exc.status == 403:
                        raise _refused(label, "missing" if live is None else "not the chart's", exc) from None
                    if exc.status == 409 and attempt == 0:
                        continue
                    raise
                said.append(f"{'created' if live is None else 'updated'} {label} (the chart's)")
                break
    return said
