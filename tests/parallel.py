"""How `make test` splits the suite across pytest-xdist processes (``-n N --dist loadfile``).

Each process has its own Kafka broker and Airflow home, so most test files can run beside any
other. Some folders share a session resource and go to one process whole: the machine has one
local Kubernetes (a second process would stop it under the first), Airflow's migrated metadata
DB and the packaging tests' wheel are each made once per process. Long folders come first, so
they start at once and the short files fill the gaps behind them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).parent
SHARED_BY_FOLDER = ("kubernetes", "airflow", "packaging")
FOLDER_ORDER = ("kubernetes", "integration", "packaging", "airflow", "unit")


def folder(nodeid: str) -> str:
    """The first folder under tests/ of a node id (``tests/unit/test_x.py::test_y`` → ``unit``)."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if parts[0] == TESTS.name and len(parts) > 2 else parts[0]


def in_run_order(items: list[pytest.Item]) -> None:
    """Sort the collected tests by FOLDER_ORDER, keeping each file's own order."""
    rank = {name: index for index, name in enumerate(FOLDER_ORDER)}
    items.sort(key=lambda item: rank.get(folder(item.nodeid), len(rank)))


class SharedFolderScheduling(LoadScopeScheduling):
    """xdist's loadfile, except that each folder of SHARED_BY_FOLDER is one unit of work.

    (pytest-xdist's own ``xdist_group`` marks are not used: with pytest 9.2 they no longer
    reach the node ids that loadgroup reads, and tests of one group ran in several processes.)
    """

    def _split_scope(self, nodeid: str) -> str:
        name = folder(nodeid)
        return name if name in SHARED_BY_FOLDER else nodeid.split("::", 1)[0]
