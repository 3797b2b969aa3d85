"""Which helm runs: $HELM, else a Helm 4 on PATH, else the pinned one built into the cache."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from queueplane.deploy import helm


def _fake_helm(folder: Path, version: str) -> Path:
    """A `helm` that answers `helm version` like a real one of ``version``."""
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / "helm"
    binary.write_text(f"#!/bin/sh\necho {version}\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_a_helm_4_on_path_is_used_and_a_helm_3_is_not(tmp_path, monkeypatch):
    monkeypatch.delenv("HELM", raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("QUEUEPLANE_CACHE", str(cache))
    built = helm.helm_dir() / "helm"
    _fake_helm(built.parent, helm.HELM_VERSION)  # as if `queueplane local fetch` had built it

    monkeypatch.setenv("PATH", f"{tmp_path / 'v4'}{os.pathsep}{os.environ['PATH']}")
    on_path = _fake_helm(tmp_path / "v4", "v4.0.2")
    assert helm.helm_binary() == on_path

    monkeypatch.setenv("PATH", f"{tmp_path / 'v3'}{os.pathsep}{os.environ['PATH']}")
    _fake_helm(tmp_path / "v3", "v3.17.0")
    assert helm.helm_binary() == built, "a Helm 3 on PATH cannot run the chart's Helm 4 flags"


def test_helm_named_by_the_environment_wins(tmp_path, monkeypatch):
    named = _fake_helm(tmp_path / "mine", "v4.1.0")
    monkeypatch.setenv("HELM", str(named))
    assert helm.helm_binary() == named
