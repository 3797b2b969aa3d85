"""Executor pod names: two drivers of one queue (a rolling update) never name an executor alike."""

from __future__ import annotations

import re

from queueplane.run.spark.session import EXECUTOR_PREFIX_MAX, executor_prefix

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_each_driver_pod_gets_its_own_prefix(monkeypatch):
    monkeypatch.setenv("POD_NAME", "coffee-orders-5677dd7d8b-4dt7j")
    old = executor_prefix("coffee-orders")
    monkeypatch.setenv("POD_NAME", "coffee-orders-6c9f8d7b5a-x2k9q")
    new = executor_prefix("coffee-orders")
    assert (old, new) == ("coffee-orders-4dt7j", "coffee-orders-x2k9q")


def test_the_longest_queue_name_still_makes_a_valid_executor_pod_name(monkeypatch):
    name = "a" * 40 + "-" + "b" * 12  # 53 characters, the spec's limit
    monkeypatch.setenv("POD_NAME", f"{name}-5677dd7d8b-4dt7j")
    prefix = executor_prefix(name)
    assert len(prefix) <= EXECUTOR_PREFIX_MAX and prefix.endswith("-4dt7j")
    assert DNS_LABEL.match(f"{prefix}-exec-128") and len(f"{prefix}-exec-128") <= 63
