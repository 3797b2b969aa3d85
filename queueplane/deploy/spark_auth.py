"""The Secret of a release's Spark RPC authentication, made once by the deploy, before helm.

Spark's driver and executors prove to each other that they hold one shared secret. The chart
could make it with helm's ``lookup`` and ``randAlphaNum``, but ``lookup`` needs the cluster:
a render without one (``helm template``, Argo CD, Flux) makes a new secret every time, and an
Argo CD sync would then rotate it under a running driver, whose new executors would no longer
match it. So a render names the Secret (``sparkAuth.existingSecret``, by default
``<release>-spark-auth``) and the deploy creates it here when it is missing, with the kubernetes
client the deploy already uses. It is labelled as the release's (its instance, application and
team, component ``spark-auth``), so that whatever removes the release finds it.

A release whose Secret the chart made itself (an earlier revision, or ``existingSecret`` empty)
keeps it: the deploy marks that Secret ``helm.sh/resource-policy: keep``, so the upgrade that
stops rendering it leaves it in place, with the secret the running driver holds.
"""

from __future__ import annotations

import base64
import secrets
import string
from typing import Any

from queueplane.deploy.kube_access import KubeAccess, kube_client
from queueplane.deploy.render import CHART_NAME, Rendered
from queueplane.errors import DeployError

# The driver reads `secret` as a file (Spark keys with its bytes in base64); each executor
# reads `secret-base64`, those bytes in base64, from an environment variable.
SECRET_KEY, SECRET_BASE64_KEY = "secret", "secret-base64"
SECRET_LENGTH = 64
KEEP = {"helm.sh/resource-policy": "keep"}
HELM_RELEASE_ANNOTATION = "meta.helm.sh/release-name"
COMPONENT = "spark-auth"


def new_secret() -> dict[str, str]:
    """The two keys of a new Secret, as text (the API server stores them base64-encoded)."""
    raw = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(SECRET_LENGTH))
    return {SECRET_KEY: raw, SECRET_BASE64_KEY: base64.b64encode(raw.encode()).decode()}


def secret_labels(rendered: Rendered) -> dict[str, str]:
    """The labels the chart's own objects carry, so the Secret is found with the release's."""
    application = rendered.values["application"]
    return {
        "app.kubernetes.io/name": CHART_NAME,
        "app.kubernetes.io/instance": rendered.release,
        "app.kubernetes.io/part-of": "queueplane",
        "app.kubernetes.io/managed-by": "queueplane",
        "app.kubernetes.io/component": COMPONENT,
        "queueplane.io/team": str(application["team"]),
        "queueplane.io/application": str(application["name"]),
    }


def data_problem(name: str, data: dict[str, str] | None) -> str | None:
    """Why an existing Secret's ``data`` (base64 values, as the API gives them) cannot serve, or None."""
    data = data or {}
    missing = [key for key in (SECRET_KEY, SECRET_BASE64_KEY) if not data.get(key)]
    if missing:
        return f"Secret {name} has no {' and no '.join(missing)} key"
    try:
        matches = base64.b64decode(data[SECRET_BASE64_KEY], validate=True).decode() == data[SECRET_KEY]
    except (ValueError, UnicodeDecodeError):
        matches = False
    if not matches:
        return f"Secret {name}: its {SECRET_BASE64_KEY} key does not hold its {SECRET_KEY} key's bytes in base64"
    return None


def ensure_secret(rendered: Rendered, access: KubeAccess) -> str | None:
    """Create the Secret the render names (``sparkAuth.existingSecret``) unless it exists; returns
    ``created``, ``kept`` (it existed, and will outlive the chart's copy if the chart made it) or
    None when the render names none (the chart makes its own).

    DeployError (nothing deployed) when an existing Secret of that name lacks the two keys or
    they disagree: executors would never match their driver.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = str((rendered.values.get("sparkAuth") or {}).get("existingSecret") or "")
    if not name:
        return None
    namespace = rendered.namespace
    with kube_client(access) as api:
        core = client.CoreV1Api(api)
        try:
            existing = core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
        else:
            _check_existing(rendered, core, existing)
            return "kept"
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels=secret_labels(rendered),
                annotations={"queueplane.io/release": rendered.release},
            ),
            type="Opaque",
            string_data=new_secret(),
        )
        try:
            core.create_namespaced_secret(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # Made meanwhile by a concurrent deploy of the same release: that one is the secret.
            _check_existing(rendered, core, core.read_namespaced_secret(name, namespace))
            return "kept"
    return "created"


def _check_existing(rendered: Rendered, core: Any, existing: Any) -> None:
    name = existing.metadata.name
    problem = data_problem(name, existing.data)
    if problem is not None:
        raise DeployError(
            f"sparkAuth.existingSecret: {problem} in namespace {rendered.namespace}. Spark's driver reads the "
            f"{SECRET_KEY} key (64 random characters) and each executor the {SECRET_BASE64_KEY} key (the same bytes "
            "in base64); nothing was deployed. Delete the Secret to have the deploy create it, or give it both keys."
        )
    annotations = existing.metadata.annotations or {}
    made_by_chart = annotations.get(HELM_RELEASE_ANNOTATION) == rendered.release
    if made_by_chart and annotations.get("helm.sh/resource-policy") != "keep":
        # The chart's own copy from an earlier revision: helm would delete it when this upgrade stops
        # rendering it, and the running driver's new executors would find no secret.
        core.patch_namespaced_secret(name, rendered.namespace, {"metadata": {"annotations": KEEP}})
