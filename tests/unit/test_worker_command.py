"""One worker command line: `queueplane run` and spark_apps/queue_worker.py take the same flags.

Both start the same worker application; their flags are added in one place
(queueplane/cli/worker_command.py) and only the defaults that follow from where each runs
differ (its ``Place``). These tests hold the two parsers together, and hold the entrypoint to
the command lines its callers build: the chart's driver pod and the spark-submit target.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
from helpers import EXAMPLES, REPO
from specs_factory import dump, set_path, spec

from queueplane.cli.app import build_parser
from queueplane.cli.worker_command import SUBMITTED, WORKSTATION, Place, run_options
from queueplane.deploy.render import render
from queueplane.deploy.spark_submit import SubmitSettings, submission
from queueplane.errors import EXIT_INVALID
from queueplane.kafka.target import KafkaTarget
from queueplane.provision import steps
from queueplane.spec.rules import check_text

ENTRYPOINT = REPO / "spark_apps" / "queue_worker.py"
# The flags whose defaults follow from where the command runs (Place), and --no-color, which
# `queueplane` leaves unset after a command so that it may come before it too.
PLACED = {"local", "metrics_port", "metrics_host", "output", "no_color"}


def _entrypoint() -> ModuleType:
    """spark_apps/queue_worker.py as spark-submit runs it: a file, not an installed module."""
    loader = importlib.util.spec_from_file_location("queue_worker_under_test", ENTRYPOINT)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


def _cli_run() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["run"]


def _flags(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Each argument by its name (its flags, or its metavar), with what it means."""
    flags = {}
    for action in parser._actions:
        name = " ".join(action.option_strings) or str(action.metavar)
        flags[name] = {
            "dest": action.dest,
            "kind": type(action).__name__,
            "nargs": action.nargs,
            "choices": action.choices,
            "metavar": action.metavar,
            "help": action.help,
            "default": action.default,
        }
    return flags


def test_queueplane_run_and_the_entrypoint_accept_exactly_the_same_flags_with_one_meaning():
    cli, entrypoint = _flags(_cli_run()), _flags(_entrypoint().parser())
    assert sorted(cli) == sorted(entrypoint), "a flag in one worker command only"
    for name in cli:
        meaning = {k: v for k, v in cli[name].items() if k != "default"}
        assert meaning == {k: v for k, v in entrypoint[name].items() if k != "default"}, name
        if cli[name]["dest"] not in PLACED:
            assert cli[name]["default"] == entrypoint[name]["default"], name
    # The flags that drifted apart while each command had its own copy.
    assert {"--scale-interval", "--tasks", "--max-duration", "--local --no-local", "--spec"} <= set(cli)


@pytest.mark.parametrize(
    "parser, place", [(_cli_run, WORKSTATION), (lambda: _entrypoint().parser(), SUBMITTED)], ids=["run", "entrypoint"]
)
def test_local_mode_is_a_pair_of_flags_whose_default_is_the_places(parser, place: Place):
    assert run_options(parser().parse_args(["q.yaml"])).local is place.local
    assert run_options(parser().parse_args(["q.yaml", "--no-local"])).local is False
    assert run_options(parser().parse_args(["q.yaml", "--local"])).local is True


def test_every_flag_becomes_its_run_option():
    args = _cli_run().parse_args(
        [
            *("--spec", "a.yaml", "b.yaml", "--no-local", "--until-idle", "10s", "--max-records", "500"),
            *("--max-duration", "1h30m", "--metrics-port", "9500", "--metrics-host", "0.0.0.0", "--tasks", "6"),
            *("--checkpoint-dir", "/cp", "--max-batch-records", "2000", "--event-log-dir", "s3a://b/events"),
            *("--scale-interval", "3s", "--scale-down-cooldown", "6s"),
        ]
    )
    options = run_options(args)
    assert (options.local, options.until_idle_s, options.max_records, options.max_duration_s) == (False, 10, 500, 5400)
    assert (options.metrics_port, options.metrics_host, options.tasks) == (9500, "0.0.0.0", 6)
    assert (options.checkpoint_dir, options.max_batch_records, options.event_log_dir) == ("/cp", 2000, "s3a://b/events")
    assert options.scaling == {"interval_s": 3, "up_cooldown_s": 3, "down_cooldown_s": 6}
    assert [*args.spec, *args.spec_flags] == ["b.yaml", "a.yaml"]


@pytest.mark.parametrize("command", [["-m", "queueplane", "run"], [str(ENTRYPOINT)]], ids=["run", "entrypoint"])
@pytest.mark.parametrize(
    "flag, value", [("--until-idle", "10"), ("--scale-down-cooldown", "1 minute"), ("--max-duration", "1.5m")]
)
def test_a_bad_duration_is_one_line_naming_its_flag(command, flag, value, tmp_path):
    # Nothing is read or reached before the flags are: no spec file, no cluster, no Spark.
    done = subprocess.run(
        [sys.executable, *command, "q.yaml", flag, value, "-o", "text"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == EXIT_INVALID, done.stderr
    assert done.stderr.startswith(f"error: {flag}: {value!r} is not a duration such as 500ms"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_the_command_lines_the_chart_renders_are_the_entrypoints(tmp_path):
    (queue,) = steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)
    overrides = {
        "spark": {"eventLog": {"enabled": True, "dir": "s3a://bucket/events"}},
        "checkpoint": {"objectStorePath": "s3a://bucket/checkpoints"},
        "queueResource": {"enabled": True},
        "metrics": {"port": 9555},
    }
    objects = render(queue, output_dir=tmp_path, overrides=overrides).objects
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    script, *args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert script == "/opt/queueplane/spark_apps/queue_worker.py"
    parsed = _entrypoint().parser().parse_args(args)
    options = run_options(parsed)
    assert parsed.spec_flags == [f"/etc/queueplane/spec/{queue.name}.yaml"] and parsed.status_namespace
    assert (options.local, options.metrics_port, options.metrics_host) == (False, 9555, "0.0.0.0")
    assert (options.event_log_dir, options.checkpoint_dir) == ("s3a://bucket/events", "s3a://bucket/checkpoints")


def test_the_command_line_spark_submit_is_given_is_the_entrypoints(tmp_path):
    doc = set_path(spec("share"), "spec/deployment", {"target": "spark-submit"})
    path = tmp_path / "brew.yaml"
    path.write_text(dump(doc))
    (queue,) = check_text(path.read_text(), str(path)).raise_if_invalid()
    settings = SubmitSettings.from_variable(
        {"auth_secret_file": "/etc/spark/auth.args", "checkpoint_dir": "hdfs:///queueplane/", "metrics_port": 9600},
        "Airflow Variable queueplane_spark_submit",
    )
    plan = submission(queue, KafkaTarget({"bootstrap.servers": "kafka-1:9092"}, "kafka-1:9092"), settings)
    script, _py_files, *args = plan.application_args
    assert script.endswith("spark_apps/queue_worker.py")
    options = run_options(_entrypoint().parser().parse_args(args))
    assert (options.local, options.metrics_port) == (False, 9600)
    assert options.checkpoint_dir == f"hdfs:///queueplane/{queue.team}/{queue.name}"
