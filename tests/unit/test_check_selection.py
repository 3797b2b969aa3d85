"""`make check` runs every unit test and only the integration tests tests/parallel.py lists."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO

PYTEST = (sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider")


def test_check_selects_the_unit_tests_and_the_listed_integration_files_only():
    done = subprocess.run(
        [*PYTEST, "-m", "check and not heavy", "tests/unit", "tests/integration"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    files = {line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line}
    assert "tests/unit/test_check_selection.py" in files
    assert {"tests/integration/test_apply.py", "tests/integration/test_local_stack.py"} <= files
    for spark_run in ("test_consumer_worker.py", "test_share_worker.py", "test_broker_outage.py"):
        assert f"tests/integration/{spark_run}" not in files
