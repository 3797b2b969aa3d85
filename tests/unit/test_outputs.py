"""A handler's outputs as records to produce: the fast path for plain bytes and the checked path
for everything else must give the same records and refuse the same mistakes."""

from __future__ import annotations

import pickle

import pytest

from queueplane.handler_api import InvalidOutput, Output, Record, outputs_of
from queueplane.run.executor.outputs import output_record

RECORD = Record.make(b"in-key", b"in-value", (), "orders", 2, 41, 1, 0)


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (Output(b"v"), ("out", b"in-key", b"v", [])),  # the fast path
        (Output("text"), ("out", b"in-key", b"text", [])),
        (Output({"a": 1}), ("out", b"in-key", b'{"a":1}', [])),
        (Output(b"v", key=b"k"), ("out", b"k", b"v", [])),
        (Output(b"v", key="k"), ("out", b"k", b"v", [])),
        (Output(b"v", headers={"h": "x", "g": b"y"}), ("out", b"in-key", b"v", [("h", b"x"), ("g", b"y")])),
        (Output(b"v", headers={}), ("out", b"in-key", b"v", [])),
        (Output(b"v", topic="elsewhere"), ("elsewhere", b"in-key", b"v", [])),
        (Output(None), ("out", b"in-key", None, [])),
        (Output(bytearray(b"v")), ("out", b"in-key", b"v", [])),
    ],
)
def test_an_output_becomes_the_record_its_fields_say(output: Output, expected: tuple) -> None:
    assert output_record(output, RECORD, "out") == expected


@pytest.mark.parametrize(
    ("output", "says"),
    [
        (Output(5), "the output value is int"),
        (Output(b"v", key=5), "the output key is int"),
        (Output(b"v", headers=[("h", b"x")]), "output headers are a dict"),
        (Output(b"v", headers=[]), "output headers are a dict"),  # empty, still not a dict
        (Output(b"v", headers={1: b"x"}), "header name is int"),
        (Output(b"v", headers={"h": 5}), "output header 'h' is int"),
        (Output(b"v", topic=5), "the output topic is int"),
        (Output({"a": object()}), "not JSON-serialisable"),
        (Output("\ud800"), "the output value is not valid text"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_by_name(output: Output, says: str) -> None:
    with pytest.raises(InvalidOutput, match=says):
        output_record(output, RECORD, "out")


def test_outputs_without_a_topic_anywhere_are_a_spec_error_not_a_dead_letter() -> None:
    with pytest.raises(RuntimeError, match=r"processing\.output\.topic"):
        output_record(Output(b"v"), RECORD, None)
    assert output_record(Output(b"v", topic="named"), RECORD, None)[0] == "named"


def test_outputs_are_immutable_and_cross_to_another_process_as_they_are() -> None:
    output = Output(b"a")
    with pytest.raises(AttributeError):
        output.value = b"changed"  # type: ignore[misc]
    # The isolated share runtime pickles a child's outputs back to its parent.
    for sent in (output, Output({"a": 1}, key="k", headers={"h": b"x"}, topic="t")):
        assert pickle.loads(pickle.dumps(sent)) == sent
        assert output_record(pickle.loads(pickle.dumps(sent)), RECORD, "out") == output_record(sent, RECORD, "out")


@pytest.mark.parametrize(
    ("returned", "values"),
    [
        (None, []),
        (b"v", [b"v"]),
        ("v", ["v"]),
        ({"a": 1}, [{"a": 1}]),
        (Output(b"v"), [b"v"]),
        ([b"a", Output(b"b")], [b"a", b"b"]),
        ((b"a", b"b"), [b"a", b"b"]),
    ],
)
def test_what_a_handler_returns_is_read_as_its_outputs(returned: object, values: list) -> None:
    outputs = outputs_of(returned)
    assert all(isinstance(o, Output) for o in outputs)
    assert [o.value for o in outputs] == values
