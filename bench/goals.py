"""One table of every benchmark goal: the ratio each benchmark measured, its bound, met or not.

Each benchmark writes its goals into ``bench/results/NAME.json`` (``goals``: a list made by
``common.goal``); this reads them all, so `make bench` ends with one place to look. A
benchmark that has not run is listed as such, never as met.

The same table, with the benchmarks' plots, is the figures section of docs/benchmarks.md,
between its ``goals:begin`` and ``goals:end`` markers. The page is written from the committed
results, never by hand, so its figures are always those of the latest run; a unit test checks
that the page holds what this makes from bench/results.

    .venv/bin/python bench/goals.py              # the table on the terminal
    .venv/bin/python bench/goals.py --markdown   # rewrite the page's table from bench/results
    .venv/bin/python bench/goals.py --check      # exit 1 if the page's table is not the results'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- goals:begin (written by bench/goals.py --markdown from bench/results; do not edit) -->"
END = "<!-- goals:end -->"

# Every benchmark that states goals, in the order `make bench` runs them.
BENCHMARKS = ("provision", "share", "consumer", "kmq", "footprint", "soak")
# Every plot a benchmark writes, in the same order; the page shows those the results hold.
PLOTS = ("provision", "share", "consumer", "autoscale", "kmq", "footprint", "idle_cost", "soak")


def load_goals(results: Path) -> dict[str, list[dict[str, Any]] | None]:
    """Each benchmark's goals from its results file; None where it has not run (or wrote no goals)."""
    found: dict[str, list[dict[str, Any]] | None] = {}
    for name in BENCHMARKS:
        path = results / f"{name}.json"
        goals = json.loads(path.read_text()).get("goals") if path.is_file() else None
        found[name] = goals if isinstance(goals, list) else None
    return found


def number(value: float) -> str:
    """A figure as the results hold it, with thousands separated and no trailing zeros."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3f}".rstrip("0").rstrip(".")


def markdown(results: Path = RESULTS) -> str:
    """The page's figures section: one table of every goal, then each plot the results hold."""
    lines = [
        "| benchmark | goal | measured | baseline | ratio | bound | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, goals in load_goals(results).items():
        if goals is None:
            lines.append(f"| {name} | no results in bench/results (not run) | - | - | - | - | not run |")
            continue
        for goal in goals:
            measured, baseline = number(goal["measured"]), number(goal["baseline"])
            met = "met" if goal["met"] else "**not met**"
            lines.append(
                f"| {name} | {goal['goal']} | {measured} | {baseline} | {goal['ratio']:.3f} | {goal['bound']} | {met} |"
            )
    plots = [name for name in PLOTS if (results / f"{name}.png").is_file()]
    for name in plots:
        lines += ["", f"![{name}](../bench/results/{name}.png)"]
    return "\n".join(lines)


def with_table(page: str, table: str) -> str:
    """The page with its figures section replaced by ``table``."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise SystemExit(f"{PAGE}: the figures section must sit between one '{BEGIN}' and one '{END}' line")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def print_table(results: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="benchmark goals (ratios measured side by side in one run)")
    for column in ("benchmark", "goal", "measured", "bound", "met"):
        table.add_column(column)
    for name, goals in load_goals(results).items():
        if goals is None:
            table.add_row(name, "no results with goals (run it)", "-", "-", "[yellow]not run[/]")
            continue
        for goal in goals:
            met = "[green]met[/]" if goal["met"] else "[red]not met[/]"
            table.add_row(name, goal["goal"], f"{goal['ratio']:.3f}", goal["bound"], met)
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--markdown", action="store_true", help=f"rewrite the figures section of {PAGE.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {PAGE.name}'s figures are not the results'")
    args = parser.parse_args(argv)
    if not (args.markdown or args.check):
        print_table(RESULTS)
        return 0
    page = PAGE.read_text()
    wanted = with_table(page, markdown(RESULTS))
    if args.check:
        if wanted != page:
            print(f"{PAGE} does not hold the figures of bench/results: run bench/goals.py --markdown", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
