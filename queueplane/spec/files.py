"""Reading spec files: YAML to plain data, with the line of every JSON pointer.

Line numbers let error messages point into the file as well as at the field. YAML
features that hide mistakes (duplicate keys, several documents) are reported, not
silently resolved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from queueplane.errors import Problem, UsageError

SPEC_SUFFIXES = (".yaml", ".yml")
# The platform file (spec/platform.py) sits among the specs it governs and is not one.
PLATFORM_FILE_NAME = "platform.yaml"
# A spec is a page of YAML. Files far larger, or whose aliases expand to far more nodes than
# they spell out (a "billion laughs"), would stall validate, CI and the DAG parse of every
# team's DAGs: they are refused before anything walks their data.
MAX_SPEC_BYTES = 256 * 1024
MAX_EXPANDED_NODES = 20_000


def pointer(path: list[str | int] | tuple[str | int, ...]) -> str:
    """RFC 6901 JSON pointer for a path of keys and indexes."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


@dataclass
class SpecFile:
    """A parsed spec file: its data (or None when unreadable) and where each field sits."""

    path: str
    data: Any = None
    lines: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    sha256: str = ""
    # True once the schema and the per-file rules passed (now, or for the same bytes before).
    rules_passed: bool = False

    def line_of(self, ptr: str) -> int | None:
        """Line of the field at ``ptr``, or of its nearest ancestor that exists."""
        while True:
            if ptr in self.lines:
                return self.lines[ptr]
            if not ptr:
                return None
            ptr = ptr.rsplit("/", 1)[0]

    def problem(self, ptr: str, message: str, hint: str | None = None) -> Problem:
        return Problem(self.path, ptr, message, hint, self.line_of(ptr))


def _walk(node: yaml.Node, path: list[str | int], spec: SpecFile) -> None:
    spec.lines[pointer(path)] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            if key == "<<":
                continue
            if key_node.tag != "tag:yaml.org,2002:str":
                spec.problems.append(
                    Problem(
                        spec.path,
                        pointer([*path, key]),
                        f"key {key!r} is not text",
                        "quote it; spec keys are strings",
                        key_node.start_mark.line + 1,
                    )
                )
            if key in seen:
                ptr = pointer([*path, key])
                spec.problems.append(
                    Problem(
                        spec.path,
                        ptr,
                        f"duplicate key {key!r} (first at line {seen[key]})",
                        "YAML keeps only the last one; remove the other",
                        key_node.start_mark.line + 1,
                    )
                )
            seen[key] = key_node.start_mark.line + 1
            _walk(value_node, [*path, key], spec)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, [*path, index], spec)


# libyaml's parser when PyYAML has it (its wheels do): planning hundreds of specs is
# dominated by YAML parsing otherwise.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def expanded_size(root: yaml.Node, limit: int = MAX_EXPANDED_NODES) -> int:
    """Nodes the document holds once every alias is expanded, counted up to ``limit + 1``.

    Aliases are shared node objects, so each distinct node is sized once (linear in the file);
    a node that contains itself (a recursive alias) counts as over the limit.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        kids = _children(node)
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(limit + 1, 1 + sum(sizes[id(k)] for k in kids))
            continue
        if id(node) in open_nodes:
            return limit + 1
        open_nodes.add(id(node))
        stack.append((node, True))
        for kid in kids:
            if id(kid) in open_nodes:
                return limit + 1
            if id(kid) not in sizes:
                stack.append((kid, False))
    return sizes[id(root)]


def parse_text(text: str, path: str) -> SpecFile:
    """Parse once: compose nodes (for lines and duplicate keys), then construct the data from them."""
    spec = SpecFile(path)
    loader = _Loader(text)
    try:
        nodes: list[yaml.Node] = []
        while loader.check_node():
            node = loader.get_node()
            if node is not None:  # check_node() said one follows
                nodes.append(node)
        nodes = [n for n in nodes if not (isinstance(n, yaml.ScalarNode) and n.tag.endswith(":null"))]
        if len(nodes) > 1:
            spec.problems.append(
                Problem(
                    path,
                    "",
                    f"the file holds {len(nodes)} YAML documents; expected one Queue spec",
                    "put each queue in a file of its own",
                )
            )
            return spec
        if not nodes:
            spec.problems.append(Problem(path, "", "the file is empty; expected one Queue spec"))
            return spec
        if expanded_size(nodes[0]) > MAX_EXPANDED_NODES:
            spec.problems.append(
                Problem(
                    path,
                    "",
                    f"its YAML aliases expand to more than {MAX_EXPANDED_NODES} nodes (or refer to themselves)",
                    "a queue spec needs no alias that large: write the values out",
                )
            )
            return spec
        data = loader.construct_document(nodes[0])
    except RecursionError:
        spec.problems.append(Problem(path, "", "the YAML is nested too deeply to be a queue spec"))
        return spec
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        spec.problems.append(
            Problem(
                path,
                "",
                f"YAML syntax error: {reason}",
                None,
                mark.line + 1 if mark else None,
                mark.column + 1 if mark else None,
            )
        )
        return spec
    finally:
        loader.dispose()
    try:
        _walk(nodes[0], [], spec)
    except RecursionError:
        spec.lines.clear()
        spec.problems.append(Problem(path, "", "the YAML is nested too deeply to be a queue spec"))
        return spec
    spec.data = data
    return spec


def read_spec_file(path: Path, known: Callable[[str, str], SpecFile | None] = lambda _p, _h: None) -> SpecFile:
    """Read and parse one spec; ``known`` may answer for bytes checked before (see cache.py)."""
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            spec = SpecFile(str(path))
            size = path.stat().st_size
            spec.problems.append(Problem(str(path), "", f"the file has {size} bytes; a spec may have {MAX_SPEC_BYTES}"))
            return spec
        raw = path.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        hit = known(str(path), digest)
        if hit is not None:
            return hit
        spec = parse_text(raw.decode("utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        spec = SpecFile(str(path))
        spec.problems.append(Problem(str(path), "", f"cannot read the file: {exc}"))
        return spec
    spec.sha256 = digest
    return spec


def expand_paths(paths: list[str]) -> list[Path]:
    """Spec files named by the user: files as given, directories searched recursively."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found.extend(
                sorted(
                    x
                    for x in p.rglob("*")
                    if x.suffix in SPEC_SUFFIXES and x.name != PLATFORM_FILE_NAME and x.is_file()
                )
            )
        elif p.is_file():
            found.append(p)
        else:
            raise UsageError(f"{raw}: no such file or directory")
    if not found:
        raise UsageError(f"no spec files (*.yaml, *.yml) under {', '.join(paths)}")
    # The same file named twice (a directory and a file in it) is one spec, not a clash.
    unique: dict[Path, Path] = {}
    for p in found:
        unique.setdefault(p.resolve(), p)
    return list(unique.values())
