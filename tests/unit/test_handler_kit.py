"""The handler author's kit (queueplane.testing): a handler called as the worker calls it."""

from __future__ import annotations

import random
import sys
import threading

import pytest
from helpers import EXAMPLE_SPECS

from queueplane import Output, Reject, Retry, testing
from queueplane.ops.load import make_order
from queueplane.run import outcomes
from queueplane.run.share import settings as share_settings
from queueplane.testing import HandlerRunner, make_record
from queueplane.testing.pytest_plugin import handler_runner  # noqa: F401  (the fixture, as a team imports it)


def example_records() -> tuple[bytes, bytes, bytes]:
    """A good record of `queueplane load` (key, value) and a poison one (its value cut in half),
    as the integration tests load them into each example queue (tests/integration/test_examples.py)."""
    _, key, value = make_order(1, 64, random.Random(7), slow=False)
    return key, value, value[: len(value) // 2]


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_an_example_handler_accepts_a_good_order_and_dead_letters_a_poison_one(spec, handler_runner):  # noqa: F811
    key, good, poison = example_records()
    runner = handler_runner(spec)

    accepted = runner.deliver(make_record(good, key))
    assert accepted.outcome == testing.ACCEPTED and accepted.error is None
    if runner.output_topic is not None:
        assert [w.topic for w in accepted.outputs] == [runner.output_topic]
        assert accepted.outputs[0].key == key, "an output keeps the input's key"
    else:
        assert accepted.outputs == []

    dead = runner.deliver(make_record(poison, key))
    assert dead.outcome == testing.DEAD_LETTERED and dead.error_class == "Reject"
    assert dead.error_message.startswith("value is not JSON")
    assert dead.dead_letter_headers()["queueplane.error.class"] == "Reject"


def test_a_record_is_built_from_a_value_key_and_headers_with_a_first_deliverys_defaults():
    record = make_record({"id": 1}, "k", {"trace": "abc", "empty": None})
    assert (record.value, record.key) == (b'{"id":1}', b"k")
    assert record.headers == (("trace", b"abc"), ("empty", None))
    assert record.json() == {"id": 1} and record.header("trace") == b"abc"
    assert (record.delivery_count, record.partition, record.offset) == (1, 0, 0)


@pytest.mark.parametrize("group_type", testing.GROUP_TYPES)
def test_retry_and_any_other_exception_release_the_record_until_its_last_delivery(group_type):
    def flaky(record):
        raise Retry("the barista is busy") if record.json()["retry"] else RuntimeError("a bug")

    runner = HandlerRunner(flaky, group_type=group_type, delivery_limit=3)
    first = runner.deliver(make_record({"retry": True}))
    assert first.retried and first.error == "Retry: the barista is busy"
    assert runner.deliver(make_record({"retry": False})).error_class == "RuntimeError"

    last = runner.handle(make_record({"retry": True}))
    assert last.dead_lettered and last.deliveries == 3 and last.error_class == "Retry"
    assert last.dead_letter_headers()["queueplane.delivery.count"] == "3"


def test_sys_exit_in_a_handler_counts_as_retry_not_as_the_end_of_the_test():
    verdict = testing.call(lambda record: sys.exit(3), b"x")
    assert verdict.retried and verdict.error_class == "SystemExit"


def test_a_handler_that_succeeds_on_its_second_delivery_is_accepted_there():
    def second_time_lucky(record):
        if record.delivery_count < 2:
            raise Retry("not yet")
        return b"done"

    verdict = HandlerRunner(second_time_lucky, output_topic="out").handle(make_record(b"x"))
    assert verdict.accepted and verdict.deliveries == 2 and verdict.outputs[0].value == b"done"


@pytest.mark.parametrize(
    "group_type, message",
    [
        ("consumer", "handler ran past its deadline of 0.2s"),
        ("share", "the handler ran past its deadline"),
        ("kmq", "ran past lockDuration (0.2s)"),
    ],
)
def test_a_call_past_its_deadline_is_given_up_as_a_timeout(group_type, message):
    release = threading.Event()
    # A handler that returns only when released: by the test once the call was given up, or after
    # a minute by this timer, when nothing gave it up (the verdict is then an accepted one).
    safety = threading.Timer(60, release.set)
    safety.start()
    runner = HandlerRunner(lambda record: release.wait(), group_type=group_type, lock_duration_s=0.2)
    try:
        verdict = runner.deliver(make_record(b"x"))
    finally:
        safety.cancel()
        release.set()
    assert verdict.retried and (verdict.error_class, verdict.error_message) == ("Timeout", message)
    assert runner.deadline_s == pytest.approx(0.14 if group_type == "share" else 0.2)


@pytest.mark.parametrize(
    "returned",
    [42, Output({"at": object()}), Output(b"x", headers={"h": 5}), Output(b"x" * 2_000_000)],
    ids=["not-an-output", "not-json", "header-not-bytes", "too-large"],
)
def test_outputs_the_worker_cannot_write_dead_letter_the_record_as_invalid_output(returned):
    verdict = testing.call(lambda record: returned, b"x", output_topic="out")
    assert verdict.dead_lettered and verdict.error_class == "InvalidOutput", verdict.error


def test_outputs_without_an_output_topic_fail_the_delivery_as_the_worker_does():
    verdict = testing.call(lambda record: b"x", b"x")
    assert verdict.retried and "processing.output.topic" in verdict.error_message


def test_reject_dead_letters_at_once_whatever_the_delivery():
    def refuse(record):
        raise Reject("unknown drink")

    verdict = testing.call(refuse, b"x", group_type="share")
    assert verdict.dead_lettered and verdict.deliveries == 1
    assert verdict.next_step == "written to the DLQ, then rejected (archived by the broker)"


def test_setup_runs_once_before_the_first_call_and_teardown_at_close(handler_runner):  # noqa: F811
    happened: list[str] = []
    runner = handler_runner(
        handler=lambda record: happened.append("call"),
        setup=lambda: happened.append("setup"),
        teardown=lambda: happened.append("teardown"),
    )
    assert happened == [], "setup waits for the first call"
    runner.deliver(make_record(b"1"))
    runner.deliver(make_record(b"2"))
    runner.close()
    runner.close()
    assert happened == ["setup", "call", "call", "teardown"]


def test_the_kit_speaks_the_workers_words():
    assert (testing.ACCEPTED, testing.RELEASED, testing.DEAD_LETTERED) == (
        outcomes.ACCEPTED,
        outcomes.RELEASED,
        outcomes.DEAD_LETTERED,
    )
    assert testing.SHARE_HANDLER_SHARE_OF_LOCK == share_settings.HANDLER_SHARE_OF_LOCK
