"""The class-data archive the set-up records is the one a local Spark driver maps.

A JVM silently ignores an archive that does not fit its class path or its own build, so only
the class-loading log tells whether the start-up got cheaper: Spark's classes must come from
the archive, not from pyspark's jars.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from queueplane.local import spark_archive

JOB = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
assert spark.range(3).count() == 3
spark.stop()
"""


# What the JVM logs when it validates an archive and turns it down (the reason sits among many
# info lines, so only these are shown).
REFUSAL = re.compile(r"warning|error|not the one|mismatch|does not exist|non-empty|fail|unable|disabled", re.I)


def _why_not_mapped(log: str) -> str:
    lines = [line for line in log.splitlines() if REFUSAL.search(line) and "incompatible property" not in line]
    return "\n".join(re.sub(r"^(\[[^]]*\])+ *", "", line)[:300] for line in lines[-40:])


def test_a_local_spark_driver_loads_sparks_classes_from_the_archive(tmp_path):
    options = spark_archive.java_options()
    if not options:
        pytest.fail("no archive for this JVM and pyspark: `queueplane local fetch` records it")
    loaded, cds = tmp_path / "class-load.log", tmp_path / "cds.log"
    # The JVM's own account of the archive (mapped, or why not) goes to a file for the failure message.
    logs = f"-Xlog:class+load=info:file={loaded} -Xlog:cds=info,cds+dynamic=info,class+path=info:file={cds}"
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{options} {logs}"}
    done = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[warning][cds" not in done.stdout, "the JVM's CDS lines stay off the worker's stdout"
    sources = {}
    for line in loaded.read_text().splitlines():
        name, _, source = line.partition("] ")[2].partition(" source: ")
        sources[name] = source
    source = sources["org.apache.spark.SparkContext"]
    if source != "shared objects file (top)":
        pytest.fail(f"SparkContext came from {source}; the JVM's CDS log says:\n{_why_not_mapped(cds.read_text())}")
    from_archive = sum(1 for s in sources.values() if s == "shared objects file (top)")
    assert from_archive > 5000, f"only {from_archive} of {len(sources)} classes came from the archive"
