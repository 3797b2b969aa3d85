"""Saved plans: what an approver saw is what gets applied, or nothing is.

``plan --out FILE`` writes the plan with what it was made from: the spec files (their paths
and a digest of their bytes) and a digest of the live state it read. ``apply FILE`` reads
the specs and the cluster again and goes ahead only when both digests match and the plan made
now is, change for change, the one in the file; otherwise it refuses with ``PlanStale`` (its
own exit code) and changes nothing. Re-planning instead of replaying the file keeps one path
for applying (the batched steps, the owner claims first, the read-back), and the equality
check makes it the saved plan exactly.

The live digest covers everything the plan read: topics, their managed configs, group
configs, owner records, ACL records and the specs' principals' ACLs, the brokers and their
defaults. A change anywhere else on the cluster does not make a plan stale.
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
from queueplane.spec.model import QueueSpec

FORMAT = "queueplane-plan/1"


@dataclass(frozen=True)
class SavedPlan:
    """A plan file's content: the plan and what it was made from."""

    path: str
    specs: list[str]
    specs_digest: str
    cluster_id: str
    live_digest: str
    plan: dict[str, Any]


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


def live_digest(live: LiveState) -> str:
    """A digest of everything the plan read from the cluster."""
    return _digest(asdict(live))


def specs_digest(queues: list[QueueSpec]) -> str:
    """A digest of the spec files' paths and bytes, in path order."""
    files = sorted({str(Path(q.source).resolve()) for q in queues})
    return _digest({path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in files})


def write(planned: steps.Planned, path: str) -> None:
    """Write ``planned`` to ``path`` as a saved plan (JSON)."""
    saved = {
        "format": FORMAT,
        "specs": sorted({str(Path(q.source).resolve()) for q in planned.queues}),
        "specs_digest": specs_digest(planned.queues),
        "cluster_id": planned.live.cluster_id,
        "live_digest": live_digest(planned.live),
        "plan": planned.plan.as_dict(),
    }
    try:
        Path(path).write_text(json.dumps(saved, indent=2) + "\n")
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
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise UsageError(f"{path}: /format: not a saved plan of this version (expected {FORMAT!r})")
    for key, kind in (
        ("specs", list),
        ("specs_digest", str),
        ("cluster_id", str),
        ("live_digest", str),
        ("plan", dict),
    ):
        if not isinstance(document.get(key), kind):
            raise UsageError(f"{path}: /{key}: missing or not a {kind.__name__}; make the plan again")
    return SavedPlan(
        path,
        document["specs"],
        document["specs_digest"],
        document["cluster_id"],
        document["live_digest"],
        document["plan"],
    )


def replan(saved: SavedPlan, target: KafkaTarget) -> steps.Planned:
    """The saved plan, made again from its specs and the cluster as they are now; raises
    ``PlanStale`` when the specs, the cluster or the plan itself differ from the file's."""
    missing = [spec for spec in saved.specs if not Path(spec).is_file()]
    if missing:
        raise PlanStale(f"{saved.path}: the spec {missing[0]} is gone since the plan was made; nothing was changed")
    planned = steps.plan(saved.specs, target)
    if specs_digest(planned.queues) != saved.specs_digest:
        raise PlanStale(f"{saved.path}: the specs changed since the plan was made; plan again. Nothing was changed")
    if planned.live.cluster_id != saved.cluster_id:
        raise PlanStale(
            f"{saved.path}: the plan was made against cluster {saved.cluster_id}, "
            f"not {planned.live.cluster_id} ({target.label}); nothing was changed"
        )
    if live_digest(planned.live) != saved.live_digest or planned.plan.as_dict()["changes"] != saved.plan.get("changes"):
        raise PlanStale(
            f"{saved.path}: the cluster changed since the plan was made, so it is no longer what was "
            "approved; plan again. Nothing was changed"
        )
    return planned
