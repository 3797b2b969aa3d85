"""The cluster the Kubernetes tests run against: a given one, else the local one, else one line.

``QUEUEPLANE_TEST_KUBECONFIG`` names a kubeconfig whose current context is a running cluster
(kind, minikube, a shared one): the tests deploy there and neither start nor stop it. What they
cannot find out about it comes from the variables below, all named ``QUEUEPLANE_TEST_*``.
Without it, as root on Linux, the session uses the local cluster (queueplane/local/kubernetes),
starting it unless it runs and stopping it at the end if it started it. Otherwise there is no
cluster, and every Kubernetes test fails at its fixture with one line saying what is missing.

`choose` is the decision alone (tests/unit covers it); `given_cluster` and `local_cluster` make
the `Cluster` the tests use, which is the same whichever it is.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queueplane.local.kubernetes import build, images
from queueplane.local.kubernetes.cluster import LocalKubernetes
from queueplane.local.kubernetes.layout import NODE_IP, NODE_NAME
from queueplane.local.kubernetes.values import IMPORTED, local_values, write_local_values

KUBECONFIG = "QUEUEPLANE_TEST_KUBECONFIG"
# The worker image (repository:tag, built from this checkout's Dockerfile) the given cluster's nodes run.
IMAGE = "QUEUEPLANE_TEST_IMAGE"
# A command that puts the image on the nodes, run once per session with the image's reference
# appended (`kind load docker-image`, `minikube image load`); unset: the nodes have or pull it.
IMAGE_LOADER = "QUEUEPLANE_TEST_IMAGE_LOADER"
# The address of this machine that the given cluster's pods reach, where the session's broker
# listens for them; unset: the address this machine reaches the node from (a kind or minikube
# network's gateway).
POD_KAFKA_HOST = "QUEUEPLANE_TEST_POD_KAFKA_HOST"
# Loaded or pulled: present on the node is used, absent is pulled (a loaded image is present).
LOADED = "IfNotPresent"

NO_CLUSTER = (
    f"no cluster for the Kubernetes tests: set {KUBECONFIG} (a kubeconfig whose current context is your "
    f"kind or minikube cluster) and {IMAGE} (a worker image its nodes can run), or run as root on Linux "
    "for the local cluster; README: The Kubernetes tests"
)


class Missing(Exception):
    """What the tests need of a cluster and do not have, in one line (pytest.fail shows it as it is)."""


@dataclass(frozen=True)
class Given:
    """A cluster named by the environment: its kubeconfig and what cannot be found out about it."""

    kubeconfig: Path
    image: str
    loader: tuple[str, ...]
    pod_kafka_host: str | None


@dataclass(frozen=True)
class Local:
    """The local cluster, which this machine can run (root on Linux)."""


def choose(env: Mapping[str, str], root_on_linux: bool) -> Given | Local:
    """The given cluster if the environment names one, else the local one if it can run here.

    Raises Missing when neither, or when a given cluster lacks what the tests need to know.
    """
    named = env.get(KUBECONFIG, "").strip()
    if not named:
        if root_on_linux:
            return Local()
        raise Missing(NO_CLUSTER)
    kubeconfig = Path(named).expanduser()
    if not kubeconfig.is_file():
        raise Missing(f"{KUBECONFIG}={named}: no such file; point it at the kubeconfig of the cluster to test on")
    image = env.get(IMAGE, "").strip()
    if not image:
        raise Missing(
            f"{KUBECONFIG} is set but {IMAGE} is not: set it to a worker image its nodes can run, built from "
            f"this checkout (docker build -t queueplane/worker:dev .), and {IMAGE_LOADER} to a command that "
            "puts it there unless they can pull it (kind load docker-image; minikube image load)"
        )
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag or "@" in image or tag == "latest":
        raise Missing(f"{IMAGE}={image}: give the image as repository:tag, with a tag other than latest")
    loader = tuple(shlex.split(env.get(IMAGE_LOADER, "")))
    return Given(kubeconfig, image, loader, env.get(POD_KAFKA_HOST, "").strip() or None)


def root_on_linux() -> bool:
    return sys.platform == "linux" and os.geteuid() == 0


@dataclass(frozen=True)
class Cluster:
    """What a Kubernetes test knows of its cluster, the same for a given one and the local one."""

    name: str  # for messages: which cluster this is
    kubeconfig: Path  # for kubectl, helm and `queueplane deploy --kubeconfig` (its current context)
    kubectl_binary: str
    image: str  # the worker image's reference, on the nodes already
    pull_policy: str
    pod_kafka_host: str  # where pods reach this machine: the session's broker listens for them there
    node: str  # the node tests look at or pin pods to
    local: bool  # the local cluster, whose version and node address are its own (layout, build)

    def kubectl_command(self, *args: str) -> list[str]:
        return [self.kubectl_binary, f"--kubeconfig={self.kubeconfig}", *args]

    def kubectl(self, *args: str, check: bool = True) -> str:
        """Run kubectl and return what it printed; with ``check``, a failure raises RuntimeError."""
        done = subprocess.run(self.kubectl_command(*args), capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed on {self.name}: {done.stderr.strip()}")
        return done.stdout

    def values(self, pod_bootstrap: str) -> dict[str, Any]:
        """Cluster values for `queueplane deploy --values`: the image, and the broker for pods."""
        return local_values(self.image, pod_bootstrap, self.pull_policy)

    def write_values(self, path: Path, pod_bootstrap: str) -> Path:
        return write_local_values(path, self.image, pod_bootstrap, self.pull_policy)


def local_cluster(cluster: LocalKubernetes) -> Cluster:
    """The local cluster, once it runs: the worker image built here is imported into its node."""
    return Cluster(
        name="the local cluster",
        kubeconfig=cluster.kubeconfig,
        kubectl_binary=str(build.binary("kubectl")),
        image=images.worker_image().reference,
        pull_policy=IMPORTED,
        pod_kafka_host=NODE_IP,
        node=NODE_NAME,
        local=True,
    )


def given_cluster(given: Given) -> Cluster:
    """The given cluster as it answers now, with the image put on its nodes; Missing if it cannot be used."""
    kubectl = _kubectl()
    base = [kubectl, f"--kubeconfig={given.kubeconfig}"]
    context = subprocess.run([*base, "config", "current-context"], capture_output=True, text=True).stdout.strip()
    name = f"the cluster of context {context or '(none)'} in {KUBECONFIG}={given.kubeconfig}"
    listed = subprocess.run([*base, "get", "nodes", "-o", "json"], capture_output=True, text=True)
    if listed.returncode != 0:
        raise Missing(f"{name} does not answer: {_last_line(listed.stderr)}")
    node, address = _schedulable_node(json.loads(listed.stdout)["items"], name)
    if given.loader:
        loaded = subprocess.run([*given.loader, given.image], capture_output=True, text=True)
        if loaded.returncode != 0:
            command = shlex.join([*given.loader, given.image])
            raise Missing(f"{IMAGE_LOADER}: `{command}` failed: {_last_line(loaded.stderr + loaded.stdout)}")
    return Cluster(
        name=name,
        kubeconfig=given.kubeconfig,
        kubectl_binary=kubectl,
        image=given.image,
        pull_policy=LOADED,
        pod_kafka_host=given.pod_kafka_host or _address_towards(address),
        node=node,
        local=False,
    )


def _kubectl() -> str:
    """The kubectl `queueplane local fetch` built (the newest the project pins), else the one on PATH."""
    if build.binary("kubectl").is_file():
        return str(build.binary("kubectl"))
    found = shutil.which("kubectl")
    if found is None:
        raise Missing(f"{KUBECONFIG} is set but there is no kubectl: put one on PATH")
    return found


def _schedulable_node(nodes: list[dict], name: str) -> tuple[str, str]:
    """The first Ready node pods can land on (no NoSchedule taint), and its InternalIP."""
    for node in nodes:
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        taints = [t for t in node["spec"].get("taints", []) if t.get("effect") in ("NoSchedule", "NoExecute")]
        internal = [a["address"] for a in node["status"].get("addresses", []) if a["type"] == "InternalIP"]
        ipv4 = [address for address in internal if ":" not in address]
        if conditions.get("Ready") == "True" and not node["spec"].get("unschedulable") and not taints and ipv4:
            return node["metadata"]["name"], ipv4[0]
    raise Missing(f"{name} has no Ready node with an IPv4 InternalIP and no NoSchedule taint for the tests' pods")


def _address_towards(address: str) -> str:
    """This machine's source address on the route to ``address`` (a UDP connect sends no packet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))
        return str(probe.getsockname()[0])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
