"""A real Prometheus scrapes a running local worker: the metrics, the chart's alert rules and the dashboard's queries.

The worker runs as `queueplane run --metrics-port` on a loaded queue; Prometheus (built from
the Go module proxy) scrapes it every second with the labels a PodMonitor would add, and
evaluates the chart's rules. What a platform's Prometheus would see of the queue is then
asked through Prometheus' own API.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from helpers import REPO, run_cli, tagged_examples, unique_tag, wait_for
from monitoring_support import dashboard_queries, write_rules

from queueplane.local.processes import free_port
from queueplane.local.prometheus import LocalPrometheus
from queueplane.provision import steps

pytestmark = pytest.mark.kafka

COUNT = 400
# Local mode has no executors to count: the dashboard's executor lines stay empty there.
EMPTY_IN_LOCAL_MODE = {"Executors / {{state}}"}


def _value(prometheus: LocalPrometheus, expr: str) -> float | None:
    result = prometheus.query(expr)
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_a_running_worker_and_evaluates_the_rules_and_dashboard(kafka, cli_env, tmp_path):
    spec = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    queue = steps.validate([str(spec)], None)[0]
    name, namespace = queue.name, yaml.safe_load(spec.read_text())["spec"]["deployment"]["namespace"]
    cluster = ["--bootstrap-servers", kafka.bootstrap]
    assert run_cli(["apply", str(spec), "--yes", *cluster], cli_env).returncode == 0
    load = ["load", str(spec), "--count", str(COUNT), "--poison-rate", "0.05", "-o", "json", *cluster]
    loaded = run_cli(load, cli_env)
    assert loaded.returncode == 0, loaded.stderr
    poison = json.loads(loaded.stdout)["poison"]

    port = free_port("127.0.0.1")
    rules = write_rules(queue, tmp_path)
    run = [sys.executable, "-m", "queueplane.cli", "run", str(spec), "--metrics-port", str(port), "--until-idle", "5m"]
    worker = subprocess.Popen(
        [*run, "-o", "json", *cluster], cwd=REPO, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # The labels the Prometheus Operator gives a PodMonitor's targets.
    targets = {f"127.0.0.1:{port}": {"namespace": namespace, "pod": f"{name}-driver"}}
    try:
        with LocalPrometheus(tmp_path / "prometheus", targets, rule_files=(rules,)) as prometheus:
            selector = f'namespace="{namespace}",queue="{name}"'
            finished = f'sum(queueplane_records_total{{{selector},outcome=~"accepted|dlq"}})'
            wait_for(
                "every record finished, scraped", lambda: _value(prometheus, finished) == COUNT or None, 300, every_s=1
            )
            dlq = _value(prometheus, f'sum(queueplane_records_total{{{selector},outcome="dlq"}})')
            assert dlq == poison, "the DLQ count Prometheus scraped is the poison loaded"
            pending = f"max(queueplane_dead_letters_pending{{{selector}}})"
            assert wait_for("the DLQ's count", lambda: _value(prometheus, pending) == poison, 60, every_s=1)
            oldest = f"max(queueplane_oldest_waiting_seconds{{{selector}}})"
            assert wait_for(
                "the caught-up queue's oldest wait", lambda: _value(prometheus, oldest) == 0 or None, 60, every_s=1
            )
            assert _value(prometheus, f"max(queueplane_target_lag_seconds{{{selector}}})") == queue.target_lag_seconds

            # The chart's alert rules load and evaluate on the scraped series without error.
            def evaluated() -> list[dict] | None:
                groups = prometheus.api("rules")["groups"]
                loaded_rules = [rule for group in groups for rule in group["rules"]]
                done = all(r.get("lastEvaluation", "0001").startswith("20") for r in loaded_rules)
                return loaded_rules if loaded_rules and done else None

            loaded_rules = wait_for("the rules to be evaluated", evaluated, 60, every_s=1)
            assert {r["name"] for r in loaded_rules} == {
                "QueueplaneLagOverTarget",
                "QueueplaneDeadLettering",
                "QueueplaneNoProgress",
                "QueueplaneExecutorsAtMax",
            }
            assert all(r["health"] == "ok" for r in loaded_rules), loaded_rules

            # Every dashboard query runs; all but the executor lines have data from a local worker.
            queries = dashboard_queries(namespace, name, "15s")

            def only_executors_empty() -> set[str] | None:
                empty = {title for title, expr in queries.items() if not prometheus.query(expr)}
                return empty if empty == EMPTY_IN_LOCAL_MODE else None

            wait_for("every dashboard query but the executors' to have data", only_executors_empty, 30, every_s=1)
    finally:
        worker.terminate()
        _out, err = worker.communicate(timeout=120)
    assert worker.returncode in (0, -15), err[-3000:]
