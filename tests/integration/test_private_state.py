"""A worker whose private folder another user could have written in fails at start, in one line
that names the folder and says what to do, instead of trusting what it finds there."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from helpers import REPO
from worker_support import make_queue, worker_command

pytestmark = pytest.mark.kafka

ANOTHER_UID = 12345  # another user of the machine (the tests run as root, who may give files away)


@pytest.mark.parametrize("planted", ["another user's default root", "a world-writable QUEUEPLANE_CALLS_DIR"])
def test_a_worker_refuses_a_private_folder_another_user_could_have_written_in(kafka, tmp_path, planted):
    queue = make_queue(tmp_path, kafka, group_type="share")
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("QUEUEPLANE_CALLS_DIR", None)
    env.pop("XDG_RUNTIME_DIR", None)
    if planted == "another user's default root":
        folder = temp / f"queueplane-{os.geteuid()}"
        folder.mkdir(mode=0o700)
        os.chown(folder, ANOTHER_UID, ANOTHER_UID)
        problem = f"owned by uid {ANOTHER_UID}"
    else:
        folder = tmp_path / "calls"
        folder.mkdir()
        folder.chmod(0o777)
        env["QUEUEPLANE_CALLS_DIR"] = str(folder)
        problem = "has mode 0777"

    started = time.monotonic()
    result = subprocess.run(
        worker_command(queue, kafka, ("--until-idle", "60s")),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    took = time.monotonic() - started
    assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if str(folder) in line]
    assert len(lines) == 1 and problem in lines[0] and "remove it" in lines[0], result.stderr[-2000:]
    assert list(folder.iterdir()) == [], "nothing made in it"
    assert took < 60, f"failed after {took:.0f}s: it must fail before it starts Spark"
