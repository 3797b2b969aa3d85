"""Which cluster the Kubernetes tests use: a given one, else the local one as root on Linux, else one line.

`choose` is the decision (tests/kubernetes_cluster.py). The last test runs a Kubernetes test file
in a pytest of its own, as a user who is not root and names no cluster: each test stops at its
fixture with the one line, and nothing else is said or started.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from kubernetes_cluster import (
    IMAGE,
    IMAGE_LOADER,
    KUBECONFIG,
    NO_CLUSTER,
    POD_KAFKA_HOST,
    Given,
    Local,
    Missing,
    choose,
)


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kind.kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\n")
    return path


def _missing(env: dict[str, str], root_on_linux: bool = False) -> str:
    with pytest.raises(Missing) as raised:
        choose(env, root_on_linux)
    line = str(raised.value)
    assert "\n" not in line, "one line"
    return line


@pytest.mark.parametrize("root_on_linux", [True, False])
def test_a_given_cluster_is_used_whether_or_not_the_local_one_could_run(kubeconfig, root_on_linux):
    env = {
        KUBECONFIG: str(kubeconfig),
        IMAGE: "queueplane/worker:dev",
        IMAGE_LOADER: "kind load docker-image --name 'qp tests'",
        POD_KAFKA_HOST: "172.18.0.1",
    }
    assert choose(env, root_on_linux) == Given(
        kubeconfig, "queueplane/worker:dev", ("kind", "load", "docker-image", "--name", "qp tests"), "172.18.0.1"
    )


def test_a_given_cluster_needs_no_loader_nor_pod_address(kubeconfig):
    given = choose({KUBECONFIG: str(kubeconfig), IMAGE: "registry.example.com:5000/qp/worker:0.1.0"}, False)
    assert given == Given(kubeconfig, "registry.example.com:5000/qp/worker:0.1.0", (), None)


def test_without_a_given_cluster_root_on_linux_uses_the_local_one():
    assert choose({}, root_on_linux=True) == Local()
    assert choose({KUBECONFIG: "  ", IMAGE: "queueplane/worker:dev"}, root_on_linux=True) == Local()


def test_neither_a_given_cluster_nor_root_on_linux_is_one_line_saying_what_to_set():
    line = _missing({IMAGE: "queueplane/worker:dev"})
    assert line == NO_CLUSTER
    assert line.startswith(f"no cluster for the Kubernetes tests: set {KUBECONFIG} (a kubeconfig whose current")
    assert f"and {IMAGE} (a worker image its nodes can run), or run as root on Linux for the local cluster" in line


def test_a_given_cluster_without_an_image_says_which_variable_and_how_to_make_one(kubeconfig):
    line = _missing({KUBECONFIG: str(kubeconfig)}, root_on_linux=True)
    assert line.startswith(f"{KUBECONFIG} is set but {IMAGE} is not: set it to a worker image")
    assert "docker build -t queueplane/worker:dev ." in line and f"{IMAGE_LOADER} to a command" in line


def test_a_given_kubeconfig_that_is_not_a_file_is_named(tmp_path):
    absent = tmp_path / "nowhere.kubeconfig"
    line = _missing({KUBECONFIG: str(absent), IMAGE: "queueplane/worker:dev"})
    assert line == f"{KUBECONFIG}={absent}: no such file; point it at the kubeconfig of the cluster to test on"


@pytest.mark.parametrize(
    "image", ["queueplane/worker", "queueplane/worker:latest", "localhost:5000/worker", "worker@sha256:ab12"]
)
def test_an_image_without_a_tag_or_tagged_latest_is_refused(kubeconfig, image):
    line = _missing({KUBECONFIG: str(kubeconfig), IMAGE: image})
    assert line == f"{IMAGE}={image}: give the image as repository:tag, with a tag other than latest"


def test_a_kubernetes_test_without_a_cluster_stops_at_its_fixture_with_the_one_line(tmp_path):
    """As root, the run is in a user namespace of its own, where its uid is nobody's: root on
    Linux is not there to fall back on, and the files it reads and writes are still its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUEPLANE_", "PYTEST_"))}
    env.update(HOME=str(tmp_path), COLUMNS="400")
    as_nobody = ["unshare", "--user", "--"] if os.geteuid() == 0 else []
    target = "tests/kubernetes/test_local_cluster.py"
    command = [*as_nobody, sys.executable, "-m", "pytest", target, "-p", "no:cacheprovider", "-q"]
    done = subprocess.run(
        [*command, f"--basetemp={tmp_path / 'run'}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert said.strip().splitlines()[-1].startswith("3 errors in "), said
    # Each test's report is the line alone: no chained error, no source, no frames.
    sections = re.split(r"^_+ ERROR at setup of (\S+) _+$", said, flags=re.MULTILINE)[1:]
    reports = dict(zip(sections[::2], sections[1::2], strict=True))
    assert len(reports) == 3, said
    for test, report in reports.items():
        assert report.split("\n=")[0].strip() == NO_CLUSTER, (test, report)
    assert "Traceback" not in said and "During handling" not in said and "starting Kafka" not in said, said
