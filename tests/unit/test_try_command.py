"""`queueplane try`: each example spec's handler on a good record and a poison one, without Spark or Kafka.

The records are those the integration tests load into each example queue (`queueplane load`:
good orders, and poison ones cut in half), where the worker accepts the good ones and
dead-letters the poison with a Reject (tests/integration/test_examples.py): the same here.
"""

from __future__ import annotations

import json
import random

import pytest
from helpers import EXAMPLE_SPECS, run_cli

from queueplane.errors import EXIT_FAILED, EXIT_INVALID
from queueplane.ops.load import make_order


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_an_example_spec_accepts_a_good_order_and_dead_letters_a_poison_one(spec, tmp_path, cli_env):
    _, key, good = make_order(1, 64, random.Random(7), slow=False)
    records = tmp_path / "records.txt"
    records.write_bytes(good + b"\n" + good[: len(good) // 2] + b"\n")

    tried = run_cli(["try", str(spec), "--file", str(records), "--key", key.decode(), "-o", "json"], cli_env)
    assert tried.returncode == 0, tried.stderr
    result = json.loads(tried.stdout)
    good_one, poison = result["records"]
    assert good_one["outcome"] == "accepted" and good_one["key"] == key.decode()
    assert poison["outcome"] == "dlq" and poison["error_class"] == "Reject", poison
    assert result["counts"] == {"accepted": 1, "dlq": 1}

    table = run_cli(["try", str(spec), "--value", good.decode(), "--header", "trace=1", "--no-color"], cli_env)
    assert table.returncode == 0, table.stderr
    assert "accepted" in table.stdout


def test_a_retry_shows_each_delivery_until_the_dlq_or_one_with_once(tmp_path, cli_env):
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "flaky.py").write_text(
        "from queueplane import Retry\n"
        "calls = []\n"
        "def setup():\n    calls.append('setup')\n"
        "def handle(record):\n"
        "    print('a handler that prints')\n"
        "    assert calls == ['setup']\n"
        "    raise Retry('the provider is down')\n"
    )
    spec = EXAMPLE_SPECS[0].read_text().replace("cafe.handlers:prepare_drink", "flaky:handle")
    spec = spec.replace("    concurrency: 16", "    setup: flaky:setup\n    concurrency: 16")
    (folder / "queue.yaml").write_text(spec)

    tried = run_cli(["try", str(folder / "queue.yaml"), "--value", "x", "-o", "json"], cli_env)
    assert tried.returncode == 0, tried.stderr
    (record,) = json.loads(tried.stdout)["records"]
    assert (record["outcome"], record["deliveries"], record["error_class"]) == ("dlq", 5, "Retry")
    assert "a handler that prints" in tried.stderr, "what a handler prints stays out of the JSON"

    once = run_cli(["try", str(folder / "queue.yaml"), "--value", "x", "--once", "-o", "json"], cli_env)
    (record,) = json.loads(once.stdout)["records"]
    assert record["outcome"] == "released" and "broker delivers it again" in record["next"]


def test_bad_input_is_one_paragraph_naming_what_is_wrong(tmp_path, cli_env):
    spec = str(EXAMPLE_SPECS[0])
    cases = [
        (["try", spec, "--value", "x", "--header", "no-equals"], EXIT_INVALID, "--header 'no-equals'"),
        (["try", spec, "--file", str(tmp_path / "none.txt")], EXIT_INVALID, "--file"),
        (["try", str(tmp_path / "none.yaml"), "--value", "x"], EXIT_INVALID, "none.yaml"),
    ]
    broken = tmp_path / "broken.yaml"
    broken.write_text(EXAMPLE_SPECS[0].read_text().replace("cafe.handlers:prepare_drink", "cafe.nowhere:prepare"))
    cases.append((["try", str(broken), "--value", "x"], EXIT_INVALID, "/spec/processing/handler: cannot import"))
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "hooks.py").write_text("def handle(r):\n    pass\ndef boom():\n    raise OSError('no database')\n")
    (failing / "queue.yaml").write_text(
        EXAMPLE_SPECS[0]
        .read_text()
        .replace("cafe.handlers:prepare_drink", "hooks:handle")
        .replace("    concurrency: 16", "    setup: hooks:boom\n    concurrency: 16")
    )
    cases.append((["try", str(failing / "queue.yaml"), "--value", "x"], EXIT_FAILED, "/spec/processing/setup"))
    for args, code, named in cases:
        result = run_cli(args, cli_env)
        assert result.returncode == code, (args, result.stderr)
        assert named in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
