"""The `queueplane` command line (see app.py)."""

from queueplane.cli.app import main

__all__ = ["main"]
