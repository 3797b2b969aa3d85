"""The suite's own layout: pytest imports test files by basename (rootdir-relative imports, no
packages), so two folders holding one basename make the second fail to collect."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_each_test_file_basename_is_used_once_across_the_suite():
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not clashes, f"test files sharing a basename: {clashes}"
