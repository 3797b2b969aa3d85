"""A cache of spec files that passed the per-file checks, keyed by their bytes.

Re-planning unchanged specs (the reconcile DAG, a second `plan`) would otherwise spend
most of its time parsing YAML and running the JSON Schema again. An entry is used only
for the same path with the same SHA-256, and the whole cache is dropped when the schema
or the code that checks specs changes. Rules across specs and broker bounds always run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path

from queueplane.kafka import names
from queueplane.paths import home_dir
from queueplane.spec import durations, files, model, rules, schema, schema_errors
from queueplane.spec.files import SpecFile

FORMAT = 1


@cache
def code_fingerprint() -> str:
    """Hash of the schema and of every module whose logic decides a spec's per-file verdict."""
    digest = hashlib.sha256(str(FORMAT).encode())
    for module in (durations, model, schema, schema_errors, files, rules, names):
        digest.update(Path(module.__file__ or "").read_bytes())
    digest.update(schema.schema_path().read_bytes())
    return digest.hexdigest()


class SpecCache:
    """``persist`` False: in memory only, for the DAG processor, which must leave its working directory alone."""

    def __init__(self, path: Path | None = None, persist: bool = True):
        self.path = path or home_dir() / "cache" / "spec-checks.json"
        self.persist = persist
        self.entries: dict[str, dict] = {}
        self.hits = 0
        if not persist:
            return
        with contextlib.suppress(OSError, ValueError):
            stored = json.loads(self.path.read_text())
            if stored.get("code") == code_fingerprint():
                self.entries = stored["entries"]

    def lookup(self, path: str, sha256: str) -> SpecFile | None:
        entry = self.entries.get(path)
        if entry is None or entry.get("sha256") != sha256:
            return None
        self.hits += 1
        return SpecFile(path, entry["data"], entry["lines"], sha256=sha256, rules_passed=True)

    def remember(self, files: list[SpecFile]) -> None:
        """Store the files that passed; drop entries of files that no longer do."""
        changed = False
        for spec in files:
            if spec.rules_passed and spec.sha256:
                entry = {"sha256": spec.sha256, "data": spec.data, "lines": spec.lines}
                if self.entries.get(spec.path) != entry:
                    self.entries[spec.path] = entry
                    changed = True
            elif self.entries.pop(spec.path, None) is not None:
                changed = True
        if changed and self.persist:
            self._save()

    def _save(self) -> None:
        """Atomic replace, so two processes planning at once never read half a file."""
        with contextlib.suppress(OSError, TypeError, ValueError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".spec-checks-")
            with os.fdopen(fd, "w") as handle:
                json.dump({"code": code_fingerprint(), "entries": self.entries}, handle)
            os.replace(tmp, self.path)
