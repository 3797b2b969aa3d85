"""Host networking the local cluster needs, and its removal.

The bridge is created before the first pod so that the node address exists for the API server,
the kubelet, DNS and Kafka's pod listener from the start (the CNI bridge plugin reuses a bridge
that already carries its gateway address). Two guards keep cluster traffic on the machine: an
unknown service address routes to the bridge, never the default route, and pods may reach each
other and the host but are not forwarded anywhere else.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
from pathlib import Path

from queueplane.errors import LocalStackError
from queueplane.local.kubernetes.layout import BRIDGE, NODE_IP, POD_CIDR, SERVICE_CIDR

FORWARD_GUARD = ["FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP"]
SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
    "net/bridge/bridge-nf-call-ip6tables": "1",
}


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise LocalStackError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()}")
    return done


def node_address_present() -> bool:
    """True when the bridge carries the node address (the cluster's network is prepared)."""
    done = _run("ip", "-4", "-o", "addr", "show", "dev", BRIDGE, check=False)
    return done.returncode == 0 and f" {NODE_IP}/" in done.stdout


def prepare() -> None:
    for key, value in SYSCTLS.items():
        path = Path("/proc/sys") / key
        if path.exists() and path.read_text().strip() != value:
            path.write_text(value)
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    if not node_address_present():
        prefix = ipaddress.ip_network(POD_CIDR).prefixlen
        _run("ip", "addr", "add", f"{NODE_IP}/{prefix}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    _run("ip", "route", "replace", SERVICE_CIDR, "dev", BRIDGE)
    if _run("iptables", "-C", *FORWARD_GUARD, check=False).returncode != 0:
        _run("iptables", "-I", *FORWARD_GUARD)


def _kube_rules(tool: str, table: str) -> tuple[list[list[str]], list[str]]:
    """Jumps from built-in chains into KUBE-* chains, and the KUBE-* chains themselves."""
    listing = _run(tool, "-t", table, "-S", check=False).stdout.splitlines()
    jumps = [line.split()[1:] for line in listing if line.startswith("-A ") and " -j KUBE-" in line]
    jumps = [rule for rule in jumps if not rule[0].startswith("KUBE-")]
    chains = [line.split()[1] for line in listing if line.startswith("-N KUBE-")]
    return jumps, chains


def remove(kube_proxy: Path | None) -> None:
    """Undo prepare() and the iptables chains the kubelet and kube-proxy leave behind."""
    if kube_proxy is not None and kube_proxy.is_file():
        _run(str(kube_proxy), "--cleanup", check=False)
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            jumps, chains = _kube_rules(tool, table)
            for rule in jumps:
                _run(tool, "-t", table, "-D", *rule, check=False)
            for flag in ("-F", "-X"):
                for chain in chains:
                    _run(tool, "-t", table, flag, chain, check=False)
    _run("iptables", "-D", *FORWARD_GUARD, check=False)
    _run("ip", "route", "del", SERVICE_CIDR, check=False)
    _run("ip", "link", "del", BRIDGE, check=False)


def unmount_under(*roots: Path) -> None:
    """Lazily unmount what pods left mounted (volumes, rootfs, network namespaces), deepest first."""
    prefixes = (*(str(root) for root in roots), "/run/netns/cni-")
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefixes)), reverse=True):
        _run("umount", "-l", mount, check=False)
    for netns in Path("/run/netns").glob("cni-*") if Path("/run/netns").is_dir() else []:
        with contextlib.suppress(OSError):
            netns.unlink()
