"""The pre-commit hook, installed by the real pre-commit into a spec repository as a team would.

pre-commit clones this repository at HEAD, builds queueplane's core into its own venv (pip,
packages pinned by constraints.txt) and runs the hook on `git commit`: a valid spec commits, a
broken one is refused with the file and the field named, and nothing is committed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLES, REPO
from packaging_support import CONSTRAINTS, LEAKY_ENV

pytestmark = pytest.mark.packaging


def _git(repo: Path, env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert not check or done.returncode == 0, f"git {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def test_a_spec_repository_validates_its_specs_on_commit(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    env = {k: v for k, v in os.environ.items() if k not in LEAKY_ENV and not k.startswith(("QUEUEPLANE_", "GIT_"))}
    env.update(
        HOME=str(tmp_path / "home"),
        PRE_COMMIT_HOME=str(tmp_path / "pre-commit"),
        PIP_CONSTRAINT=str(CONSTRAINTS),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",  # the pre-commit of this venv
        GIT_AUTHOR_NAME="team",
        GIT_AUTHOR_EMAIL="team@example.com",
        GIT_COMMITTER_NAME="team",
        GIT_COMMITTER_EMAIL="team@example.com",
    )
    repo = tmp_path / "cafe-specs"
    (repo / "specs" / "cafe").mkdir(parents=True)
    _git(repo, env, "init", "-q", "-b", "main")
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {REPO}\n    rev: {head.stdout.strip()}\n    hooks:\n      - id: queueplane-validate\n"
    )
    spec = repo / "specs" / "cafe" / "coffee-orders.yaml"
    shutil.copy(EXAMPLES / "cafe" / "coffee-orders.yaml", spec)
    installed = subprocess.run(
        ["pre-commit", "install"], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    _git(repo, env, "add", "-A")
    first = _git(repo, env, "commit", "-q", "-m", "coffee orders", check=False)  # builds the hook's venv
    assert first.returncode == 0, first.stdout + first.stderr
    assert "queueplane validate" in first.stdout + first.stderr and "Passed" in first.stdout + first.stderr

    spec.write_text(spec.read_text().replace("lockDuration: 30s", "lockDuration: 2s"))
    assert "lockDuration: 2s" in spec.read_text()
    _git(repo, env, "add", "-A")
    refused = _git(repo, env, "commit", "-q", "-m", "a lock too short", check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0, said
    assert "specs/cafe/coffee-orders.yaml" in said and "/spec/group/lockDuration: 2s is outside" in said, said
    assert _git(repo, env, "rev-list", "--count", "HEAD").stdout.strip() == "1", "nothing was committed"
