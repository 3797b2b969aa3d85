"""The producer-wide failure report: each refusal claimed once, by the writer of the same bytes."""

from __future__ import annotations

from confluent_kafka import KafkaError
from helpers import Reported

from queueplane.handler_api import InvalidOutput
from queueplane.run.executor.failed_writes import FailedWrites, fingerprints

TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)


def test_a_refusal_is_claimed_by_the_writer_of_those_bytes_and_only_once():
    failed = FailedWrites()
    mine = fingerprints([("out", b"k", b"big" * 1000, [])])
    other = fingerprints([("out", b"k", b"small", [])])
    # The callback gives bytes objects of its own, equal to what was written.
    failed(TOO_LARGE, Reported("out", bytes(bytearray(b"k")), bytes(bytearray(b"big" * 1000))))
    assert failed.refusals == 1
    assert failed.claim(other) is None
    why = failed.claim(mine)
    assert isinstance(why, InvalidOutput) and "refused" in str(why)
    assert failed.claim(mine) is None and failed.refusals == 0
    assert failed.errors == 0


def test_two_records_that_wrote_the_same_bytes_each_claim_their_own_refusal():
    failed = FailedWrites()
    same = fingerprints([("out", None, b"x", [])])
    for _ in range(2):
        failed(TOO_LARGE, Reported("out", None, b"x"))
    assert failed.claim(same) is not None
    assert failed.claim(same) is not None
    assert failed.claim(same) is None


def test_a_record_with_several_refused_outputs_claims_them_all_at_once():
    failed = FailedWrites()
    written = fingerprints([("out", None, b"a", []), ("audit", None, b"b", [])])
    failed(TOO_LARGE, Reported("out", None, b"a"))
    failed(TOO_LARGE, Reported("audit", None, b"b"))
    assert failed.claim(written) is not None
    assert failed.refusals == 0, "no refusal of this record is left for another to claim"


def test_a_failure_that_is_not_a_refusal_is_counted_and_named_not_claimable():
    failed = FailedWrites()
    failed(KafkaError(KafkaError._MSG_TIMED_OUT), Reported("out", None, b"a"))
    assert failed.errors == 1 and "out" in failed.last_error
    assert failed.claim(fingerprints([("out", None, b"a", [])])) is None
