"""The plan as people read it: one block per spec, one line per change, + = ~ - > ! marks.

The command line and the Airflow task log print the same text from here. A removed spec's
block says which queue it held (and the queues that took part of it over, for a rename); its
lines are what goes (``-``), what stays (``=``) and what waits (``>``, applied by a later plan).
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from queueplane.provision.plan import Change, Plan

_STYLES = {
    "create": "green",
    "adopt": "cyan",
    "change": "yellow",
    "delete": "red",
    "refuse": "red",
    "retain": "cyan",
    "wait": "magenta",
}


def _heading(plan: Plan, spec: str, changes: list[Change]) -> str:
    removed = sorted({c.removes for c in changes if c.removes})
    if not removed:
        return f"[bold]{escape(spec)}[/bold]"
    notes = []
    for queue in removed:
        removal = plan.removals.get(queue)
        renamed = f", renamed to {', '.join(removal.renamed_to)}" if removal and removal.renamed_to else ""
        notes.append(f"queue {queue}{renamed}")
    return f"[bold]{escape(spec)}[/bold] (removed: {escape('; '.join(notes))})"


def render_plan(plan: Plan, console: Console) -> None:
    console.print(f"Cluster: {plan.cluster}")
    if not plan.changes:
        console.print(f"No changes. The cluster matches {len(plan.specs)} spec(s).")
        return
    by_spec: dict[str, list[Change]] = {}
    for change in plan.changes:
        by_spec.setdefault(change.spec, []).append(change)
    kind_width = max(len(c.kind) for c in plan.changes)
    target_width = max(len(c.target) for c in plan.changes)
    for spec, changes in by_spec.items():
        console.print(f"\n{_heading(plan, spec, changes)}")
        for change in changes:
            style = _STYLES[change.action]
            line = f"{change.kind:<{kind_width}}  {change.target:<{target_width}}  {change.describe()}"
            console.print(f"  [{style}]{change.symbol}[/{style}] {escape(line)}")
    counts = plan.counts()
    adopted = f"{counts['adopt']} to adopt, " if counts["adopt"] else ""
    deleted = f"{counts['delete']} to delete, " if counts["delete"] else ""
    kept = f"{counts['retain']} kept, " if counts["retain"] else ""
    waiting = f"{counts['wait']} waiting, " if counts["wait"] else ""
    console.print(
        f"\nPlan: {counts['create']} to create, {adopted}{counts['change']} to change, {deleted}{kept}{waiting}"
        f"{counts['refuse']} refused."
    )
    if counts["wait"]:
        console.print("Waiting (>) lines are applied by a later plan, once what they wait for is done.")
