"""The Python Spark starts for a queue's workers: this interpreter, without Spark's copies of pyspark.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``, py4j's zip and spark-core's jar first on the
PYTHONPATH of every Python process it starts. Python keeps no bytecode for modules imported from
an archive, so a process that imports pyspark from there compiles what it needs from source
(about 1.6 s of CPU for pyspark's worker module, against 0.3 s from the installed package).

The daemon (daemon.py) takes the archives off its own path, but not every Python process
Spark starts is forked from it: a stateful query (``transformWithState``) checks
its state schema in a worker Spark starts on its own and waits for at most 10 s
(``PythonWorkerFactory.createSimpleWorker``, not configurable). On a busy two-core machine that
worker took 5.7-9.1 s to import from the zip, and the query failed with "Python worker failed
to connect back".

``queueplane-python`` (``main`` here) is what queueplane gives Spark as its Python
(``spark.pyspark.python``): it takes the archives off PYTHONPATH when the same pyspark is
installed beside them, then replaces itself with this interpreter (``exec``), so Spark's process
is the worker itself, with its pid, signals and exit code.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import zipfile
from pathlib import Path

LAUNCHER = "queueplane-python"  # the console script of main(), installed beside the interpreter
SPARK_ZIPS = ("pyspark.zip", "py4j-")


def _version_in(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    return None


def installed_package(name: str, path: list[str]) -> Path | None:
    """The directory of package ``name`` found on ``path``, if any."""
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def redundant_archives(path: list[str]) -> list[str]:
    """Spark's zips and jars on ``path`` when the rest of ``path`` has the same pyspark (and a
    py4j) installed; none otherwise, since a different pyspark must not meet Spark's JVM."""
    zips = [p for p in path if p.endswith(".zip") and Path(p).name.startswith(SPARK_ZIPS)]
    pyspark_zip = next((p for p in zips if Path(p).name == "pyspark.zip"), None)
    if pyspark_zip is None:
        return []
    rest = [p for p in path if p not in zips]
    package = installed_package("pyspark", rest)
    if package is None or installed_package("py4j", rest) is None or not (package / "version.py").is_file():
        return []
    try:
        with zipfile.ZipFile(pyspark_zip) as archive:
            zipped = _version_in(archive.read("pyspark/version.py").decode())
    except (OSError, KeyError, zipfile.BadZipFile):
        return []
    if zipped is None or zipped != _version_in((package / "version.py").read_text()):
        return []
    return [*zips, *(p for p in path if p.endswith(".jar"))]


def launcher() -> str:
    """The Python to give Spark: the launcher beside this interpreter, or the interpreter itself
    where queueplane is not installed with its scripts (a source tree on PYTHONPATH)."""
    script = Path(sys.executable).parent / LAUNCHER
    return str(script) if os.access(script, os.X_OK) else sys.executable


def main() -> None:
    """Run this interpreter with the given arguments and PYTHONPATH less Spark's redundant archives."""
    env = dict(os.environ)
    entries = env.get("PYTHONPATH", "").split(os.pathsep)
    # sys.path has PYTHONPATH's entries and the site-packages the installed pyspark is found in.
    dropped = set(redundant_archives(sys.path))
    if dropped:
        env["PYTHONPATH"] = os.pathsep.join(p for p in entries if p and os.path.abspath(p) not in dropped)
    os.execve(sys.executable, [sys.executable, *sys.argv[1:]], env)
