"""Command-line tools built with `go install` from the Go module proxy into queueplane's cache.

helm, and the fault proxy and Prometheus the tests use, come this way: pinned to a version, built once per
machine (the set-up step does it), and found again by path afterwards.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from queueplane.errors import QueueplaneError

BUILD_TIMEOUT_S = 1800
# -trimpath as the cluster's build has it: Go's build cache then shares the standard library,
# and any module two builds use at one version, between them.
GO_FLAGS = ("-trimpath", "-ldflags=-s -w")


def go_install(
    package: str,
    version: str,
    folder: Path,
    name: str,
    error: type[QueueplaneError] = QueueplaneError,
    tags: tuple[str, ...] = (),
) -> Path:
    """``folder/name``, built from ``package@version`` on first use; one build at a time across processes.

    ``tags``: Go build tags, e.g. to leave out parts of a large program that are never used here.
    """
    binary = folder / name
    if os.access(binary, os.X_OK):
        return binary
    go = shutil.which("go")
    if go is None:
        raise error(f"{name} {version} is not in {folder} and Go is not on PATH to build it")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second caller waits, then finds the binary
        if os.access(binary, os.X_OK):
            return binary
        with tempfile.TemporaryDirectory(dir=folder) as staging:
            env = {**os.environ, "GOBIN": staging, "CGO_ENABLED": "0"}
            result = subprocess.run(
                [go, "install", *GO_FLAGS, *(["-tags", ",".join(tags)] if tags else []), f"{package}@{version}"],
                env=env,
                cwd=staging,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            if result.returncode != 0:
                raise error(f"go install {package}@{version} failed: {result.stderr.strip()[-2000:]}")
            built = Path(staging) / Path(package).name
            os.replace(built, binary)
    return binary
