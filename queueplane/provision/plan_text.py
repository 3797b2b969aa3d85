"""The plan as people read it: one block per spec, one line per change, + = ~ - ! marks.

The command line and the Airflow task log print the same text from here.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from queueplane.provision.plan import Plan

_STYLES = {"create": "green", "adopt": "cyan", "change": "yellow", "delete": "red", "refuse": "red"}


def render_plan(plan: Plan, console: Console) -> None:
    console.print(f"Cluster: {plan.cluster}")
    if not plan.changes:
        console.print(f"No changes. The cluster matches {len(plan.specs)} spec(s).")
        return
    by_spec: dict[str, list] = {}
    for change in plan.changes:
        by_spec.setdefault(change.spec, []).append(change)
    kind_width = max(len(c.kind) for c in plan.changes)
    target_width = max(len(c.target) for c in plan.changes)
    for spec, changes in by_spec.items():
        console.print(f"\n[bold]{spec}[/bold]")
        for change in changes:
            style = _STYLES[change.action]
            line = f"{change.kind:<{kind_width}}  {change.target:<{target_width}}  {change.describe()}"
            console.print(f"  [{style}]{change.symbol}[/{style}] {escape(line)}")
    counts = plan.counts()
    adopted = f"{counts['adopt']} to adopt, " if counts["adopt"] else ""
    deleted = f"{counts['delete']} to delete, " if counts["delete"] else ""
    console.print(
        f"\nPlan: {counts['create']} to create, {adopted}{counts['change']} to change, {deleted}"
        f"{counts['refuse']} refused."
    )
