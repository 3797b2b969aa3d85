"""Where queueplane keeps its own state on disk."""

from __future__ import annotations

import os
from pathlib import Path


def home_dir() -> Path:
    """Project state root: $QUEUEPLANE_HOME, else .queueplane in the working directory."""
    return Path(os.environ.get("QUEUEPLANE_HOME") or Path.cwd() / ".queueplane").resolve()


def cache_dir() -> Path:
    """Download cache shared by all checkouts: $QUEUEPLANE_CACHE, else the user cache."""
    if os.environ.get("QUEUEPLANE_CACHE"):
        return Path(os.environ["QUEUEPLANE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "queueplane"


_PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_file(repo_path: str) -> Path:
    """A file the repository keeps outside the package (the spec schema, the chart).

    In a checkout it is read where teams and editors find it; a wheel carries a copy under
    ``queueplane/_data/`` (pyproject's force-include), at the same relative path.
    """
    in_repo = _PACKAGE_DIR.parent / repo_path
    return in_repo if in_repo.exists() else _PACKAGE_DIR / "_data" / repo_path
