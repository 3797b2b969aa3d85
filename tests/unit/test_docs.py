"""The pages a user reads: each short enough to read, and the benchmark figures those of the results.

docs/benchmarks.md's figures are written by ``bench/goals.py --markdown`` from the results
committed under bench/results; a page whose table was edited by hand, or not rewritten after a
new run, would show figures no run produced.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE_LINES = 600  # README.md and docs/*.md
DESIGN_LINES = 300  # docs/design/*.md: readable in one sitting


def load_goals() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_goals", ROOT / "bench" / "goals.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "design").glob("*.md"))]


def limit(page: Path) -> int:
    return DESIGN_LINES if page.parent.name == "design" else PAGE_LINES


def too_long(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Pages over their limit, each with its length."""
    return [f"{p.relative_to(root)}: {n} lines" for p in paths if (n := len(p.read_text().splitlines())) > limit(p)]


def test_no_page_is_longer_than_its_limit() -> None:
    assert (ROOT / "docs" / "design").is_dir() and len(pages()) > 3
    assert too_long(pages()) == [], f"pages over {PAGE_LINES} lines (design notes: {DESIGN_LINES})"


def test_a_page_over_its_limit_is_caught(tmp_path: Path) -> None:
    design = tmp_path / "docs" / "design"
    design.mkdir(parents=True)
    (design / "long.md").write_text("line\n" * (DESIGN_LINES + 1))
    (design / "short.md").write_text("line\n" * DESIGN_LINES)
    (tmp_path / "docs" / "page.md").write_text("line\n" * PAGE_LINES)
    (tmp_path / "docs" / "long.md").write_text("line\n" * (PAGE_LINES + 1))

    found = too_long(sorted(tmp_path.rglob("*.md")), tmp_path)

    assert found == [f"docs/design/long.md: {DESIGN_LINES + 1} lines", f"docs/long.md: {PAGE_LINES + 1} lines"]


def test_the_benchmarks_page_holds_the_figures_of_the_results() -> None:
    goals = load_goals()
    page = goals.PAGE.read_text()
    assert page == goals.with_table(page, goals.markdown(goals.RESULTS)), (
        "docs/benchmarks.md does not hold the figures of bench/results: run bench/goals.py --markdown"
    )


def test_the_table_shows_every_goal_and_every_benchmark_not_run(tmp_path: Path) -> None:
    goals = load_goals()
    kmq = {
        "goal": "kmq worker / consumer-group worker",
        "ratio": 0.971,
        "bound": ">= 0.85",
        "met": True,
        "measured": 31485.2,
        "baseline": 32420.0,
    }
    lost = {**kmq, "goal": "soak, share: records lost / produced", "ratio": 0.001, "bound": "<= 0.0"}
    lost.update(met=False, measured=3, baseline=179994)
    (tmp_path / "kmq.json").write_text(json.dumps({"goals": [kmq]}))
    (tmp_path / "soak.json").write_text(json.dumps({"goals": [lost]}))
    (tmp_path / "kmq.png").write_bytes(b"png")

    table = goals.markdown(tmp_path)

    rows = table.splitlines()
    assert "| kmq | kmq worker / consumer-group worker | 31,485.2 | 32,420 | 0.971 | >= 0.85 | met |" in rows
    assert "| soak | soak, share: records lost / produced | 3 | 179,994 | 0.001 | <= 0.0 | **not met** |" in rows
    for name in ("provision", "share", "consumer", "footprint"):
        assert f"| {name} | no results in bench/results (not run) | - | - | - | - | not run |" in rows
    assert "![kmq](../bench/results/kmq.png)" in rows
    assert not any("soak.png" in row for row in rows), "a plot the results do not hold is not shown"


def test_rewriting_the_page_replaces_only_its_figures(tmp_path: Path) -> None:
    goals = load_goals()
    page = f"# Benchmarks\n\nbefore\n\n{goals.BEGIN}\n| old | table |\n{goals.END}\n\nafter\n"

    rewritten = goals.with_table(page, "| new | table |")

    assert rewritten == f"# Benchmarks\n\nbefore\n\n{goals.BEGIN}\n| new | table |\n{goals.END}\n\nafter\n"
    with pytest.raises(SystemExit, match="figures section"):
        goals.with_table("# Benchmarks\n\nno markers\n", "| new | table |")


def _layout_names(text: str) -> tuple[set[str], dict[str, str]]:
    """docs/layout.md's module paths in backticks, and each folder row's text by its folder."""
    rows = {line.split("`")[1]: line for line in text.splitlines() if line.startswith("| `")}
    named = {part for part in text.split("`")[1::2] if part.endswith(".py")}
    return named, rows


def test_the_layout_page_names_every_module_of_the_library():
    """A module the layout page does not name is one a developer cannot place: every file under
    queueplane/ has a row of its own, or is named in the row of its folder (a group type's
    folder row names its executor/ half's files too)."""
    named, rows = _layout_names((ROOT / "docs" / "layout.md").read_text())
    missing = []
    for path in sorted((ROOT / "queueplane").rglob("*.py")):
        relative = path.relative_to(ROOT / "queueplane").as_posix()
        if path.name in ("__init__.py", "__main__.py") or relative in named or f"queueplane/{relative}" in named:
            continue
        folder = relative.rsplit("/", 1)[0] + "/"
        owners = [folder, f"queueplane/{folder}", folder.removesuffix("executor/")]
        if any(f"`{path.name}`" in rows.get(owner, "") for owner in owners):
            continue
        missing.append(relative)
    assert not missing, f"docs/layout.md does not name: {', '.join(missing)}"
