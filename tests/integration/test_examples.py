"""Every example spec runs as it is: its handler ships beside it, and a load ends accepted or in the DLQ.

These are the demo's queues and its commands: a normal start and run log the worker's own batch
lines and no error line or stack trace, poison records included (they are outcomes, not errors).
"""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import EXAMPLE_SPECS, TROUBLE, run_cli, tagged_examples, unique_tag
from worker_support import read_all

pytestmark = pytest.mark.kafka

COUNT = 300


@pytest.mark.parametrize("example", [p.name for p in EXAMPLE_SPECS])
def test_an_example_processes_a_load_with_its_own_handler(example, kafka, cli_env, tmp_path):
    spec = next(p for p in tagged_examples(tmp_path, unique_tag()).values() if p.name == example)
    cluster = ["--bootstrap-servers", kafka.bootstrap]
    applied = run_cli(["apply", str(spec), "--yes", *cluster], cli_env)
    assert applied.returncode == 0, applied.stderr

    load = ["load", str(spec), "--count", str(COUNT), "--poison-rate", "0.03", "--slow-rate", "0.02", "-o", "json"]
    loaded = run_cli([*load, *cluster], cli_env)
    assert loaded.returncode == 0, loaded.stderr
    poison = json.loads(loaded.stdout)["poison"]
    assert poison > 0

    ran = run_cli(["run", str(spec), "--until-idle", "5s", "-o", "json", *cluster], cli_env, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert " queueplane.worker: batch " in ran.stderr, ran.stderr[-3000:]
    assert not TROUBLE.findall(ran.stderr), ran.stderr[-4000:]
    summary = json.loads(ran.stdout)
    counts = summary["counts"]
    assert counts["accepted"] == COUNT - poison, counts
    assert counts["dlq"] == poison, counts
    assert all(d["error"].startswith("Reject") for d in summary["dead_lettered"]), "only the poison is dead-lettered"

    output = yaml.safe_load(spec.read_text())["spec"]["processing"].get("output")
    if output:
        written = read_all(kafka, output["topic"], expect_at_least=COUNT - poison)
        values = [json.loads(m.value()) for m in written]
        ids = [value.get("id") or value["order"] for value in values]
        assert len(ids) == len(set(ids)) == COUNT - poison, "each accepted record's output once"
