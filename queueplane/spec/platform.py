"""The platform file: what each team may do, enforced on every spec below it.

Queueplane acts with the platform's Kafka and Kubernetes credentials, so a spec must not be
able to do all those credentials can. ``platform.yaml`` (schema: specs/platform-v1.schema.json)
lists the teams and, per team, the namespaces, image repositories, topic prefixes and
resource limits it may use. It governs the specs in the folders below it, each team's in
``<folder>/<team>/``. The highest one up the tree (to the repository root) applies, so a file a
team drops into its own folder can never widen what it may do; it is reported instead. This
repository has none at the top, so its examples keep a platform file of their own. Without a
platform file no team rule applies (a spec checked on its own, in a scratch folder).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queueplane.errors import Problem
from queueplane.spec.files import PLATFORM_FILE_NAME, SpecFile, read_spec_file
from queueplane.spec.model import QueueSpec, memory_mi
from queueplane.spec.schema import PLATFORM_SCHEMA_FILE_NAME, load_schema
from queueplane.spec.schema_errors import schema_problems


@dataclass(frozen=True)
class Allowance:
    """What one team may do; the defaults already resolved."""

    namespaces: tuple[str, ...]
    images: tuple[str, ...]
    topic_prefixes: tuple[str, ...]
    limits: dict[str, Any]


@dataclass(frozen=True)
class Platform:
    """A valid platform file: the folder it governs and each team's allowance."""

    path: str
    folder: Path
    teams: dict[str, Allowance]


def platform_files(spec_path: str | Path) -> list[Path]:
    """Every ``platform.yaml`` in the spec's folder and above it up to the repository root,
    the highest first: that one governs (a team's own folder can never widen its allowance)."""
    folder = Path(spec_path).resolve().parent
    found: list[Path] = []
    for candidate in (folder, *folder.parents):
        if (candidate / PLATFORM_FILE_NAME).is_file():
            found.append(candidate / PLATFORM_FILE_NAME)
        if (candidate / ".git").exists():
            break
    return found[::-1]


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
        limits=limits,
    )


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
    return Platform(_shown(path), path.resolve().parent, teams), []


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


def platform_problems(spec: SpecFile, queue: QueueSpec, platform: Platform) -> list[Problem]:
    """What ``queue`` asks for beyond its team's allowance in ``platform``."""
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
        inside = Path(spec.path).resolve().relative_to(platform.folder).parts
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
    limits = allowance.limits
    checks = [
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


def _mib(value: int) -> str:
    return f"{value // 1024}g" if value % 1024 == 0 else f"{value}m"


class Platforms:
    """Platform files found for the specs of one run, each read and checked once."""

    def __init__(self) -> None:
        self._by_file: dict[Path, tuple[Platform | None, list[Problem]]] = {}
        self._by_folder: dict[Path, list[Path]] = {}

    def for_spec(self, spec_path: str) -> tuple[Platform | None, list[Problem], bool]:
        """(platform, problems not reported yet, whether a platform file governs the spec).

        A platform file below the governing one is a problem of its own: it would look as if it
        applied, and it never does.
        """
        folder = Path(spec_path).resolve().parent
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
