"""The local cluster's binaries, built with Go from the module proxy and cached.

No registry or release download serves Kubernetes binaries to this machine, so they are compiled
from their Go modules: one module of our own (``gomod/kubernetes``) requires ``k8s.io/kubernetes``
and pins each staging module to its published tag, and lists the binaries as ``tool`` directives,
so one ``go build tool`` builds all of them with a shared compile cache. CoreDNS and the pod
sandbox (pause) are small modules beside it. The committed go.sum files pin every byte.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from queueplane.errors import LocalStackError
from queueplane.paths import cache_dir

KUBERNETES_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.5"  # the etcd Kubernetes v1.35.4's own go.mod is tested with
COREDNS_VERSION = "v1.14.7"

MODULES = Path(__file__).with_name("gomod")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
NODE = ("kubelet", "kube-proxy", "coredns")
BINARIES = (*CONTROL_PLANE, *NODE, "kubectl", "pause")
HOST_TOOLS = {
    # command: the Debian package that provides it (installed by `make kubernetes-host`)
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "buildah": "buildah",
    "mmdebstrap": "mmdebstrap",
    "iptables": "iptables",
    "openssl": "openssl",
}
CNI_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins


def bin_dir() -> Path:
    return cache_dir() / f"kubernetes-{KUBERNETES_VERSION}" / "bin"


def binary(name: str) -> Path:
    return bin_dir() / name


def _fingerprint() -> str:
    """What the cached binaries were built from: every module file, so an edit rebuilds."""
    digest = hashlib.sha256()
    for path in sorted(MODULES.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(MODULES)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def built() -> bool:
    stamp = bin_dir() / ".complete"
    return stamp.is_file() and stamp.read_text() == _fingerprint() and all(binary(n).is_file() for n in BINARIES)


def missing_host_tools() -> list[str]:
    """Debian packages the cluster needs that are not installed, for one clear message."""
    packages = {pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None}
    if not (CNI_DIR / "bridge").is_file():
        packages.add("containernetworking-plugins")
    return sorted(packages)


def build_binaries(say: Callable[[str], None] = lambda _m: None) -> Path:
    """Build every binary unless the cache holds this exact set; returns the bin directory."""
    if built():
        return bin_dir()
    go = shutil.which("go")
    if go is None:
        raise LocalStackError("Go is not on PATH; the local Kubernetes is built from Go modules (Go >= 1.25)")
    target = bin_dir()
    target.mkdir(parents=True, exist_ok=True)
    work = target.parent / "modules"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(MODULES, work)  # the package may be read-only (site-packages); go wants to write
    minor = KUBERNETES_VERSION.split(".")[1]
    version_flags = " ".join(
        f"-X k8s.io/component-base/version.{key}={value}"
        for key, value in (
            ("gitVersion", KUBERNETES_VERSION),
            ("gitMajor", "1"),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        )
    )
    say(f"building Kubernetes {KUBERNETES_VERSION}, etcd {ETCD_VERSION} and kubectl (cold: about 6 minutes on 2 cores)")
    _go(go, work / "kubernetes", "-o", f"{target}/", "-ldflags", f"-s -w {version_flags}", "tool")
    (target / "server").replace(target / "etcd")  # go.etcd.io/etcd/server/v3 builds as "server"
    say(f"building CoreDNS {COREDNS_VERSION} (cold: about a minute)")
    _go(go, work / "coredns", "-o", str(target / "coredns"), "-ldflags", "-s -w", ".")
    _go(go, work / "pause", "-o", str(target / "pause"), "-ldflags", "-s -w", ".")
    (target / ".complete").write_text(_fingerprint())
    shutil.rmtree(work, ignore_errors=True)
    return target


def _go(go: str, module: Path, *args: str) -> None:
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}
    cmd = ["nice", "-n", "19", go, "build", "-trimpath", *args]
    done = subprocess.run(cmd, cwd=module, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise LocalStackError(f"building {module.name} failed (go build in {module}):\n{tail}")
