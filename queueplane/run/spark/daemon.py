"""Spark's Python daemon (``spark.python.daemon.module``), with pyspark imported once, compiled.

Spark starts one daemon per executor and forks a Python worker from it per task slot. Three
costs came from how the daemon finds pyspark; profiling a trivial handler showed them
taking more of a worker's first seconds than the records did:

- Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the workers' PYTHONPATH. Python
  keeps no bytecode for modules imported from a zip, so every forked worker compiled the
  pyspark modules it needed from source, and every task's ``importlib.invalidate_caches()``
  re-read the zip's directory of some 1,400 entries.
- The worker module (``pyspark.worker``) is imported after the fork, in every worker.
- Taking the zip off the path was not enough for the tasks' ``invalidate_caches()``: the
  importers Python made for Spark's archives stay in ``sys.path_importer_cache``, and Spark puts
  spark-core's jar (some 5,800 entries) on the path too. Re-reading them took 190 ms a task,
  16% of a busy consumer worker's Python time.

Where the same pyspark is installed as a package (pip, as in queueplane's images and local
runs), the daemon drops Spark's zips and jar from ``sys.path``, with the importers and
namespace packages made from them, so the package's cached bytecode is used, and imports the
pure-Python modules every worker needs before it forks. It imports nothing that starts threads
(pyarrow, numpy): forking a process with threads is unsafe, which is why pyspark imports the
worker module after the fork in the first place.

What it imported is then frozen out of the garbage collector's sight (``gc.freeze``): the
forked workers share those objects and never need to look at them again, and every full
collection would otherwise walk all of them. pyspark's worker loop runs one after every task;
the daemon's workers run one at most once a minute (``AfterTaskCollection``), since a queue's
worker keeps its records in flight from one task to the next.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from pathlib import Path

from queueplane.run.spark.interpreter import redundant_archives

# Imported before the fork: pure Python, no threads at import (checked below, not assumed).
PRELOAD = (
    "pyspark.worker",
    "confluent_kafka",
    "queueplane.run.executor.handler",
    "queueplane.run.dead_letters",
    "queueplane.run.settings",
)


def drop_spark_archives() -> bool:
    """Remove Spark's archives from ``sys.path`` when the same pyspark is installed beside them
    (``redundant_archives``), and forget the importers Python made for them. Nothing is left to
    drop when Spark started the daemon through queueplane's launcher (interpreter.py); this
    covers a ``spark.pyspark.python`` that names an interpreter."""
    dropped = redundant_archives(sys.path)
    if not dropped:
        return False

    def inside(path: str) -> bool:
        return any(path == archive or path.startswith(f"{archive}/") for archive in dropped)

    sys.path[:] = [p for p in sys.path if p not in dropped]
    for key in list(sys.path_importer_cache):  # an archive's importers: its own, and its folders'
        if inside(key):
            del sys.path_importer_cache[key]
    # Namespace packages found only in them: the standard library's ``copy`` tries Jython's
    # ``org.python.core``, which made the jar's ``org`` folder a package with an importer of its own.
    for name, module in list(sys.modules.items()):
        paths = list(getattr(module, "__path__", None) or ())
        if paths and getattr(module, "__file__", None) is None and all(inside(p) for p in paths):
            del sys.modules[name]
    return True


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    tasks = Path("/proc/self/task")  # Linux: the process's OS threads, native ones included
    if threading.active_count() != 1 or (tasks.is_dir() and len(os.listdir(tasks)) != 1):
        raise RuntimeError(f"a preloaded module started a thread; the daemon must not fork with it: {PRELOAD}")


def main() -> None:
    drop_spark_archives()
    preload()
    from pyspark import daemon

    from queueplane.run.executor.processes import AfterTaskCollection, freeze_what_lives, teardown_at_exit

    daemon.worker = teardown_at_exit(daemon.worker)  # the spec's processing.teardown before a worker ends
    daemon.gc = AfterTaskCollection()  # type: ignore[assignment]  # its only use: the collection after a task
    freeze_what_lives()
    daemon.manager()


if __name__ == "__main__":
    main()
