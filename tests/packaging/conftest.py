"""Packaging tests: the wheel built once per session, installed into fresh venvs as users install it.

The venvs get their packages from PyPI through pip's own cache, so these tests take minutes
(marked ``packaging``). Every command runs outside the checkout (cwd is a temporary folder)
so that ``import queueplane`` finds the installed wheel, never the source tree.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers import REPO
from packaging_support import LEAKY_ENV, Venv, run


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """queueplane's wheel, built from the checkout the way pip builds it for users (isolated build)."""
    out = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in LEAKY_ENV}
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(out), str(REPO)],
        out,
        env,
        timeout=300,
    )
    (built,) = out.glob("queueplane-*.whl")
    return built


@pytest.fixture
def venv(tmp_path: Path) -> Venv:
    """A new venv (``python -m venv``) under this test's tmp_path, with its own AIRFLOW_HOME and QUEUEPLANE_HOME."""
    root, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LEAKY_ENV and not k.startswith(("AIRFLOW", "QUEUEPLANE_", "PYSPARK", "SPARK_"))
    }
    env.update(
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        QUEUEPLANE_HOME=str(tmp_path / "queueplane"),
        PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}",
    )
    run([sys.executable, "-m", "venv", str(root)], work, env, timeout=120)
    return Venv(root, work, env)
