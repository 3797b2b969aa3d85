"""Airflow for the tests: a private AIRFLOW_HOME with a migrated metadata DB (SQLite).

Airflow reads its configuration when first imported, so the environment is set here, when
pytest collects this folder and before any test module imports airflow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO

AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="queueplane-airflow-"))
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
}
os.environ.update(AIRFLOW_ENV)


def airflow_bin() -> str:
    return str(Path(sys.executable).with_name("airflow"))


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[Path]:
    """The migrated metadata DB of this test session's AIRFLOW_HOME (removed at the end)."""
    subprocess.run([airflow_bin(), "db", "migrate"], check=True, capture_output=True, timeout=300)
    yield AIRFLOW_HOME
    shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)
