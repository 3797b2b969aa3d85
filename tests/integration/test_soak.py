"""The soak benchmark's three-minute version: memory flat after warm-up, nothing lost.

The full run is `bench/soak.py` (30 minutes, in `make bench`); this one catches a leak fast
enough to show within three minutes and checks the same promises.
"""

from __future__ import annotations

import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import soak

pytestmark = pytest.mark.kafka


def test_three_minutes_of_steady_load_lose_nothing_and_memory_stays_flat(kafka, tmp_path, record_property):
    result = soak.run_soak(3, 100, tmp_path, kafka, tail_s=30)
    for group, figures in result["queues"].items():
        record_property(f"soak_{group}_rss_growth", figures["rss_growth_last_two_thirds"])
        print(f"\nsoak {group}: {figures['produced']} produced, RSS MiB {figures['rss_mib_first_last_max']}")
        assert figures["produced"] >= 3 * 60 * 100 * 0.95, "the load ran at its rate"
        assert figures["lost"] == 0, figures["lost_examples"]
        assert figures["rss_growth_last_two_thirds"] < soak.MAX_GROWTH, figures["rss_mib_first_last_max"]
