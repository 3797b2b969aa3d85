"""The Dockerfile and the local image build describe one worker image.

The local Kubernetes cannot pull the Dockerfile's base images (no registry here), so it builds its
image from the same parts another way; these checks keep the two recipes on the same facts.
What the local image really holds is checked in a pod (tests/kubernetes/test_local_cluster.py).
"""

from __future__ import annotations

import json
import re
import shlex

from helpers import REPO

from queueplane.local.kubernetes import images
from queueplane.run.spark import kafka_input

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _instructions(name: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(f"{name} ")]


def test_both_start_from_the_same_debian_with_the_same_packages():
    assert all(base.split()[0] == f"debian:{images.DEBIAN_SUITE}-slim" for base in _instructions("FROM"))
    assert "COPY docker/debian-packages" in DOCKERFILE
    assert "$(sed 's/#.*//' /tmp/debian-packages)" in DOCKERFILE
    assert {"python3", "openjdk-17-jre-headless", "tini"} <= set(images.debian_packages())


def test_both_install_the_pinned_packages_into_the_same_venv():
    assert f"python3 -m venv {images.VENV}" in DOCKERFILE
    assert "-c /src/constraints.txt '/src[worker]'" in DOCKERFILE
    assert f"ln -s {images.VENV}/lib/python3.11/site-packages/pyspark {images.SPARK_HOME}" in DOCKERFILE


def test_both_bake_the_same_connector_jars():
    assert "COPY queueplane/run/spark/spark-kafka-pom.xml" in DOCKERFILE
    (mvn,) = [run for run in _instructions("RUN") if run.startswith("mvn ")]
    properties = dict(arg[2:].split("=", 1) for arg in shlex.split(mvn) if arg.startswith("-D") and "=" in arg)
    assert properties["spark.version"] == kafka_input.SPARK_VERSION
    assert properties["scala.binary"] == kafka_input.SCALA_BINARY
    assert properties["token.provider.version"] == kafka_input.TOKEN_PROVIDER_VERSION
    assert "jars_pyspark_lacks" in DOCKERFILE


def test_both_start_the_same_way_as_the_same_user():
    (entrypoint,) = _instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == images.WORKER_ENTRYPOINT
    assert "COPY docker/entrypoint.sh /opt/entrypoint.sh" in DOCKERFILE
    assert _instructions("USER") == [str(images.WORKER_UID)]
    (env,) = _instructions("ENV")
    assert dict(pair.split("=", 1) for pair in shlex.split(env)) == images.WORKER_ENV


def test_a_worker_under_spark_submit_finds_the_baked_connector_in_spark_home(tmp_path, monkeypatch):
    """spark-submit imports pyspark from SPARK_HOME's zip, so the jars are looked for in SPARK_HOME.

    Looked for beside pyspark's file, they would not be found, and the worker would try to fetch
    them with Maven, which the image does not have.
    """
    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert not kafka_input.connector_in_pyspark(), "the development venv's pyspark has no connector"
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / f"spark-sql-kafka-0-10_{kafka_input.SCALA_BINARY}-{kafka_input.SPARK_VERSION}.jar").touch()
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert kafka_input.connector_in_pyspark()
