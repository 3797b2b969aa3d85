"""Where the local cluster lives and the addresses it uses: one place for each of these facts.

There is one local cluster per machine (its ports, bridge and iptables rules are machine-wide),
so its state is under /var/lib and /run rather than a checkout's ``.queueplane``; each checkout
gets its own copy of the admin kubeconfig in ``.queueplane/local/kubeconfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "qp-node"
# The node address is the CNI bridge's gateway, created before the first pod: the API server
# refuses a loopback advertise address (the `kubernetes` Service's endpoint may not be loopback),
# and pods need one stable address at which they reach the host (Kafka, the API server, DNS).
NODE_IP = "10.88.0.1"
POD_CIDR = "10.88.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service, first address of the service range
BRIDGE = "cni0"
API_PORT = 6443
HOST_ALIAS = "host.qp.internal"  # what pods call the host, served by the cluster's DNS
CLUSTER_DOMAIN = "cluster.local"
SANDBOX_IMAGE = "localhost/pause:3.10"


@dataclass(frozen=True)
class Layout:
    """The cluster's directories; tests and users share the default one."""

    state: Path = Path("/var/lib/queueplane/kubernetes")
    run: Path = Path("/run/queueplane/kubernetes")

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def etc(self) -> Path:
        return self.state / "etc"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def cni_conf(self) -> Path:
        return self.etc / "cni"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd" / "containerd.sock"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.etc / "admin.kubeconfig"

    def kubeconfig(self, user: str) -> Path:
        return self.etc / f"{user}.kubeconfig"

    def pid_file(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.logs / f"{daemon}.log"
