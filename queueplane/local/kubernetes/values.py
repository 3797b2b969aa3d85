"""Cluster values for deploying to the local Kubernetes: its worker image and where pods find Kafka.

These are what a platform team would put in its own cluster values file; for the local cluster
they are known, so `queueplane local kubernetes up` writes them next to the kubeconfig and
`queueplane deploy SPEC --kubeconfig .queueplane/local/kubeconfig --values
.queueplane/local/cluster-values.yaml` deploys a spec as it is. The Kubernetes tests write the
same values for the cluster they run against, which may be another one (kind, minikube) whose
nodes were given the image another way, hence the pull policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# The local cluster's worker image is imported into the node's containerd, never pulled: there
# is no registry to pull from.
IMPORTED = "Never"


def local_values(image: str, kafka_bootstrap_for_pods: str, pull_policy: str = IMPORTED) -> dict[str, Any]:
    """The values for worker image reference ``image`` (``repository:tag``) and pods' broker address."""
    repository, tag = image.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": pull_policy},
        "kafka": {"bootstrapServers": kafka_bootstrap_for_pods},
        # The broker's pod listener is the one port the release's NetworkPolicy lets it reach Kafka on.
        "networkPolicy": {"kafka": {"ports": [int(kafka_bootstrap_for_pods.rsplit(":", 1)[1])]}},
        # Two cores for everything: the scheduler would otherwise fit a driver and one executor.
        "cpuRequests": {"driver": "250m", "executor": "250m"},
    }


def write_local_values(path: Path, image: str, kafka_bootstrap_for_pods: str, pull_policy: str = IMPORTED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# The local cluster's values for `queueplane deploy --values` (`queueplane local kubernetes up`).\n"
    values = local_values(image, kafka_bootstrap_for_pods, pull_policy)
    path.write_text(header + yaml.safe_dump(values, sort_keys=False))
    return path
