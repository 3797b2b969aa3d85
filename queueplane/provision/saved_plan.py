"""Saved plans: what an approver saw is what gets applied, or nothing is.

``plan --out FILE`` writes the plan with what it was made from: the planned paths, the spec
files (their paths and a digest of their bytes), how removals were planned (the grace, the
DLQ force) and a digest of the live state it read. ``apply FILE`` plans the same paths again
and goes ahead only when both digests match and the plan made now is, change for change, the
one in the file; otherwise it refuses with ``PlanStale`` (its own exit code) and changes
nothing. A removal is part of the plan like any change: a spec removed, added or edited
since, or a removed queue's group, topics or records changed on the cluster, make it stale.
Re-planning instead of replaying the file keeps one path for applying (the batched steps, the
owner claims first, the read-back), and the equality check makes it the saved plan exactly.

The live digests cover everything the plan read, in three parts: the topics (their partitions,
managed configs and owner records), the groups (group configs and claims, queue and ACL
records and the specs' principals' ACLs), and the removals (the removed queues' records and
ACLs, whether their topics hold records, their groups' members, lag and configs: whether, not
how many, so a worker still draining does not make the plan stale by itself; the plan's lines
decide), each with the brokers and their defaults. A change anywhere else on the cluster does
not make a plan stale. Parts, because Airflow applies a plan in separate tasks: once one task
has applied its changes, the next checks only the part it applies, which the others did not
touch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from queueplane.errors import PlanStale, UsageError
from queueplane.kafka.cluster import LiveState
from queueplane.kafka.target import KafkaTarget
from queueplane.provision import steps
from queueplane.provision.plan import GROUP_KINDS, REMOVAL, REMOVAL_KINDS, TOPIC_KINDS, RemovalOptions
from queueplane.spec.model import QueueSpec

FORMAT = "queueplane-plan/1"
# The parts of the live state, by the LiveState fields each reads, and the change kinds each holds.
_SHARED = ("cluster_id", "broker_ids", "broker_configs")
PARTS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "topics": ((*_SHARED, "topics", "topic_configs", "owners"), TOPIC_KINDS),
    "groups": (
        (*_SHARED, "group_configs", "group_config_names", "group_owners", "queue_records", "acl_records", "acls"),
        GROUP_KINDS,
    ),
    "removals": (
        (*_SHARED, "owners", "group_owners", "queue_records", "acls", "removed_topics", "removed_groups"),
        REMOVAL_KINDS,
    ),
}


@dataclass(frozen=True)
class SavedPlan:
    """A plan file's content: the plan and what it was made from."""

    path: str
    specs: list[str]
    specs_digest: str
    paths: list[str]  # what was planned: the removed specs' queues are found under them
    removal: dict[str, Any]  # RemovalOptions.as_dict()
    cluster_id: str
    live_digests: dict[str, str]
    plan: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The plan file's content (also what the DAG's plan task hands its apply tasks)."""
        return {
            "format": FORMAT,
            "paths": self.paths,
            "removal": self.removal,
            "specs": self.specs,
            "specs_digest": self.specs_digest,
            "cluster_id": self.cluster_id,
            "live_digests": self.live_digests,
            "plan": self.plan,
        }


def _canonical(value: Any) -> Any:
    """``value`` with sets as sorted lists and tuples as lists: JSON that reads the same every time."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def _digest(value: Any) -> str:
    text = json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def live_digests(live: LiveState) -> dict[str, str]:
    """A digest of each part of what the plan read from the cluster."""
    state = asdict(live)
    # Of a removed queue's topics and groups, whether (not how much) they hold records, members and lag.
    state["removed_topics"] = {name: c.records > 0 for name, c in live.removed_topics.items()}
    state["removed_groups"] = {
        group: [g.exists, _some(g.members), _some(g.lag), list(g.configs)] for group, g in live.removed_groups.items()
    }
    return {part: _digest({name: state[name] for name in fields}) for part, (fields, _) in PARTS.items()}


def _some(count: int | None) -> bool | None:
    return None if count is None else count > 0


def specs_digest(queues: list[QueueSpec]) -> str:
    """A digest of the spec files' paths and bytes, in path order."""
    files = sorted({str(Path(q.source).resolve()) for q in queues})
    return _digest({path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in files})


def saved(planned: steps.Planned, origin: str = "the plan") -> SavedPlan:
    """``planned`` as a saved plan; ``origin`` names it in messages (its file)."""
    return SavedPlan(
        origin,
        sorted({str(Path(q.source).resolve()) for q in planned.queues}),
        specs_digest(planned.queues),
        list(planned.paths),
        planned.options.as_dict(),
        planned.live.cluster_id,
        live_digests(planned.live),
        planned.plan.as_dict(),
    )


def write(planned: steps.Planned, path: str) -> None:
    """Write ``planned`` to ``path`` as a saved plan (JSON)."""
    try:
        Path(path).write_text(json.dumps(saved(planned, path).as_dict(), indent=2) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write the plan to {path}: {exc.strerror}") from None


def is_saved_plan(path: str) -> bool:
    """Whether ``path`` is a plan file (JSON naming this format), not a spec or a folder."""
    file = Path(path)
    if not file.is_file():
        return False
    try:
        head = file.read_text(errors="replace")[:4096]
    except OSError:
        return False
    return head.lstrip().startswith("{") and f'"format": "{FORMAT}"' in head


def read(path: str) -> SavedPlan:
    """The plan file at ``path``; a file that is not one is a usage error naming the field."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a saved plan ({exc})") from None
    return parse(document, path)


def parse(document: Any, origin: str) -> SavedPlan:
    """A saved plan's content (a file's, or an XCom value); ``origin`` names it in messages."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise UsageError(f"{origin}: /format: not a saved plan of this version (expected {FORMAT!r})")
    for key, kind in (
        ("paths", list),
        ("removal", dict),
        ("specs", list),
        ("specs_digest", str),
        ("cluster_id", str),
        ("live_digests", dict),
        ("plan", dict),
    ):
        if not isinstance(document.get(key), kind):
            raise UsageError(f"{origin}: /{key}: missing or not a {kind.__name__}; make the plan again")
    changes = document["plan"].get("changes")
    if not isinstance(changes, list) or not all(isinstance(c, dict) for c in changes):
        raise UsageError(f"{origin}: /plan/changes: missing or not a list of changes; make the plan again")
    return SavedPlan(
        origin,
        document["specs"],
        document["specs_digest"],
        document["paths"],
        document["removal"],
        document["cluster_id"],
        document["live_digests"],
        document["plan"],
    )


def replan(saved: SavedPlan, target: KafkaTarget, kinds: frozenset[str] | None = None) -> steps.Planned:
    """The saved plan, made again from its specs and the cluster as they are now; raises
    ``PlanStale`` when the specs, the cluster or the plan itself differ from the saved one's.

    ``kinds``: only the changes of these kinds are to be applied (one of the DAG's apply
    tasks): only the parts of the live state they read, and only those changes (and every
    refusal), must still be the saved ones.
    """
    missing = [spec for spec in saved.specs if not Path(spec).is_file()]
    if missing:
        raise PlanStale(f"{saved.path}: the spec {missing[0]} is gone since the plan was made; nothing was changed")
    gone = [path for path in saved.paths if not Path(path).exists()]
    if gone:
        raise PlanStale(f"{saved.path}: {gone[0]} is gone since the plan was made; nothing was changed")
    planned = steps.plan(saved.paths, target, RemovalOptions.from_dict(saved.removal))
    if specs_digest(planned.queues) != saved.specs_digest:
        raise PlanStale(f"{saved.path}: the specs changed since the plan was made; plan again. Nothing was changed")
    if planned.live.cluster_id != saved.cluster_id:
        raise PlanStale(
            f"{saved.path}: the plan was made against cluster {saved.cluster_id}, "
            f"not {planned.live.cluster_id} ({target.label}); nothing was changed"
        )
    parts = [part for part, (_, held) in PARTS.items() if kinds is None or held & kinds]
    now = live_digests(planned.live)
    moved = [part for part in parts if now[part] != saved.live_digests.get(part)]
    if moved or _changes(planned.plan.as_dict(), kinds) != _changes(saved.plan, kinds):
        raise PlanStale(
            f"{saved.path}: the cluster changed since the plan was made, so it is no longer what was "
            "approved; plan again. Nothing was changed"
        )
    return planned


def _changes(plan: dict[str, Any], kinds: frozenset[str] | None) -> list[Any]:
    """A plan's change lines of ``kinds`` (all when None; a removal's lines are REMOVAL's), refusals always."""
    changes: list[dict[str, Any]] = plan.get("changes") or []

    def part(change: dict[str, Any]) -> Any:
        return REMOVAL if change.get("removes") else change.get("kind")

    return [c for c in changes if kinds is None or part(c) in kinds or c.get("action") == "refuse"]
