"""Jars from Maven Central, resolved with Maven into queueplane's download cache, once.

The local broker's Kafka jars and the Spark Kafka connector both come this way: a pom
names the pinned artifacts, `mvn dependency:copy-dependencies` copies them (with their
runtime dependencies) into a staging folder, which becomes the cached folder only when
complete, so an interrupted fetch is redone rather than half-used.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from queueplane.errors import QueueplaneError

COMPLETE = ".complete"


def copy_dependencies(
    pom: Path, target: Path, properties: dict[str, str], what: str, error: type[QueueplaneError]
) -> Path:
    """``target`` holding the pom's runtime jars; ``error`` (naming ``what``) when Maven cannot fetch them."""
    if (target / COMPLETE).is_file():
        return target
    mvn = shutil.which("mvn")
    if not mvn:
        raise error(
            f"Maven (mvn) is not on PATH; it fetches the {what} jars from Maven Central. "
            "Install it (apt-get install maven) and run again."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=target.parent))
    cmd = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        *(f"-D{k}={v}" for k, v in properties.items()),
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = " ".join((done.stdout + done.stderr).split()[-60:])
        raise error(f"Maven could not fetch {what}: {tail}")
    (staging / COMPLETE).write_text(what)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target
