"""Images for the local cluster, built without a registry: the pod sandbox and the queue worker.

The worker's root filesystem comes from Debian's packages (mmdebstrap, against the mirror apt
is configured with), its Python packages from PyPI as wheels built by pip on this machine, and
Spark's Kafka connector jars from Maven Central, baked into pyspark's own jars so that no worker
fetches anything when it starts. buildah turns the tree into an OCI archive, which the cluster's
containerd imports. ``docker/debian-packages`` and ``docker/entrypoint.sh`` are shared with the
Dockerfile, so the two images hold the same system packages and start the same way.

Each archive is cached under a name derived from everything that goes into it, so an unchanged
checkout reuses it and a changed one gets a new tag (the chart refuses ``latest``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from queueplane.errors import LocalStackError
from queueplane.local.kubernetes.build import binary
from queueplane.local.kubernetes.layout import SANDBOX_IMAGE
from queueplane.paths import cache_dir, shipped_file
from queueplane.run.spark.interpreter import LAUNCHER

DEBIAN_SUITE = "bookworm"
WORKER_REPOSITORY = "localhost/queueplane/worker"
WORKER_UID = 185  # apache/spark-docker's spark user; the chart's securityContext runs as it
VENV = "/opt/queueplane/venv"
SPARK_HOME = "/opt/spark"
HANDLERS = "/opt/queueplane/handlers"
# The examples' handler packages travel in the local image, so the example specs deploy as they are;
# a team's own image adds its package at the same place (see the Dockerfile).
EXAMPLE_HANDLERS = ("cafe", "payments", "messaging")
WORKER_ENTRYPOINT = ["/usr/bin/tini", "--", "/opt/entrypoint.sh"]
WORKER_ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "SPARK_HOME": SPARK_HOME,
    "PYSPARK_PYTHON": LAUNCHER,  # on PATH, from the venv
    "PYTHONPATH": HANDLERS,
    "HOME": "/tmp",
}


@dataclass(frozen=True)
class Image:
    """An OCI archive on disk and the reference containerd will know it by."""

    reference: str
    archive: Path


def images_dir() -> Path:
    return cache_dir() / "images"


def repo_root() -> Path:
    """The checkout the worker image is built from (its pyproject, spark_apps and examples)."""
    root = shipped_file("pyproject.toml").parent
    if not (root / "pyproject.toml").is_file() or not (root / "spark_apps").is_dir():
        raise LocalStackError("building the worker image needs a queueplane checkout (pyproject.toml, spark_apps/)")
    return root


def debian_mirror() -> str:
    """The Debian mirror apt uses here (deb822 or one-line sources), so no other host is asked."""
    for source in (*sorted(Path("/etc/apt/sources.list.d").glob("*.sources")), Path("/etc/apt/sources.list")):
        if not source.is_file():
            continue
        text = source.read_text()
        for match in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.MULTILINE):
            if "security" not in match.group(1):
                return match.group(1)
    return "http://deb.debian.org/debian"


def debian_packages() -> list[str]:
    text = shipped_file("docker/debian-packages").read_text()
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def _run(cmd: list[str], what: str, **kwargs: object) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise LocalStackError(f"{what} failed ({' '.join(cmd[:3])} ...):\n{tail}")
    return done.stdout.strip()


def _commit(container: str, reference: str, archive: Path) -> None:
    """Commit a buildah container straight into an OCI archive, atomically."""
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    _run(["buildah", "commit", "--rm", "--quiet", container, f"oci-archive:{partial}:{reference}"], "buildah commit")
    partial.replace(archive)


def pause_image(say: Callable[[str], None] = lambda _m: None) -> Image:
    tag = hashlib.sha256(binary("pause").read_bytes()).hexdigest()[:12]
    archive = images_dir() / f"pause-{tag}.oci.tar"
    if archive.is_file():
        return Image(SANDBOX_IMAGE, archive)
    say("building the pod sandbox image")
    archive.parent.mkdir(parents=True, exist_ok=True)
    container = _run(["buildah", "from", "scratch"], "buildah from")
    _run(["buildah", "copy", container, str(binary("pause")), "/pause"], "buildah copy")
    config = ["--entrypoint", '["/pause"]', "--user", "65535:65535", "--env", "PATH=/"]
    _run(["buildah", "config", *config, container], "buildah config")
    _commit(container, SANDBOX_IMAGE, archive)
    return Image(SANDBOX_IMAGE, archive)


def _worker_inputs(root: Path) -> list[Path]:
    files = [root / "pyproject.toml", root / "constraints.txt", root / "README.md", root / "LICENSE"]
    files += [root / "docker" / "entrypoint.sh", root / "docker" / "debian-packages"]
    for folder in ("queueplane", "spark_apps", "charts", *(f"specs/examples/{h}" for h in EXAMPLE_HANDLERS)):
        files += [p for p in (root / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    files.append(root / "specs" / "queue-v1.schema.json")
    return sorted(files)


def worker_tag(root: Path | None = None) -> str:
    """queueplane's version and a digest of every input, e.g. ``0.1.0-3f2a9c1b04d2``."""
    from importlib.metadata import version

    root = root or repo_root()
    digest = hashlib.sha256(DEBIAN_SUITE.encode())
    for path in _worker_inputs(root):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"{version('queueplane')}-{digest.hexdigest()[:12]}"


def worker_image(say: Callable[[str], None] = lambda _m: None) -> Image:
    """The worker image for the local cluster, built once per distinct checkout."""
    root = repo_root()
    tag = worker_tag(root)
    reference = f"{WORKER_REPOSITORY}:{tag}"
    archive = images_dir() / f"worker-{tag}.oci.tar"
    if archive.is_file():
        return Image(reference, archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    for stale in images_dir().glob("worker-*.oci.tar"):
        stale.unlink()  # one worker archive is kept: each is about a gigabyte
    with tempfile.TemporaryDirectory(prefix="worker-image-", dir=images_dir()) as scratch:
        work = Path(scratch)
        wheels = _wheels(root, work / "wheels", say)
        jars = _connector_jars(work / "jars")
        rootfs = work / "rootfs.tar"
        _rootfs(root, wheels, jars, rootfs, say)
        say("packing the worker image (buildah)")
        container = _run(["buildah", "from", "scratch"], "buildah from")
        _run(["buildah", "add", "--quiet", container, str(rootfs), "/"], "buildah add")
        config = ["--user", str(WORKER_UID), "--workingdir", "/tmp"]
        config += ["--entrypoint", json.dumps(WORKER_ENTRYPOINT), "--cmd", "[]"]
        for key, value in WORKER_ENV.items():
            config += ["--env", f"{key}={value}"]
        config += ["--label", f"io.queueplane.tag={tag}"]
        _run(["buildah", "config", *config, container], "buildah config")
        _commit(container, reference, archive)
    return Image(reference, archive)


def _wheels(root: Path, target: Path, say: Callable[[str], None]) -> Path:
    say("building the worker's wheels with pip (queueplane[worker] and its pinned dependencies)")
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "-c", str(root / "constraints.txt")]
    _run([*cmd, "-w", str(target), f"{root}[worker]"], "pip wheel")
    return target


def _connector_jars(target: Path) -> Path:
    from queueplane.run.spark.kafka_input import connector_jars

    target.mkdir(parents=True)
    for jar in connector_jars():
        shutil.copy2(jar, target)
    return target


def _rootfs(root: Path, wheels: Path, jars: Path, output: Path, say: Callable[[str], None]) -> None:
    say(f"making the worker's root filesystem from Debian {DEBIAN_SUITE} (mmdebstrap)")
    site = f"{VENV}/lib/python3.11/site-packages"
    hooks = [
        # sync-in copies into existing folders only.
        'mkdir -p "$1/opt/queueplane/wheels" "$1/opt/queueplane/spark_apps" '
        + " ".join(f'"$1{HANDLERS}/{h}"' for h in EXAMPLE_HANDLERS),
        f"sync-in {wheels} /opt/queueplane/wheels",
        f'chroot "$1" python3 -m venv {VENV}',
        f'chroot "$1" {VENV}/bin/pip install --quiet --no-index --find-links /opt/queueplane/wheels '
        '"queueplane[worker]"',
        'rm -rf "$1/opt/queueplane/wheels"',
        # pyspark is Spark: its folder is SPARK_HOME, and the connector goes into its jars.
        f'ln -s {site}/pyspark "$1{SPARK_HOME}"',
        f"sync-in {jars} {site}/pyspark/jars",
        f"sync-in {root / 'spark_apps'} /opt/queueplane/spark_apps",
        f"copy-in {root / 'docker' / 'entrypoint.sh'} /opt",
        *(f"sync-in {root / 'specs' / 'examples' / h} {HANDLERS}/{h}" for h in EXAMPLE_HANDLERS),
        f"echo 'spark:x:{WORKER_UID}:0:spark:/tmp:/usr/sbin/nologin' >> \"$1/etc/passwd\"",
        'chmod 0755 "$1/opt/entrypoint.sh"',
        'rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*',
    ]
    cmd = ["nice", "-n", "19", "mmdebstrap", "--variant=essential", "--quiet", "--mode=root"]
    cmd += [f"--include={','.join(debian_packages())}"]
    cmd += ["--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*"]
    cmd += ["--dpkgopt=path-exclude=/usr/share/locale/*"]
    # The JRE's postinst links its man page there, and fails when man pages are left out.
    cmd += ['--setup-hook=mkdir -p "$1/usr/share/man/man1"']
    cmd += [f"--customize-hook={hook}" for hook in hooks]
    cmd += [DEBIAN_SUITE, str(output), debian_mirror()]
    _run(cmd, "mmdebstrap", env={**os.environ, "TMPDIR": str(output.parent)})
