"""Helpers shared by test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "specs" / "examples"


def run_cli(
    args: list[str], env: dict[str, str], cwd: Path = REPO, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would (no stdin, so apply never prompts)."""
    return subprocess.run(
        [sys.executable, "-m", "queueplane.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
