"""The real helm binary: the one the user names, else a Helm 4 on PATH, else one built and cached.

A cluster's deploy host has helm already; `$HELM` names it, or a `helm` on PATH of the major
version the chart and the deploy flags are written for (4) is used. Elsewhere (this project's
own machines) Helm publishes no Python package and its release archives come from a host this
project does not depend on; the Go module proxy serves its source, so the pinned release is
built once into the cache (`queueplane local fetch`) and reused by every command and test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

from queueplane.errors import QueueplaneError
from queueplane.local.go_install import go_install
from queueplane.paths import cache_dir

HELM_VERSION = "v4.3.1"
HELM_MAJOR = HELM_VERSION.split(".")[0]
HELM_PACKAGE = "helm.sh/helm/v4/cmd/helm"


class HelmError(QueueplaneError):
    """helm could not be installed, or a helm command failed."""


def helm_dir() -> Path:
    return cache_dir() / f"helm-{HELM_VERSION}"


def helm_binary() -> Path:
    """The helm to run: $HELM, else a Helm 4 on PATH, else the pinned one (built on first use, once)."""
    named = os.environ.get("HELM")
    if named:
        return Path(named)
    on_path = shutil.which("helm")
    if on_path and _major_version(on_path) == HELM_MAJOR:
        return Path(on_path)
    return built_helm()


@cache
def _major_version(binary: str) -> str | None:
    """`helm version` of a binary, asked once per process: helm_binary runs before every helm command."""
    try:
        result = subprocess.run(
            [binary, "version", "--template", "{{.Version}}"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip().split(".")[0] if result.returncode == 0 else None


def built_helm() -> Path:
    """Path of the pinned helm, built with `go install` on first use (a few minutes, once)."""
    return go_install(HELM_PACKAGE, HELM_VERSION, helm_dir(), "helm", HelmError)


def run_helm(
    args: list[str], *, kubeconfig: str | None = None, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the pinned helm with ``args``; with check (the default) a failure raises HelmError with helm's message."""
    env = dict(os.environ)
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    result = subprocess.run(
        [str(helm_binary()), *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and result.returncode != 0:
        message = " ".join(result.stderr.strip().splitlines()[-5:]) or f"exit code {result.returncode}"
        raise HelmError(f"helm {' '.join(args[:2])} failed: {message}")
    return result
