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
