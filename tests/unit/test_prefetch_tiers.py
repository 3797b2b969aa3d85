"""Each make target fetches only the tier it uses (`queueplane local fetch --for TIER`).

`make demo` on a fresh machine must not wait on the local Kubernetes' Go builds, helm or the
worker image; `make test` must still get everything; `make check` leaves out only the local
cluster, whose tests it does not run.
"""

from __future__ import annotations

import os

import pytest
from helpers import run_cli

from queueplane import prefetch
from queueplane.cli.app import build_parser


def _labels(tier: str) -> list[str]:
    return [item.label for item in prefetch.tier_items(tier)]


def test_the_demo_fetches_kafka_and_the_spark_connector_only():
    labels = _labels(prefetch.DEMO)
    assert len(labels) == 2, labels
    assert labels[0].startswith("Apache Kafka") and labels[1] == "Spark's Kafka connector jars"


def test_the_tests_fetch_everything_and_the_check_all_but_the_local_cluster():
    everything = [item.label for item in (*prefetch.GO_BUILDS, *prefetch._other_items())]
    assert _labels(prefetch.TEST) == everything
    left_out = [label for label in everything if label not in _labels(prefetch.CHECK)]
    assert [label.split()[0] for label in left_out] == ["local", "toxiproxy", "the"], left_out
    assert "worker image" in left_out[-1]


def test_the_kubernetes_demo_gets_the_cluster_helm_and_the_image_besides_the_demo():
    labels = _labels(prefetch.KUBERNETES)
    assert set(_labels(prefetch.DEMO)) <= set(labels)
    assert [label.split()[0] for label in labels if label not in _labels(prefetch.DEMO)] == ["local", "helm", "the"]


def test_the_go_builds_started_before_pip_are_the_tiers_own():
    go_labels = [item.label for item in prefetch.tier_items(prefetch.DEMO, go_only=True)]
    assert go_labels == []
    assert [item.label.split()[0] for item in prefetch.tier_items(prefetch.CHECK, go_only=True)] == [
        "helm",
        "Prometheus",
    ]


def test_the_cli_offers_every_tier_and_no_other():
    parser = build_parser()
    for tier in prefetch.TIERS:
        assert parser.parse_args(["local", "fetch", "--for", tier]).tier == tier
    assert parser.parse_args(["local", "fetch"]).tier == prefetch.TEST, "plain `local fetch` gets everything"
    with pytest.raises(SystemExit):
        parser.parse_args(["local", "fetch", "--for", "everything"])
    with pytest.raises(ValueError, match="unknown set-up tier"):
        prefetch.tier_items("everything")


def test_local_fetch_for_the_demo_names_only_what_the_demo_uses(tmp_path):
    # The cache is the machine's, which `make test` filled first: only checked here, not fetched again.
    done = run_cli(["local", "fetch", "--for", "demo"], env={**os.environ, "QUEUEPLANE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    checked = [line.split(":")[0] for line in done.stderr.splitlines() if "checking the cache" in line]
    assert checked == _labels(prefetch.DEMO), done.stderr
    for other in ("helm", "Kubernetes", "toxiproxy", "Prometheus", "class-data"):
        assert other not in done.stderr, done.stderr
