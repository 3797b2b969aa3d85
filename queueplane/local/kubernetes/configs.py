"""The local cluster's configuration files, written from the layout before each start.

Each setting that is not a default says why beside it: most are what this kind of machine
needs (cgroup v1, no CAP_SYS_RESOURCE, no image registry), found by running the cluster here.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from queueplane.local.kubernetes.build import CNI_DIR
from queueplane.local.kubernetes.layout import (
    API_PORT,
    BRIDGE,
    CLUSTER_DOMAIN,
    HOST_ALIAS,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    SANDBOX_IMAGE,
    Layout,
)

KUBECONFIG_USERS = ("admin", "controller-manager", "scheduler", "kubelet", "kube-proxy", "coredns")


def kubeconfig(layout: Layout, user: str, server: str = f"https://127.0.0.1:{API_PORT}") -> dict[str, object]:
    cluster = {"server": server, "certificate-authority": str(layout.pki / "ca.crt")}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "queueplane-local", "cluster": cluster}],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(layout.pki / f"{user}.crt"),
                    "client-key": str(layout.pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "queueplane-local", "context": {"cluster": "queueplane-local", "user": user}}],
        "current-context": "queueplane-local",
    }


def containerd_toml(layout: Layout) -> str:
    # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and without it runc fails with
    # "can't get final child's PID from pipe". The sandbox image is one built here (no registry).
    return f"""version = 2
root = "{layout.state / "containerd"}"
state = "{layout.run / "containerd"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{layout.containerd_socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_DIR}"
    conf_dir = "{layout.cni_conf}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{layout.state / "containerd-opt"}"
"""


def cni_conflist(layout: Layout) -> dict[str, object]:
    # No IP masquerade: pods talk to each other and to the host, never beyond the machine.
    # hairpinMode lets a pod reach itself through its own Service.
    return {
        "cniVersion": "1.0.0",
        "name": "queueplane-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.state / "cni-ipam"),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }


def kubelet_config(layout: Layout) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroups here are v1 with a v2 `unified` mount; the kubelet refuses v1 unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",  # no systemd on this machine
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": NODE_IP,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(layout.pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [NODE_IP],
        "resolvConf": "/etc/resolv.conf",
        "registerNode": True,
        "serializeImagePulls": False,
        # Images here cannot be pulled again, so the kubelet must never garbage-collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%"},
    }


def kube_proxy_config(layout: Layout) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(layout.kubeconfig("kube-proxy"))},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0},  # leave the host's nf_conntrack_max alone
        "nodePortAddresses": ["primary"],
    }


def corefile(layout: Layout) -> str:
    # No `forward`: pods resolve cluster names and the host alias, nothing outside the machine.
    return f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {layout.kubeconfig("coredns")} queueplane-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    hosts {{
        {NODE_IP} {HOST_ALIAS}
        fallthrough
    }}
    cache 30
    loadbalance
}}
"""


COREDNS_RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}],
    },
]


def write_all(layout: Layout) -> None:
    """Write every file; unchanged files are not touched (kube-proxy exits when its file changes)."""
    files: dict[Path, str] = {
        layout.etc / "containerd.toml": containerd_toml(layout),
        layout.cni_conf / "10-queueplane.conflist": json.dumps(cni_conflist(layout), indent=2) + "\n",
        layout.etc / "kubelet.yaml": yaml.safe_dump(kubelet_config(layout), sort_keys=False),
        layout.etc / "kube-proxy.yaml": yaml.safe_dump(kube_proxy_config(layout), sort_keys=False),
        layout.etc / "Corefile": corefile(layout),
        layout.etc / "coredns-rbac.yaml": yaml.safe_dump_all(COREDNS_RBAC, sort_keys=False),
    }
    for user in KUBECONFIG_USERS:
        files[layout.kubeconfig(user)] = yaml.safe_dump(kubeconfig(layout, user), sort_keys=False)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    layout.admin_kubeconfig.chmod(0o600)
