"""The platform file's guardrails: a spec gets only what its team is allowed, whatever it asks for.

Each refusal is an invalid-spec verdict (exit 2, the file and field named), so nothing is
applied or deployed; tests/integration/test_guardrails.py shows that against a real broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, run_cli
from specs_factory import dump, set_path, spec

from queueplane.spec.platform import image_allowed
from queueplane.spec.rules import load_specs

PLATFORM = {
    "apiVersion": "queueplane.io/v1",
    "kind": "Platform",
    "defaults": {"images": ["registry.example.com/qp/"], "limits": {"maxExecutors": 12}},
    "teams": {
        "kitchen": {"topicPrefixes": ["brew."], "limits": {"executorMemory": "4g"}},
        "victim-team": {"namespaces": ["victims"], "topicPrefixes": ["victim."]},
    },
}


def _repo(tmp_path: Path, doc: dict, folder: str = "kitchen", platform: dict | None = PLATFORM) -> Path:
    """A specs tree: the platform file at its root and one spec in ``folder``."""
    root = tmp_path / "specs"
    (root / folder).mkdir(parents=True)
    if platform is not None:
        (root / "platform.yaml").write_text(yaml.safe_dump(platform, sort_keys=False))
    path = root / folder / "queue.yaml"
    path.write_text(dump(doc))
    return path


def _problems(path: Path) -> dict[str, str]:
    return {p.pointer: p.render() for p in load_specs([str(path.parent.parent)]).problems}


def test_a_spec_inside_its_allowance_is_valid(tmp_path):
    path = _repo(tmp_path, spec("share"))
    loaded = load_specs([str(path.parent.parent)])
    assert loaded.problems == []
    assert [q.name for q in loaded.queues] == ["brew-orders"]


def test_a_spec_posing_as_another_team_in_kube_system_with_a_foreign_image_is_refused_field_by_field(tmp_path, cli_env):
    doc = spec("share", name="coredns")
    set_path(doc, "metadata/team", "victim-team")
    set_path(doc, "spec/deployment/namespace", "kube-system")
    set_path(doc, "spec/deployment/image", "evil.example.com/miner:1")
    path = _repo(tmp_path, doc, folder="attacker")

    result = run_cli(["validate", str(path.parent.parent)], cli_env)

    assert result.returncode == 2, result.stdout + result.stderr
    said = result.stdout + result.stderr
    assert "Traceback" not in said
    assert f'{path}: /metadata/team: is "victim-team" but the spec is in {path.parent}/' in said
    assert f"move the file to {path.parent.parent}/victim-team/" in said
    assert '/spec/deployment/namespace: "kube-system" is not a namespace team "victim-team" may deploy to' in said
    assert "(allowed: victims;" in said
    assert '/spec/deployment/image: "evil.example.com/miner:1" is not from a registry or repository' in said
    # The topics are the kitchen's, not the victim team's.
    assert '/spec/topic/name: "brew.orders.v1" does not start with a topic prefix team "victim-team" owns' in said
    assert '/spec/deadLetter/topic: "brew.orders.v1.dlq" does not start' in said


def test_a_team_missing_from_the_platform_file_is_refused(tmp_path):
    doc = spec("share")
    set_path(doc, "metadata/team", "pirates")
    problems = _problems(_repo(tmp_path, doc, folder="pirates"))
    assert list(problems) == ["/metadata/team"]
    assert 'team "pirates" is not in the platform file' in problems["/metadata/team"]


def test_a_spec_directly_in_the_platform_folder_belongs_to_no_team(tmp_path):
    path = _repo(tmp_path, spec("share"))
    moved = path.parent.parent / "queue.yaml"
    path.rename(moved)
    problems = {p.pointer: p.render() for p in load_specs([str(moved.parent)]).problems}
    assert f'is "kitchen" but the spec is in {moved.parent}/' in problems["/metadata/team"]


@pytest.mark.parametrize(
    ("path", "value", "pointer", "message"),
    [
        (
            "spec/autoscaling/maxExecutors",
            13,
            "/spec/autoscaling/maxExecutors",
            '13 is more than team "kitchen" may ask for: maxExecutors 12',
        ),
        (
            "spec/deployment/executor/memory",
            "6g",
            "/spec/deployment/executor/memory",
            '6g is more than team "kitchen" may ask for: executorMemory 4g',
        ),
        ("spec/deployment/executor/cores", 5, "/spec/deployment/executor/cores", "executorCores 4"),
        (
            "spec/deployment/driver/memory",
            "4097m",
            "/spec/deployment/driver/memory",
            '4097m is more than team "kitchen" may ask for: driverMemory 4g',
        ),
        ("spec/deployment/driver/cores", 3, "/spec/deployment/driver/cores", "driverCores 2"),
        (
            "spec/deployment/namespace",
            "payments",
            "/spec/deployment/namespace",
            '"payments" is not a namespace team "kitchen" may deploy to (allowed: kitchen;',
        ),
        (
            "spec/deployment/image",
            "registry.example.com/qpx/worker:1",
            "/spec/deployment/image",
            "(allowed: registry.example.com/qp/;",
        ),
        (
            "spec/topic/name",
            "payments.orders.v1",
            "/spec/topic/name",
            'does not start with a topic prefix team "kitchen" owns (owned: brew.;',
        ),
        ("spec/deadLetter/topic", "dlq.brew", "/spec/deadLetter/topic", "does not start with a topic prefix"),
    ],
)
def test_each_allowance_is_enforced_on_its_field(tmp_path, path, value, pointer, message):
    problems = _problems(_repo(tmp_path, set_path(spec("share"), path, value)))
    assert list(problems) == [pointer], problems
    assert message in problems[pointer]


def test_the_markers_topic_of_a_kmq_queue_needs_an_owned_prefix_too(tmp_path):
    doc = spec("kmq")
    set_path(doc, "metadata/team", "kitchen")
    set_path(doc, "spec/topic/name", "brew.mail.v1")
    set_path(doc, "spec/markers/topic", "mail.markers")
    problems = _problems(_repo(tmp_path, doc))
    assert list(problems) == ["/spec/markers/topic"], problems


def test_a_team_without_images_may_not_name_one(tmp_path):
    platform = yaml.safe_load(yaml.safe_dump(PLATFORM))
    del platform["defaults"]["images"]
    problems = _problems(_repo(tmp_path, spec("share"), platform=platform))
    assert "(allowed: none;" in problems["/spec/deployment/image"]
    assert "remove it to run the platform's worker image" in problems["/spec/deployment/image"]


def test_a_broken_platform_file_is_reported_by_field_and_allows_none_of_its_specs(tmp_path, cli_env):
    platform = yaml.safe_load(yaml.safe_dump(PLATFORM))
    platform["teams"]["kitchen"]["limits"]["maxExecutor"] = 3
    path = _repo(tmp_path, spec("share"), platform=platform)

    loaded = load_specs([str(path.parent.parent)])
    assert loaded.queues == []
    result = run_cli(["validate", str(path.parent.parent)], cli_env)
    assert result.returncode == 2
    platform_file = path.parent.parent / "platform.yaml"
    assert (
        f'{platform_file}: /teams/kitchen/limits/maxExecutor: unknown field "maxExecutor"'
        in result.stdout + result.stderr
    )
    assert 'did you mean "maxExecutors"?' in result.stdout + result.stderr


def test_a_platform_file_in_a_team_folder_widens_nothing_and_is_reported(tmp_path):
    doc = set_path(spec("share"), "spec/deployment/namespace", "kube-system")
    path = _repo(tmp_path, doc)
    own = {"apiVersion": "queueplane.io/v1", "kind": "Platform", "teams": {"kitchen": {"namespaces": ["kube-system"]}}}
    (path.parent / "platform.yaml").write_text(yaml.safe_dump(own))
    problems = load_specs([str(path.parent.parent)]).problems
    rendered = {p.file: p.render() for p in problems}
    assert '"kube-system" is not a namespace team "kitchen" may deploy to' in rendered[str(path)]
    nested = str(path.parent / "platform.yaml")
    assert f"a platform file below {path.parent.parent / 'platform.yaml'}, which alone governs" in rendered[nested]


def test_without_a_platform_file_no_team_rule_applies(tmp_path):
    doc = set_path(spec("share"), "spec/deployment/namespace", "elsewhere")
    path = _repo(tmp_path, doc, folder="anything", platform=None)
    assert load_specs([str(path.parent.parent)]).problems == []


def test_the_examples_platform_file_governs_the_examples_and_is_no_spec(cli_env):
    result = run_cli(["validate", str(EXAMPLES)], cli_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "platform.yaml" not in result.stdout
    assert "3 spec(s) valid" in result.stdout
    # The examples' own platform file is what keeps an example inside its team's prefix.
    doc = yaml.safe_load((EXAMPLES / "cafe" / "coffee-orders.yaml").read_text())
    assert doc["metadata"]["team"] == "cafe"
    rules = yaml.safe_load((EXAMPLES / "platform.yaml").read_text())
    assert rules["teams"]["cafe"]["topicPrefixes"] == ["cafe."]


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("registry.example.com/qp/worker:1", True),
        ("registry.example.com/qp/team/worker@sha256:" + "a" * 64, True),
        ("registry.example.com/qpx/worker:1", False),
        ("registry.example.com/qp:1", False),
    ],
)
def test_an_image_prefix_ending_in_a_slash_allows_everything_under_that_path(image, allowed):
    assert image_allowed(image, ["registry.example.com/qp/"]) is allowed


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("registry.example.com/qp/worker", True),
        ("registry.example.com/qp/worker:1", True),
        ("registry.example.com/qp/worker@sha256:" + "b" * 64, True),
        ("registry.example.com/qp/worker/sub:1", True),
        ("registry.example.com/qp/worker-evil:1", False),
        ("registry.example.com/qp/work:1", False),
    ],
)
def test_an_image_repository_allows_its_tags_and_digests_and_no_look_alike(image, allowed):
    assert image_allowed(image, ["registry.example.com/qp/worker"]) is allowed


@pytest.mark.parametrize(
    ("path", "value", "pointer"),
    [
        ("spec/topic/name", "__consumer_offsets", "/spec/topic/name"),
        ("spec/deadLetter/topic", "__transaction_state", "/spec/deadLetter/topic"),
        ("spec/processing/output/topic", "__share_group_state", "/spec/processing/output/topic"),
        ("spec/topic/name", "_schemas", "/spec/topic/name"),
        ("spec/deadLetter/topic", "_confluent-metrics", "/spec/deadLetter/topic"),
    ],
)
def test_kafka_internal_topics_are_refused_with_or_without_a_platform_file(tmp_path, cli_env, path, value, pointer):
    doc = set_path(spec("share"), path, value)
    set_path(doc, "spec/topic/config", {"cleanup.policy": "delete", "retention.ms": 1})
    spec_file = _repo(tmp_path, doc, platform=None)
    result = run_cli(["validate", str(spec_file)], cli_env)
    assert result.returncode == 2
    assert (
        f'{spec_file}: {pointer}: "{value}" is an internal topic of Kafka or its tools' in result.stdout + result.stderr
    )
