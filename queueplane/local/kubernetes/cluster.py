"""Start, stop and inspect the local single-node Kubernetes: daemons as host processes.

`up` reads as its phases: check the host, prepare its network, write certificates and configs,
then start each daemon in dependency order and wait for the node to report Ready. Every daemon
runs in its own session under ``nice`` with its log under the state directory and its pid under
/run, so `down` (or a crashed test) can always find and stop it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from queueplane.errors import LocalStackError
from queueplane.local.kubernetes import build, configs, host, images
from queueplane.local.kubernetes.layout import (
    API_PORT,
    NODE_IP,
    NODE_NAME,
    SERVICE_CIDR,
    SERVICE_IP,
    Layout,
)
from queueplane.local.kubernetes.pki import ensure_pki
from queueplane.local.processes import pid_alive, terminate
from queueplane.paths import home_dir

Say = Callable[[str], None]
START_ORDER = (
    "containerd",
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "coredns",
)


def _quiet(_message: str) -> None:
    pass


@dataclass
class LocalKubernetes:
    """The machine's one local cluster; ``home`` is where this checkout's kubeconfig copy goes."""

    layout: Layout = field(default_factory=Layout)
    home: Path = field(default_factory=lambda: home_dir() / "local")

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig for this checkout (``queueplane deploy --kubeconfig``, kubectl, Helm)."""
        return self.home / "kubeconfig"

    # -- phases --------------------------------------------------------------------------------
    def up(self, say: Say = _quiet, worker_image: bool = True) -> dict[str, object]:
        """Start every daemon not running yet; return once the node is Ready and DNS answers."""
        started = time.time()
        self._check_host()
        with self._lock():
            self._write_node_files()
            host.prepare()
            self._start_containerd(say)
            self._import_images(say, worker_image)
            self._start("etcd", say)
            self._wait("etcd", lambda: _http_ok("http://127.0.0.1:2381/health"), 30)
            self._start("kube-apiserver", say)
            self._wait("kube-apiserver", lambda: _http_ok(f"https://127.0.0.1:{API_PORT}/readyz", self._ca()), 120)
            for name in ("kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"):
                self._start(name, say)
            self.kubectl("apply", "-f", str(self.layout.etc / "coredns-rbac.yaml"))
            self._start("coredns", say)
            self._wait("the node to be Ready", self._node_ready, 180)
            self._wait("cluster DNS", lambda: _http_ok("http://127.0.0.1:8181/ready"), 60)
            self.home.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.layout.admin_kubeconfig, self.kubeconfig)
            self.kubeconfig.chmod(0o600)
        say(f"ready in {time.time() - started:.1f}s")
        return self.status()

    def preload_worker_image(self, say: Say = _quiet) -> None:
        """Import the worker image into the node's containerd ahead of the first `up`.

        The import unpacks about a gigabyte; in the set-up it runs beside the Go builds, which
        leave the disk idle, instead of inside the first start of the cluster. A containerd
        started here is stopped again; one already running (the cluster is up) is used.
        """
        self._check_host(binaries=False)
        image = images.worker_image(say)
        with self._lock():
            self._write_node_files()
            started_here = not self._pid("containerd")
            try:
                self._start_containerd(say)
                self._import(image, say)
            finally:
                if started_here:
                    self._stop(["containerd"])

    def down(self, purge: bool = False, say: Say = _quiet) -> bool:
        """Stop every daemon and every pod's processes; ``purge`` also deletes state and host rules."""
        with self._lock():
            running = [name for name in START_ORDER if self._pid(name)]
            self._stop(["coredns", "kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager"])
            if self._pid("containerd"):
                self._kill_pod_tasks()
            self._stop(["containerd", "kube-apiserver"])
            self._stop(["etcd"])
            # Shims whose containerd is gone keep running under init; they name our socket.
            for pid in _pids_with(f"-address {self.layout.containerd_socket}"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            host.unmount_under(self.layout.state, self.layout.run)
            if purge:
                host.remove(build.binary("kube-proxy"))
                shutil.rmtree(self.layout.state, ignore_errors=True)
                shutil.rmtree(self.layout.run, ignore_errors=True)
                self.kubeconfig.unlink(missing_ok=True)
            if running:
                say(f"stopped {', '.join(running)}")
            return bool(running)

    def status(self) -> dict[str, object]:
        daemons = {name: ("running" if self._pid(name) else "stopped") for name in START_ORDER}
        info: dict[str, object] = {
            "running": all(state == "running" for state in daemons.values()),
            "kubernetes": build.KUBERNETES_VERSION,
            "server": f"https://127.0.0.1:{API_PORT}",
            "kubeconfig": str(self.kubeconfig),
            "node": NODE_NAME,
            "node_ip": NODE_IP,
            "daemons": daemons,
            "state": str(self.layout.state),
        }
        if info["running"]:
            info["node_ready"] = self._node_ready()
            info["memory_mib"] = round(sum(_rss_kib(self._pid(n) or 0) for n in START_ORDER) / 1024)
        return info

    def _write_node_files(self) -> None:
        """Folders, certificates and config files; pid files of daemons that are gone are dropped."""
        for folder in (self.layout.logs, self.layout.run, self.layout.state):
            folder.mkdir(parents=True, exist_ok=True)
        self._forget_stale_pids()
        ensure_pki(self.layout.pki, NODE_NAME, NODE_IP, SERVICE_IP)
        configs.write_all(self.layout)

    def _start_containerd(self, say: Say) -> None:
        self._start("containerd", say)
        self._wait("containerd", lambda: self._ctr("version").returncode == 0, 30)

    # -- host checks ---------------------------------------------------------------------------
    def _check_host(self, binaries: bool = True) -> None:
        if os.geteuid() != 0:
            raise LocalStackError("the local Kubernetes runs containerd and a kubelet, which need root")
        missing = build.missing_host_tools()
        if missing:
            raise LocalStackError(
                f"the local Kubernetes needs Debian packages that are not installed: {' '.join(missing)}; "
                "run `make kubernetes-host` (apt-get install) and try again"
            )
        if binaries and not build.built():
            raise LocalStackError(
                f"the Kubernetes {build.KUBERNETES_VERSION} binaries are not built yet; "
                "run `queueplane local fetch` (it builds them from Go modules, about 6 minutes the first time)"
            )

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.layout.run.mkdir(parents=True, exist_ok=True)
        with open(self.layout.run / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- daemons -------------------------------------------------------------------------------
    def _argv(self, name: str) -> list[str]:
        pki, etc, state = self.layout.pki, self.layout.etc, self.layout.state
        kubeconfig = {"kube-controller-manager": "controller-manager", "kube-scheduler": "scheduler"}
        own = [f"--kubeconfig={self.layout.kubeconfig(kubeconfig[name])}"] if name in kubeconfig else []
        delegated = [f"--authentication-kubeconfig={own[0].split('=', 1)[1]}"] if own else []
        delegated += [f"--authorization-kubeconfig={own[0].split('=', 1)[1]}"] if own else []
        loopback = "http://127.0.0.1"
        commands = {
            "containerd": ["containerd", "--config", str(etc / "containerd.toml")],
            "etcd": [
                str(build.binary("etcd")), f"--name={NODE_NAME}", f"--data-dir={state / 'etcd'}",
                f"--listen-client-urls={loopback}:2379", f"--advertise-client-urls={loopback}:2379",
                f"--listen-peer-urls={loopback}:2380", f"--initial-advertise-peer-urls={loopback}:2380",
                f"--initial-cluster={NODE_NAME}={loopback}:2380", f"--listen-metrics-urls={loopback}:2381",
            ],
            "kube-apiserver": [
                str(build.binary("kube-apiserver")), f"--etcd-servers={loopback}:2379",
                # Bound beyond loopback because pods reach it at the node address through the
                # `kubernetes` Service; the FORWARD guard keeps it from leaving the machine.
                "--bind-address=0.0.0.0", f"--secure-port={API_PORT}", f"--advertise-address={NODE_IP}",
                f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}", "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction,PodSecurity", "--profiling=false",
            ],
            "kube-controller-manager": [
                str(build.binary("kube-controller-manager")), *own, *delegated,
                "--bind-address=127.0.0.1", "--leader-elect=false",
                f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=true", "--profiling=false",
            ],
            "kube-scheduler": [
                str(build.binary("kube-scheduler")), *own, *delegated,
                "--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false",
            ],
            "kubelet": [
                str(build.binary("kubelet")), f"--config={etc / 'kubelet.yaml'}",
                f"--kubeconfig={self.layout.kubeconfig('kubelet')}", f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}", f"--root-dir={state / 'kubelet'}",
            ],
            "kube-proxy": [str(build.binary("kube-proxy")), f"--config={etc / 'kube-proxy.yaml'}"],
            "coredns": [str(build.binary("coredns")), "-conf", str(etc / "Corefile")],
        }  # fmt: skip
        return commands[name]

    def _pid(self, name: str) -> int | None:
        """The daemon's pid if it runs (checked against its command line, so a reused pid is not ours)."""
        try:
            pid = int(self.layout.pid_file(name).read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        # While `nice` execs the daemon the kernel shows an empty command line for a moment;
        # before that the daemon's path is an argument of `nice` rather than argv[0].
        expected = os.path.basename(self._argv(name)[0]).encode()
        return pid if cmdline == [b""] or expected in {os.path.basename(part) for part in cmdline[:4]} else None

    def _forget_stale_pids(self) -> None:
        """Drop pid files whose daemon is gone (a reboot, a killed session), so `up` starts it again.

        A pid file left behind would otherwise read as a daemon that died during this start-up.
        """
        for name in START_ORDER:
            if not self._pid(name):
                self.layout.pid_file(name).unlink(missing_ok=True)

    def _start(self, name: str, say: Say) -> None:
        if self._pid(name):
            return
        say(f"starting {name}")
        env = {**os.environ, "PATH": f"{build.bin_dir()}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        with open(self.layout.log_file(name), "ab") as log:
            proc = subprocess.Popen(
                ["nice", "-n", "19", *self._argv(name)] if name != "containerd" else self._argv(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=self.layout.state,
            )
        # `nice` execs the daemon, so the pid is the daemon's own. containerd is not niced:
        # pods inherit its priority, and queue workers should run at the normal one.
        self.layout.pid_file(name).write_text(str(proc.pid))

    def _wait(self, what: str, check: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return
            for name in START_ORDER:
                pid_file = self.layout.pid_file(name)
                if pid_file.is_file() and not self._pid(name):
                    log = self.layout.log_file(name)
                    raise LocalStackError(f"{name} exited during start-up; the end of {log}:\n{_tail(log)}")
            time.sleep(0.2)
        raise LocalStackError(f"timed out after {timeout_s:.0f}s waiting for {what}; logs in {self.layout.logs}")

    def _stop(self, names: list[str]) -> None:
        pids = [pid for pid in (self._pid(n) for n in names) if pid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 15)
        for pid in pids:
            terminate(pid, grace_s=10.0)
        for name in names:
            self.layout.pid_file(name).unlink(missing_ok=True)

    # -- containerd ----------------------------------------------------------------------------
    def _ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["ctr", "--address", str(self.layout.containerd_socket), "--namespace", "k8s.io", *args]
        return subprocess.run(cmd, capture_output=True, text=True)

    def _import_images(self, say: Say, worker_image: bool) -> None:
        wanted = [images.pause_image(say)]
        if worker_image:
            wanted.append(images.worker_image(say))
        for image in wanted:
            self._import(image, say)

    def _import(self, image: images.Image, say: Say) -> None:
        listing = self._images()
        if image.reference not in listing:
            say(f"importing {image.reference} into containerd")
            done = self._ctr("images", "import", str(image.archive))
            if done.returncode != 0:
                raise LocalStackError(f"importing {image.archive} failed: {done.stderr.strip()}")
            listing = self._images()
        # Each code change makes a new worker image of about a gigabyte: the node keeps the
        # current one only, or its disk fills over a few weeks of work. The CRI plugin names each
        # image a second time by its config digest (``sha256:...``); those names go with it.
        repository = image.reference.rsplit(":", 1)[0]
        older = [ref for ref in listing if ref.rsplit(":", 1)[0] == repository and ref != image.reference]
        kept = {digest for ref, digest in listing.items() if ref not in older and not ref.startswith("sha256:")}
        orphans = [ref for ref, digest in listing.items() if ref.startswith("sha256:") and digest not in kept]
        if older or orphans:
            self._ctr("images", "remove", "--sync", *older, *orphans)  # --sync: collected before containerd may stop

    def _images(self) -> dict[str, str]:
        """The node's image names and the digest each names."""
        lines = self._ctr("images", "list").stdout.splitlines()[1:]
        return {fields[0]: fields[2] for fields in (line.split() for line in lines) if len(fields) >= 3}

    def _kill_pod_tasks(self) -> None:
        tasks = self._ctr("tasks", "list", "--quiet").stdout.split()
        for task in tasks:
            self._ctr("tasks", "kill", "--signal", "SIGKILL", task)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            line.split()[-1] != "STOPPED" for line in self._ctr("tasks", "list").stdout.splitlines()[1:] if line.split()
        ):
            time.sleep(0.1)
        for task in tasks:
            self._ctr("tasks", "delete", "--force", task)

    # -- API -----------------------------------------------------------------------------------
    def _ca(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.layout.pki / "ca.crt"))

    def kubectl_command(self, *args: str) -> list[str]:
        """The kubectl built with the cluster (the one on PATH may be too old for it), as admin."""
        return [str(build.binary("kubectl")), f"--kubeconfig={self.layout.admin_kubeconfig}", *args]

    def kubectl(self, *args: str, check: bool = True) -> str:
        """Run kubectl and return what it printed; with ``check``, a failure raises LocalStackError."""
        done = subprocess.run(self.kubectl_command(*args), capture_output=True, text=True)
        if check and done.returncode != 0:
            raise LocalStackError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def _node_ready(self) -> bool:
        """Ready, reported by the running kubelet: etcd still holds the last run's Ready=True."""
        try:
            since = self.layout.pid_file("kubelet").stat().st_mtime  # written when it was started
        except OSError:
            return False
        try:
            node = json.loads(self.kubectl("get", "node", NODE_NAME, "-o", "json"))
        except (LocalStackError, ValueError):
            return False
        for condition in node.get("status", {}).get("conditions", []):
            if condition["type"] == "Ready":
                beat = datetime.fromisoformat(condition["lastHeartbeatTime"].replace("Z", "+00:00")).timestamp()
                return condition["status"] == "True" and beat >= int(since)
        return False


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:
            return answer.status == 200
    except OSError:
        return False


def _tail(path: Path, lines: int = 15) -> str:
    """The last lines of a daemon's log, for an error that has to be read where it happened (CI)."""
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def _pids_with(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (proc / "cmdline").read_bytes().replace(b"\0", b" "):
                    found.append(int(proc.name))
    return found


def _rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
