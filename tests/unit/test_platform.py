"""The platform file's guardrails: a spec gets only what its team is allowed, whatever it asks for.

Each refusal is an invalid-spec verdict (exit 2, the file and field named), so nothing is
applied or deployed; tests/integration/test_guardrails.py shows that against a real broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, run_cli
from specs_factory import DELETE, dump, set_path, spec

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
    doc = spec("kmq", group="kitchen-mailer")
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


def _git_repo(tmp_path: Path) -> Path:
    """A repository root: what bounds the search for platform files (a clone has .git)."""
    (tmp_path / ".git").mkdir()
    return tmp_path


def test_a_new_team_folder_beside_the_governed_one_is_refused_not_ungoverned(tmp_path, cli_env):
    """The issue's case: specs/<newteam>/ outside the folder the platform file governs."""
    repo = _git_repo(tmp_path)
    governed = _repo(repo / "examples", spec("share"))  # examples/specs/platform.yaml governs examples/specs/
    doc = spec("share", name="payments-events", group="payments-ledger")
    set_path(doc, "metadata/team", "payments")
    set_path(doc, "spec/topic/name", "payments.events.v1")
    set_path(doc, "spec/deadLetter/topic", "payments.events.v1.dlq")
    set_path(doc, "spec/processing/output/topic", "payments.out.v1")
    set_path(doc, "spec/deployment/namespace", "kube-system")
    stray = repo / "specs" / "newteam" / "payments.yaml"
    stray.parent.mkdir(parents=True)
    stray.write_text(dump(doc))

    result = run_cli(["validate", str(stray)], cli_env)

    said = result.stdout + result.stderr
    assert result.returncode == 2, said
    assert "Traceback" not in said
    assert f"{stray}: /metadata/team: the spec sits outside every platform file's folder" in said
    assert str(governed.parent.parent / "platform.yaml") in said
    # The whole tree fails the same way: the governed spec passes, the stray one does not.
    loaded = load_specs([str(repo)])
    assert [q.name for q in loaded.queues] == ["brew-orders"]
    assert {p.file for p in loaded.problems} == {str(stray)}


def test_outside_a_repository_the_given_root_decides_which_platform_files_count(tmp_path):
    from queueplane.provision.steps import check_specs

    _repo(tmp_path / "specs" / "examples", spec("share"))
    stray = tmp_path / "specs" / "newteam" / "queue.yaml"
    stray.parent.mkdir(parents=True)
    stray.write_text(dump(spec("share", name="other", group="kitchen-other", topic="brew.other.v1")))

    assert check_specs([str(stray)], persist=False).problems == []  # no repository, no root: one team
    problems = check_specs([str(stray)], persist=False, root=str(tmp_path / "specs")).problems
    assert [p.pointer for p in problems] == ["/metadata/team"]


def test_a_repository_without_platform_files_is_one_team(tmp_path):
    repo = _git_repo(tmp_path)
    path = _repo(repo, set_path(spec("share"), "spec/deployment/namespace", "anywhere"), folder="x", platform=None)
    assert load_specs([str(path)]).problems == []


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_a_spec_reached_through_a_symbolic_link_is_refused(tmp_path, linked):
    repo = _git_repo(tmp_path)
    path = _repo(repo, spec("share"))
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "queue.yaml").write_text(path.read_text())
    if linked == "file":
        link = path.parent / "linked.yaml"
        link.symlink_to(outside / "queue.yaml")
    else:
        (path.parent / "more").symlink_to(outside, target_is_directory=True)
        link = path.parent / "more" / "queue.yaml"

    problems = load_specs([str(link)]).problems

    assert [p.pointer for p in problems] == [""], [p.render() for p in problems]
    assert "the spec's path goes through a symbolic link" in problems[0].render()


def test_a_group_id_outside_the_teams_group_prefixes_is_refused(tmp_path):
    problems = _problems(_repo(tmp_path, spec("share", group="payments-ledger")))
    assert list(problems) == ["/spec/group/id"], problems
    assert (
        '"payments-ledger" does not start with a group prefix team "kitchen" owns (owned: kitchen-;'
        in (problems["/spec/group/id"])
    )


@pytest.mark.parametrize(
    ("group", "reason"),
    [
        ("queueplane-kmq-tracker-kitchen-service", "names queueplane's own groups"),
        ("kitchen-service.dlq-redrive", "derives from another queue's"),
        ("kitchen-service.lag-sampler", "derives from another queue's"),
    ],
)
def test_group_ids_queueplane_uses_itself_are_refused_with_or_without_a_platform_file(tmp_path, group, reason):
    for platform in (None, PLATFORM):
        path = _repo(tmp_path / ("governed" if platform else "scratch"), spec("share", group=group), platform=platform)
        said = [p.render() for p in load_specs([str(path)]).problems if p.pointer == "/spec/group/id"]
        assert any(reason in line for line in said), said


def _two_teams(tmp_path: Path, producers: list[str], worker: str | None = "User:kitchen-worker") -> Path:
    """kitchen's queue writes its output to victim-team's queue topic; victim lists ``producers``."""
    victim = spec("consumer", name="ledger", group="victim-team-ledger", topic="victim.ledger.v1")
    set_path(victim, "metadata/team", "victim-team")
    set_path(victim, "spec/deployment", {"namespace": "victims"})
    set_path(victim, "spec/access", {"worker": "User:victim-worker", "producers": producers})
    kitchen = spec("share")
    set_path(kitchen, "spec/processing/output/topic", "victim.ledger.v1")
    if worker:
        set_path(kitchen, "spec/access", {"worker": worker})
    path = _repo(tmp_path, kitchen)
    (path.parent.parent / "victim-team").mkdir()
    (path.parent.parent / "victim-team" / "ledger.yaml").write_text(dump(victim))
    return path


def test_writing_outputs_to_another_teams_topic_needs_that_teams_spec_to_list_the_writer(tmp_path):
    refused = _problems(_two_teams(tmp_path / "a", producers=["User:victim-frontend"]))
    assert list(refused) == ["/spec/processing/output/topic"], refused
    message = refused["/spec/processing/output/topic"]
    assert '"victim.ledger.v1" is the queue topic of team "victim-team"' in message
    assert "does not list this queue's worker (User:kitchen-worker)" in message

    assert _problems(_two_teams(tmp_path / "b", producers=["User:kitchen-worker"])) == {}

    anonymous = _problems(_two_teams(tmp_path / "c", producers=["User:kitchen-worker"], worker=None))
    assert "set spec.access.worker here first" in anonymous["/spec/processing/output/topic"]


def test_an_output_topic_of_no_team_or_of_no_queue_is_refused(tmp_path):
    nobody = _problems(_repo(tmp_path / "a", set_path(spec("share"), "spec/processing/output/topic", "orders.v1")))
    assert (
        'is not a topic of team "kitchen" (owned: brew.) nor of any other team'
        in (nobody["/spec/processing/output/topic"])
    )
    no_queue = _problems(
        _repo(tmp_path / "b", set_path(spec("share"), "spec/processing/output/topic", "victim.anything.v1"))
    )
    assert (
        'is a topic of team "victim-team" and none of their specs has it as its queue topic'
        in (no_queue["/spec/processing/output/topic"])
    )


@pytest.mark.parametrize(
    ("teams", "pointer", "message"),
    [
        # Default group prefixes: "pay-" would cover every group of team "pay-x".
        (
            {"pay": {}, "pay-x": {}},
            "/teams/pay-x",
            'group prefix "pay-x-" of team "pay-x" overlaps "pay-" of team "pay"',
        ),
        (
            {"kitchen": {"topicPrefixes": ["brew."]}, "victim-team": {"topicPrefixes": ["brew.victim."]}},
            "/teams/victim-team/topicPrefixes",
            'topic prefix "brew.victim." of team "victim-team" overlaps "brew." of team "kitchen"',
        ),
        ({"kitchen": {"groupPrefixes": ["queue"]}}, "/teams/kitchen/groupPrefixes", "covers queueplane's own groups"),
    ],
)
def test_a_platform_file_whose_prefixes_overlap_allows_nothing(tmp_path, teams, pointer, message):
    platform = {"apiVersion": "queueplane.io/v1", "kind": "Platform", "teams": teams}
    doc = spec("share")
    set_path(doc, "spec/deployment/image", DELETE)
    path = _repo(tmp_path, doc, platform=platform)
    loaded = load_specs([str(path.parent.parent)])
    assert loaded.queues == []
    rendered = {p.pointer: p.render() for p in loaded.problems if p.file.endswith("platform.yaml")}
    assert message in rendered[pointer], [p.render() for p in loaded.problems]
