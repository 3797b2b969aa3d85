"""The soak benchmark's three-minute version: nothing lost, and the Python side flat after warm-up.

The full run is `bench/soak.py` (30 minutes, in `make bench`): the whole worker's memory,
JVM included, must grow less than 10% over its last 20 minutes. Three minutes are not enough
for the JVM, whose heap still grows toward its bound (deployment memory) then; the Python
processes, where the runtimes keep their per-record state, must be flat already, so a leak
there shows here.

It is not marked heavy: its load is 100 records/s per queue and it asserts memory and counts,
not time, so it runs beside the light tests (tests/parallel.py).
"""

from __future__ import annotations

import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import soak

pytestmark = pytest.mark.kafka


def test_three_minutes_of_steady_load_lose_nothing_and_python_memory_stays_flat(kafka, tmp_path, record_property):
    result = soak.run_soak(3, 100, tmp_path, kafka, tail_s=30)
    for group, figures in result["queues"].items():
        record_property(f"soak_{group}_python_rss_growth", figures["python_rss_growth_last_two_thirds"])
        assert figures["produced"] >= 3 * 60 * 100 * 0.95, "the load ran at its rate"
        assert figures["lost"] == 0, figures["lost_examples"]
        python = [round(s["python_mib"]) for s in figures["samples"]]
        assert figures["python_rss_growth_last_two_thirds"] < soak.MAX_GROWTH, (group, python)
        # The JVM's heap is bounded by the spec's memory (2 GiB in local mode): the whole stays under it.
        assert max(s["rss_mib"] for s in figures["samples"]) < 3 * 1024, (group, figures["rss_mib_first_last_max"])
