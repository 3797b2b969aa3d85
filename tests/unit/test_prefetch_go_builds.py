"""The set-up starts the Go builds before pip has installed anything (Makefile ``setup``).

That works only while ``queueplane.prefetch`` and what its Go builds reach import Python's
standard library alone: an import of a dependency there would fail on a fresh machine, and
the set-up would quietly lose its head start.
"""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import REPO


def test_the_go_builds_import_with_the_standard_library_only():
    # -S: no site-packages, as for the system Python before the venv exists.
    probe = "import queueplane.prefetch as p; print([item.label.split()[0] for item in p.GO_BUILDS])"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['local', 'helm', 'toxiproxy', 'Prometheus']"
