"""Spark's Python processes: the launcher Spark is given as its Python, and the daemon it forks workers from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pyspark

from queueplane.run.spark import daemon
from queueplane.run.spark.interpreter import LAUNCHER, launcher

# What a launched process reports: its pid, interpreter, PYTHONPATH, where pyspark came from.
REPORT = (
    "import json, os, sys, pyspark; "
    "print(json.dumps([os.getpid(), sys.executable, os.environ.get('PYTHONPATH'), pyspark.__file__]))"
)


def _pyspark_zip(folder: Path, version: str) -> str:
    path = folder / "python" / "lib" / "pyspark.zip"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pyspark/version.py", f'__version__: str = "{version}"\n')
    return str(path)


def test_the_daemon_drops_sparks_zip_only_when_the_same_pyspark_is_installed(tmp_path, monkeypatch):
    same = _pyspark_zip(tmp_path / "same", pyspark.__version__)
    jar = str(tmp_path / "jars" / "spark-core_2.13-4.2.0.jar")  # Spark puts it on the path too
    monkeypatch.setattr(sys, "path", [same, *sys.path, jar])
    # What a worker had made of them by then: importers (re-read by every task's
    # importlib.invalidate_caches()) and a namespace package from the jar's org/ folder.
    for key in (same, jar, f"{jar}/org"):
        monkeypatch.setitem(sys.path_importer_cache, key, None)
    namespace = types.ModuleType("org")
    namespace.__path__ = [f"{jar}/org"]
    monkeypatch.setitem(sys.modules, "org", namespace)
    assert daemon.drop_spark_archives() is True
    assert same not in sys.path and jar not in sys.path
    assert not {same, jar, f"{jar}/org"} & set(sys.path_importer_cache)
    assert "org" not in sys.modules

    other = _pyspark_zip(tmp_path / "other", "0.0.1")
    monkeypatch.setattr(sys, "path", [other, *sys.path])
    assert daemon.drop_spark_archives() is False
    assert sys.path[0] == other


def test_the_daemon_preloads_without_starting_a_thread():
    code = "from queueplane.run.spark.daemon import preload; preload(); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _spark_path(home: Path, version: str) -> list[str]:
    """PYTHONPATH as Spark sets it for a Python worker: its zips and spark-core's jar first."""
    py4j = home / "python" / "lib" / "py4j-0.10.9.9-src.zip"
    pyspark_zip = _pyspark_zip(home, version)
    zipfile.ZipFile(py4j, "w").close()
    return [pyspark_zip, str(py4j), str(home / "jars" / "spark-core_2.13-4.2.0.jar")]


def _launch(python_path: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}
    return subprocess.run([launcher(), *args], env=env, capture_output=True, text=True, timeout=60)


def test_the_launcher_is_installed_beside_this_python():
    assert launcher() == str(Path(sys.executable).parent / LAUNCHER), "make setup installs the console script"


def test_the_launcher_becomes_this_python_without_sparks_archives(tmp_path):
    handlers = str(tmp_path / "handlers")
    launched = subprocess.Popen(
        [launcher(), "-c", REPORT],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([*_spark_path(tmp_path, pyspark.__version__), handlers])},
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = launched.communicate(timeout=60)
    pid, executable, python_path, pyspark_file = json.loads(out)
    assert pid == launched.pid, "the launcher execs: Spark's process is the worker, for its signals and exit code"
    assert executable == sys.executable
    assert python_path == handlers, "Spark's zips and jar are off the path; the rest stays, in order"
    assert pyspark_file == pyspark.__file__, "pyspark comes from the installed package, with its bytecode"
    assert _launch([handlers], "-c", "raise SystemExit(7)").returncode == 7


def test_the_launcher_keeps_the_archives_of_a_different_pyspark(tmp_path):
    spark_path = _spark_path(tmp_path, "0.0.1")
    out = _launch(spark_path, "-c", REPORT)
    assert out.returncode == 0, out.stderr
    _, _, python_path, _ = json.loads(out.stdout)
    assert python_path == os.pathsep.join(spark_path), "another Spark's Python must not meet the installed one"
