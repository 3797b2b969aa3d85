"""The platform file: what each team may do, enforced on every spec below it, and refused elsewhere.

Queueplane acts with the platform's Kafka and Kubernetes credentials, so a spec must not be
able to do all those credentials can. ``platform.yaml`` (schema: specs/platform-v1.schema.json)
lists the teams and, per team, the namespaces, image repositories, topic and group prefixes
and resource limits it may use. It governs the specs in the folders below it, each team's in
``<folder>/<team>/``. The highest one up the tree (to the repository root) applies, so a file a
team drops into its own folder can never widen what it may do; it is reported instead.

The rules fail closed: where a repository holds any platform file, a spec that none of them
governs (a new team's folder beside the governed one) is refused, and so is a spec whose path
goes through a symbolic link, since a spec is judged by the folder it sits in. A repository
without any platform file is one team, and no team rule applies.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queueplane.errors import Problem, UsageError
from queueplane.kafka.names import RESERVED_GROUP_PREFIX
from queueplane.spec.files import PLATFORM_FILE_NAME, SpecFile, expand_paths, read_spec_file
from queueplane.spec.model import QueueSpec, build, memory_mi
from queueplane.spec.schema import PLATFORM_SCHEMA_FILE_NAME, load_schema
from queueplane.spec.schema_errors import schema_problems


@dataclass(frozen=True)
class Allowance:
    """What one team may do; the defaults already resolved."""

    namespaces: tuple[str, ...]
    images: tuple[str, ...]
    topic_prefixes: tuple[str, ...]
    group_prefixes: tuple[str, ...]
    limits: dict[str, Any]

    def prefixes(self, kind: str) -> tuple[str, ...]:
        """The team's prefixes of ``kind`` names: "topic" or "group"."""
        return self.topic_prefixes if kind == "topic" else self.group_prefixes


@dataclass(frozen=True)
class Platform:
    """A valid platform file: the folder it governs and each team's allowance."""

    path: str
    folder: Path
    teams: dict[str, Allowance]

    def topic_team(self, topic: str) -> str | None:
        """The team one of whose topic prefixes ``topic`` starts with (prefixes never overlap)."""
        return next((team for team, a in self.teams.items() if topic.startswith(a.topic_prefixes)), None)


# Folders a search for platform files never enters: tools' and environments' trees, not specs.
_NOT_SPECS = frozenset({"node_modules", "__pycache__", "venv", "site-packages"})


def _absolute(path: str | Path) -> Path:
    """The path made absolute without resolving symbolic links: a spec sits where its path says."""
    return Path(os.path.abspath(path))


def repository_root(path: str | Path) -> Path | None:
    """The nearest folder at or above ``path``'s that holds ``.git`` (a clone or a worktree)."""
    folder = _absolute(path)
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def platform_files(spec_path: str | Path) -> list[Path]:
    """Every ``platform.yaml`` in the spec's folder and above it up to the repository root,
    the highest first: that one governs (a team's own folder can never widen its allowance)."""
    folder = _absolute(spec_path).parent
    found: list[Path] = []
    for candidate in (folder, *folder.parents):
        if (candidate / PLATFORM_FILE_NAME).is_file():
            found.append(candidate / PLATFORM_FILE_NAME)
        if (candidate / ".git").exists():
            break
    return found[::-1]


def platform_files_under(root: Path) -> list[Path]:
    """Every ``platform.yaml`` in the tree below ``root`` (hidden folders and tools' trees left
    out, symbolic links not followed). Any file of that name counts, readable or not: the rules
    must fail closed, not open, when a platform file is broken."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_SPECS)
        if PLATFORM_FILE_NAME in files:
            found.append(Path(folder) / PLATFORM_FILE_NAME)
    return found


def _default_limits() -> dict[str, Any]:
    """Each limit's default when neither the team nor the file's defaults set it (from the schema)."""
    limits = load_schema(PLATFORM_SCHEMA_FILE_NAME)["$defs"]["allowance"]["properties"]["limits"]["properties"]
    return {name: field["default"] for name, field in limits.items()}


def _allowance(team: str, own: dict[str, Any], defaults: dict[str, Any]) -> Allowance:
    def pick(key: str, fallback: Any) -> Any:
        return own.get(key, defaults.get(key, fallback))

    limits = {**_default_limits(), **defaults.get("limits", {}), **own.get("limits", {})}
    return Allowance(
        namespaces=tuple(pick("namespaces", [team])),
        images=tuple(pick("images", [])),
        topic_prefixes=tuple(pick("topicPrefixes", [f"{team}."])),
        group_prefixes=tuple(pick("groupPrefixes", [f"{team}-"])),
        limits=limits,
    )


def _prefix_source(doc: dict[str, Any], team: str, field: str) -> str:
    """The pointer of the field that gave ``team`` its prefixes: its own entry, the defaults, or
    the team's name (the schema's default)."""
    if field in (doc["teams"][team] or {}):
        return f"/teams/{team}/{field}"
    if field in doc.get("defaults", {}):
        return f"/defaults/{field}"
    return f"/teams/{team}"


def prefix_problems(path: str, doc: dict[str, Any], teams: dict[str, Allowance]) -> list[Problem]:
    """Names must belong to one team at most: no topic or group prefix of one team may start
    another team's (``pay-`` would cover every group of team ``pay-x``), and no group prefix
    may cover queueplane's own groups."""
    out: list[Problem] = []
    kinds = (("topicPrefixes", "topic"), ("groupPrefixes", "group"))
    for field, kind in kinds:
        owned = [(team, prefix) for team, allowance in teams.items() for prefix in allowance.prefixes(kind)]
        for index, (team, prefix) in enumerate(owned):
            for other, other_prefix in owned[index + 1 :]:
                if other != team and (prefix.startswith(other_prefix) or other_prefix.startswith(prefix)):
                    out.append(
                        Problem(
                            path,
                            _prefix_source(doc, other, field),
                            f'{kind} prefix "{other_prefix}" of team "{other}" overlaps "{prefix}" of team "{team}": '
                            f"a {kind} name would belong to both",
                            f"set {field} of one of them so that neither prefix starts the other",
                        )
                    )
    for team, allowance in teams.items():
        for prefix in allowance.group_prefixes:
            if prefix.lower().startswith(RESERVED_GROUP_PREFIX) or RESERVED_GROUP_PREFIX.startswith(prefix.lower()):
                out.append(
                    Problem(
                        path,
                        _prefix_source(doc, team, "groupPrefixes"),
                        f'group prefix "{prefix}" of team "{team}" covers queueplane\'s own groups '
                        f"({RESERVED_GROUP_PREFIX}...)",
                        "give the team a prefix of its own, such as its name and a dash",
                    )
                )
    return out


def load_platform(path: Path) -> tuple[Platform | None, list[Problem]]:
    """Read and check a platform file; None with its problems when it is not valid."""
    parsed = read_spec_file(Path(_shown(path)))
    if parsed.data is None or parsed.problems:
        return None, parsed.problems
    found = schema_problems(parsed, PLATFORM_SCHEMA_FILE_NAME)
    if found:
        return None, found
    doc = parsed.data
    defaults = doc.get("defaults", {})
    teams = {team: _allowance(team, own, defaults) for team, own in doc["teams"].items()}
    overlapping = prefix_problems(_shown(path), doc, teams)
    if overlapping:
        return None, overlapping
    return Platform(_shown(path), _absolute(path).parent, teams), []


def _shown(path: Path) -> str:
    """The path as messages show it: relative to the working directory when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def image_allowed(image: str, allowed: Iterable[str]) -> bool:
    """An image is allowed when one entry is its registry or repository: a prefix that ends at
    a path separator, a tag or a digest (``…/worker`` allows ``…/worker:1``, not ``…/worker-x:1``)."""
    for prefix in allowed:
        if prefix.endswith("/") and image.startswith(prefix):
            return True
        if image == prefix or (image.startswith(prefix) and image[len(prefix)] in "/:@"):
            return True
    return False


def _listed(values: Iterable[str]) -> str:
    shown = ", ".join(values)
    return shown or "none"


def platform_problems(
    spec: SpecFile, queue: QueueSpec, platform: Platform, team_queues: Callable[[str], list[QueueSpec]]
) -> list[Problem]:
    """What ``queue`` asks for beyond its team's allowance in ``platform``; ``team_queues`` gives
    another team's queues (the output rule reads whom they let write to their topics)."""
    where = f"platform file {platform.path}"
    allowance = platform.teams.get(queue.team)
    if allowance is None:
        return [
            spec.problem(
                "/metadata/team",
                f'team "{queue.team}" is not in the {where}',
                "the platform owners add a team there before its first queue",
            )
        ]
    out: list[Problem] = []

    def add(ptr: str, message: str, hint: str | None = None) -> None:
        out.append(spec.problem(ptr, message, hint))

    try:
        inside = _absolute(spec.path).relative_to(platform.folder).parts
    except ValueError:
        inside = ()
    if len(inside) < 2 or inside[0] != queue.team:
        root = Path(platform.path).parent  # as the user sees it
        folder = f"{root / inside[0]}/" if len(inside) >= 2 else f"{root}/"
        add(
            "/metadata/team",
            f'is "{queue.team}" but the spec is in {folder}',
            f"each team's specs live in its own folder: move the file to {root / queue.team}/",
        )
    if queue.deploy_target == "kubernetes" and queue.namespace not in allowance.namespaces:
        add(
            "/spec/deployment/namespace",
            f'"{queue.namespace}" is not a namespace team "{queue.team}" may deploy to '
            f"(allowed: {_listed(allowance.namespaces)}; {where})",
        )
    if queue.image is not None and not image_allowed(queue.image, allowance.images):
        add(
            "/spec/deployment/image",
            f'"{queue.image}" is not from a registry or repository team "{queue.team}" may use '
            f"(allowed: {_listed(allowance.images)}; {where})",
            "remove it to run the platform's worker image" if not allowance.images else None,
        )
    for ptr, topic in queue.owned_topics():
        if not topic.startswith(allowance.topic_prefixes):
            add(
                ptr,
                f'"{topic}" does not start with a topic prefix team "{queue.team}" owns '
                f"(owned: {_listed(allowance.topic_prefixes)}; {where})",
            )
    if not queue.group.id.startswith(allowance.group_prefixes):
        add(
            "/spec/group/id",
            f'"{queue.group.id}" does not start with a group prefix team "{queue.team}" owns '
            f"(owned: {_listed(allowance.group_prefixes)}; {where})",
        )
    if queue.output_topic is not None and not queue.output_topic.startswith(allowance.topic_prefixes):
        found = _foreign_output(queue, platform, team_queues)
        if found is not None:
            add("/spec/processing/output/topic", *found)
    limits = allowance.limits
    checks: list[tuple[str, int, int, str, Callable[[int], str]]] = [
        ("/spec/autoscaling/maxExecutors", queue.max_executors, limits["maxExecutors"], "maxExecutors", str),
        ("/spec/deployment/executor/cores", queue.executor["cores"], limits["executorCores"], "executorCores", str),
        ("/spec/deployment/driver/cores", queue.driver["cores"], limits["driverCores"], "driverCores", str),
        (
            "/spec/deployment/executor/memory",
            queue.memory_mi("executor"),
            memory_mi(limits["executorMemory"]),
            "executorMemory",
            _mib,
        ),
        (
            "/spec/deployment/driver/memory",
            queue.memory_mi("driver"),
            memory_mi(limits["driverMemory"]),
            "driverMemory",
            _mib,
        ),
    ]
    for ptr, asked, most, name, show in checks:
        if asked > most:
            add(ptr, f'{show(asked)} is more than team "{queue.team}" may ask for: {name} {show(most)} ({where})')
    return out


def _foreign_output(
    queue: QueueSpec, platform: Platform, team_queues: Callable[[str], list[QueueSpec]]
) -> tuple[str, str] | None:
    """Why ``queue`` may not write its output to a topic outside its team's prefixes (message and
    hint), or None when the owning team's spec lists its worker among the topic's producers."""
    topic = queue.output_topic or ""
    owner = platform.topic_team(topic)
    if owner is None:
        return (
            f'"{topic}" is not a topic of team "{queue.team}" '
            f"(owned: {_listed(platform.teams[queue.team].topic_prefixes)}) nor of any other team in platform file "
            f"{platform.path}",
            "write outputs to a topic of your own team, or of a team whose queue lets your worker produce",
        )
    target = next((q for q in team_queues(owner) if q.topic.name == topic), None)
    if target is None:
        return (
            f'"{topic}" is a topic of team "{owner}" and none of their specs has it as its queue topic',
            f"a queue of team {owner} must exist whose spec.access.producers lists this queue's worker",
        )
    if queue.worker_principal is None or queue.worker_principal not in target.producer_principals:
        writer = queue.worker_principal or "its spec.access.worker"
        owning_spec = _shown(Path(target.source))
        return (
            f'"{topic}" is the queue topic of team "{owner}" ({owning_spec}), whose spec.access.producers '
            f"does not list this queue's worker ({writer})",
            f"team {owner} adds the worker's principal to spec.access.producers of {owning_spec}"
            + ("; set spec.access.worker here first" if queue.worker_principal is None else ""),
        )
    return None


def _mib(value: int) -> str:
    return f"{value // 1024}g" if value % 1024 == 0 else f"{value}m"


class Platforms:
    """Platform files found for the specs of one run, each read and checked once.

    ``root`` is the tree to search for platform files when a spec sits in no git repository
    (the DAG processor's specs folder, copied without ``.git``); in a repository, its root is.
    """

    def __init__(self, root: str | Path | None = None) -> None:
        self._root = _absolute(root) if root is not None else None
        self._by_file: dict[Path, tuple[Platform | None, list[Problem]]] = {}
        self._by_folder: dict[Path, list[Path]] = {}
        self._in_tree: dict[Path, list[Path]] = {}
        self._team_queues: dict[tuple[Path, str], list[QueueSpec]] = {}

    def for_spec(self, spec_path: str) -> tuple[Platform | None, list[Problem], bool]:
        """(platform, problems not reported yet, whether a platform file governs the spec).

        A platform file below the governing one is a problem of its own: it would look as if it
        applied, and it never does.
        """
        folder = _absolute(spec_path).parent
        if folder not in self._by_folder:
            self._by_folder[folder] = platform_files(spec_path)
        found = self._by_folder[folder]
        if not found:
            return None, [], False
        governing, *below = found
        problems: list[Problem] = []
        if governing not in self._by_file:
            self._by_file[governing] = load_platform(governing)
            problems += self._by_file[governing][1]
        for nested in below:
            if nested not in self._by_file:
                self._by_file[nested] = (None, [])
                problems.append(
                    Problem(
                        _shown(nested),
                        "",
                        f"a platform file below {_shown(governing)}, which alone governs the specs here",
                        "remove it; a team's allowance is changed in the platform file at the top",
                    )
                )
        platform = self._by_file[governing][0]
        return platform, problems, True

    def _tree(self, spec_path: str) -> Path | None:
        """The tree whose platform files decide whether the spec must be governed."""
        root = repository_root(_absolute(spec_path).parent)
        if root is not None:
            return root
        if self._root is not None and _absolute(spec_path).is_relative_to(self._root):
            return self._root
        return None

    def closed_problems(self, spec: SpecFile, governed: bool) -> list[Problem]:
        """Where the spec's tree holds platform files: a spec none of them governs, or one reached
        through a symbolic link (judged by where it sits, it could borrow another folder's rules,
        and Airflow's tasks, which resolve paths, would judge it elsewhere)."""
        tree = self._tree(spec.path) if os.path.lexists(spec.path) else None  # text checked on its own sits nowhere
        if tree is None:
            return []
        if tree not in self._in_tree:
            self._in_tree[tree] = platform_files_under(tree)
        files = self._in_tree[tree]
        if not files and not governed:
            return []
        out: list[Problem] = []
        where = _absolute(spec.path)
        if where.resolve() != tree.resolve() / where.relative_to(tree):
            out.append(
                spec.problem(
                    "",
                    "the spec's path goes through a symbolic link; a spec is judged by the folder it sits in",
                    "put the file itself (not a link to it, nor into a linked folder) in its team's folder",
                )
            )
        if not governed:
            shown = ", ".join(_shown(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
            out.append(
                spec.problem(
                    "/metadata/team",
                    f"the spec sits outside every platform file's folder ({shown}), so no team rule could "
                    "check it and it is refused",
                    "team specs live in <platform folder>/<team>/; the platform owners add a new team to a "
                    "platform file before its first queue",
                )
            )
        return out

    def team_queues(self, platform: Platform, team: str) -> list[QueueSpec]:
        """The schema-valid queues in ``team``'s folder under ``platform`` (for rules that look
        at another team's specs), read once per run."""
        key = (platform.folder, team)
        if key not in self._team_queues:
            queues = []
            folder = platform.folder / team
            try:
                files = expand_paths([str(folder)]) if folder.is_dir() else []
            except UsageError:  # a folder without specs
                files = []
            for path in files:
                parsed = read_spec_file(path)
                if parsed.data is None or parsed.problems or schema_problems(parsed):
                    continue
                queues.append(build(parsed.data, str(path)))
            self._team_queues[key] = queues
        return self._team_queues[key]
