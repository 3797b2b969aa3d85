"""One table of every benchmark goal: the ratio each benchmark measured, its bound, met or not.

Each benchmark writes its goals into ``bench/results/NAME.json`` (``goals``: a list made by
``common.goal``); this reads them all, so `make bench` ends with one place to look. A
benchmark that has not run is listed as such, never as met.

    .venv/bin/python bench/goals.py
"""

from __future__ import annotations

import json
import sys

from common import RESULTS
from rich.console import Console
from rich.table import Table

# Every benchmark that states goals, in the order `make bench` runs them.
BENCHMARKS = ("provision", "share", "consumer", "kmq", "footprint", "soak")


def main() -> int:
    table = Table(title="benchmark goals (ratios measured side by side in one run)")
    for column in ("benchmark", "goal", "measured", "bound", "met"):
        table.add_column(column)
    for name in BENCHMARKS:
        path = RESULTS / f"{name}.json"
        goals = json.loads(path.read_text()).get("goals") if path.is_file() else None
        if not isinstance(goals, list):
            table.add_row(name, "no results with goals (run it)", "-", "-", "[yellow]not run[/]")
            continue
        for goal in goals:
            met = "[green]met[/]" if goal["met"] else "[red]not met[/]"
            table.add_row(name, goal["goal"], f"{goal['ratio']:.3f}", goal["bound"], met)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
