"""Shared fixtures: the real local Kafka broker, started once per test session.

The broker lives in a temporary QUEUEPLANE_HOME so the tests never touch a developer's
own `queueplane local up` broker, and it is started by the same code users run.

`make test` runs the suite in parallel processes (pytest-xdist, ``--dist loadgroup``): each
process has its own broker and Airflow home, and the groups below keep together what shares
more than that. Most tests wait on brokers, Spark and pods rather than compute, so the
processes overlap their waits on a small machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from queueplane.kafka.target import KafkaTarget
from queueplane.local.stack import LocalStack, StackState

# Folders whose tests share one session resource, so one process runs them all: the machine's
# one local Kubernetes (a second process would stop it under the first), Airflow's migrated
# metadata DB and the packaging tests' wheel (each built once per process).
SHARED_BY_FOLDER = ("kubernetes", "airflow", "packaging")
# Heaviest first, so the long groups start at once and the short ones fill the gaps after them.
GROUP_ORDER = ("kubernetes", "integration", "packaging", "airflow", "unit")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests by folder (SHARED_BY_FOLDER) or else by module, for ``--dist loadgroup``."""
    tests = Path(__file__).parent

    def folder(item: pytest.Item) -> str:
        return item.path.relative_to(tests).parts[0]

    for item in items:
        shared = folder(item) in SHARED_BY_FOLDER
        item.add_marker(pytest.mark.xdist_group(folder(item) if shared else item.nodeid.split("::")[0]))
    rank = {name: index for index, name in enumerate(GROUP_ORDER)}
    items.sort(key=lambda item: rank.get(folder(item), len(rank)))


@pytest.fixture(scope="session")
def queueplane_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("queueplane-home")


@pytest.fixture(scope="session")
def local_kafka(queueplane_home: Path) -> Iterator[StackState]:
    stack = LocalStack(queueplane_home / "local")
    state = stack.up()
    yield state
    stack.down(purge=True)


@pytest.fixture(scope="session")
def kafka(local_kafka: StackState) -> KafkaTarget:
    return KafkaTarget({"bootstrap.servers": local_kafka.bootstrap}, local_kafka.bootstrap)


@pytest.fixture
def cli_env(queueplane_home: Path) -> dict[str, str]:
    """Environment for running the CLI as a user would, pointed at the test session's local stack."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUEPLANE_")}
    env["QUEUEPLANE_HOME"] = str(queueplane_home)
    return env
