"""How helm and the Kubernetes client reach a cluster, in one place for the CLI, operators and ops."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KubeAccess:
    """How helm and the Kubernetes client reach the cluster: a kubeconfig file, or the pod's own account."""

    kubeconfig: str | None
    context: str | None
    in_cluster: bool


def default_kubeconfig() -> str:
    """The kubeconfig kubectl would read: $KUBECONFIG, else ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def kube_client(access: KubeAccess) -> Any:
    """A Kubernetes API client: the kubeconfig and context, or the pod's own account."""
    from kubernetes import client, config

    if access.in_cluster:
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=access.kubeconfig, context=access.context)
