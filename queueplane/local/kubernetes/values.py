"""Cluster values for deploying to the local Kubernetes: its worker image and where pods find Kafka.

These are what a platform team would put in its own cluster values file; for the local cluster
they are known, so `queueplane local kubernetes up` writes them next to the kubeconfig and
`queueplane deploy SPEC --kubeconfig .queueplane/local/kubeconfig --values
.queueplane/local/cluster-values.yaml` deploys a spec as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from queueplane.local.kubernetes.images import Image


def local_values(image: Image, kafka_bootstrap_for_pods: str) -> dict[str, Any]:
    repository, tag = image.reference.rsplit(":", 1)
    return {
        # Imported into the node's containerd, never pulled: there is no registry to pull from.
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "kafka": {"bootstrapServers": kafka_bootstrap_for_pods},
        # The broker's pod listener is the one port the release's NetworkPolicy lets it reach Kafka on.
        "networkPolicy": {"kafka": {"ports": [int(kafka_bootstrap_for_pods.rsplit(":", 1)[1])]}},
        # Two cores for everything: the scheduler would otherwise fit a driver and one executor.
        "cpuRequests": {"driver": "250m", "executor": "250m"},
    }


def write_local_values(path: Path, image: Image, kafka_bootstrap_for_pods: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# The local cluster's values for `queueplane deploy --values` (`queueplane local kubernetes up`).\n"
    path.write_text(header + yaml.safe_dump(local_values(image, kafka_bootstrap_for_pods), sort_keys=False))
    return path
