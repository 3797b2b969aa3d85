"""Helpers of the packaging tests: fresh venvs, constraints.txt, the wheel's metadata."""

from __future__ import annotations

import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from helpers import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

CONSTRAINTS = REPO / "constraints.txt"
# Variables that would make a fresh venv's Python or pip read something other than what the test gives it.
LEAKY_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_CONSTRAINT", "PIP_REQUIRE_VIRTUALENV", "PIP_NO_INDEX")


def pinned_versions() -> dict[str, str]:
    """constraints.txt as {canonical name: version}."""
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )
    return result


@dataclass
class Venv:
    """A fresh virtual environment made with ``python -m venv``; commands run with cwd ``work``."""

    root: Path
    work: Path
    env: dict[str, str]

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def pip_install(self, *args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run(
            [self.bin("python"), "-m", "pip", "install", "--disable-pip-version-check", *map(str, args)],
            self.work,
            self.env,
            timeout,
        )

    def run(self, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run([*map(str, args)], self.work, self.env, timeout)

    def python(self, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(self.bin("python"), "-c", code, timeout=timeout)


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist, extras' included (each with its marker)."""
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = (n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        lines = whl.read(metadata).decode().splitlines()
    return [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")]
