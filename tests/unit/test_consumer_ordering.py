"""The consumer runtime's ordering rules: key slots, backoff bounds, the committable prefix."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueplane.errors import UsageError
from queueplane.kafka.target import java_client_settings
from queueplane.ops.dlq import parse_where
from queueplane.run.consumer.executor.ordering import ContiguousOffsets, fnv1a_32, key_slot
from queueplane.run.executor.retry import retry_delay_ms


def test_fnv1a_32_matches_the_published_test_vectors():
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968


def test_keyless_records_share_one_slot_and_a_key_always_lands_in_the_same_slot():
    assert key_slot(None, 8) == 0
    assert key_slot(b"order-17", 1) == 0
    assert key_slot(b"order-17", 8) == fnv1a_32(b"order-17") % 8
    slots = {key_slot(f"key-{i}".encode(), 8) for i in range(64)}
    assert slots == set(range(8)), "64 keys spread over every one of 8 slots"


@given(
    attempt=st.integers(1, 30),
    backoff=st.integers(1, 10_000),
    extra=st.integers(0, 600_000),
    seed=st.integers(0, 2**32),
)
def test_retry_delay_grows_but_stays_between_backoff_and_max_backoff(attempt, backoff, extra, seed):
    maximum = backoff + extra
    delay = retry_delay_ms(attempt, backoff, maximum, random.Random(seed))
    assert backoff <= delay <= maximum
    cap = min(maximum, backoff * 2 ** (attempt - 1))
    assert delay >= min(cap / 2, maximum) or delay == backoff


def test_the_watermark_never_passes_an_offset_still_in_flight():
    offsets = ContiguousOffsets()
    offsets.add([10, 11])
    offsets.add([13, 14])  # 12 was a transaction marker: never handed out
    offsets.complete(11, "b")
    offsets.complete(13, "c")
    assert offsets.advance() == [] and offsets.watermark == 10
    offsets.complete(10, "a")
    assert offsets.advance() == ["a", "b", "c"] and offsets.watermark == 14
    assert offsets.unfinished == 1
    offsets.complete(14, "d")
    assert offsets.advance(end=16) == ["d"] and offsets.watermark == 16


def test_java_client_settings_translate_sasl_and_a_pem_ca():
    java = java_client_settings(
        {
            "bootstrap.servers": "k:9093",
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "qp",
            "sasl.password": 's"cret',
            "ssl.ca.location": "/etc/ca.pem",
        }
    )
    assert java["security.protocol"] == "SASL_SSL" and java["sasl.mechanism"] == "SCRAM-SHA-512"
    assert java["sasl.jaas.config"].startswith("org.apache.kafka.common.security.scram.ScramLoginModule required")
    assert 'password="s\\"cret"' in java["sasl.jaas.config"]
    assert java["ssl.truststore.type"] == "PEM" and java["ssl.truststore.location"] == "/etc/ca.pem"


def test_java_client_settings_carry_a_client_certificate_for_mtls_as_inline_pem(tmp_path):
    (tmp_path / "client.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (tmp_path / "client.key").write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    java = java_client_settings(
        {
            "bootstrap.servers": "k:9093",
            "security.protocol": "ssl",
            "ssl.ca.pem": "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
            "ssl.certificate.location": str(tmp_path / "client.pem"),
            "ssl.key.location": str(tmp_path / "client.key"),
            "ssl.key.password": "k3y",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert java["security.protocol"] == "SSL" and java["ssl.keystore.type"] == "PEM"
    assert java["ssl.keystore.certificate.chain"].startswith("-----BEGIN CERTIFICATE-----\nMIIB")
    assert java["ssl.keystore.key"].startswith("-----BEGIN PRIVATE KEY-----\nMIIE")
    assert java["ssl.key.password"] == "k3y" and java["ssl.truststore.certificates"].startswith("-----BEGIN")
    assert java["ssl.endpoint.identification.algorithm"] == ""
    with pytest.raises(UsageError, match=r"ssl\.key\.location"):
        java_client_settings({"ssl.certificate.location": str(tmp_path / "client.pem"), "ssl.key.location": "/no"})


def test_where_filters_need_key_equals_value():
    assert parse_where(["error.class=Timeout", "key=a=b"]) == [("error.class", "Timeout"), ("key", "a=b")]
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_where(["error.class"])
