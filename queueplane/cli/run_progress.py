"""The worker as a person watches it: rich progress bars while it runs, a table at the end."""

from __future__ import annotations

from dataclasses import replace

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from queueplane.kafka.lag import total_lag
from queueplane.kafka.target import KafkaTarget
from queueplane.run.driver.application import QueueJob, run_application
from queueplane.run.driver.options import BatchProgress, RunOptions, RunSummary
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, DUPLICATE, REDELIVERED, RELEASED, SKIPPED


def run_with_progress(job: QueueJob, target: KafkaTarget, options: RunOptions, console: Console) -> list[RunSummary]:
    """One queue's application, its outcomes and backlog drawn as bars while it runs."""
    initial = (total_lag(job.backlog()) or 0) if job.backlog is not None else 0
    total = options.max_records or initial or None
    with Progress(
        TextColumn("{task.description:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bars = {
            ACCEPTED: progress.add_task("accepted", total=total),
            RELEASED: progress.add_task("released", total=None),
            DEAD_LETTERED: progress.add_task("dlq", total=total),
        }
        backlog_bar = progress.add_task("backlog", total=initial or None, completed=0)

        def on_batch(p: BatchProgress) -> None:
            for outcome, task in bars.items():
                progress.update(task, completed=p.counts.get(outcome, 0))
            if p.backlog is not None:
                peak = max(initial, p.backlog)
                progress.update(backlog_bar, total=peak, completed=peak - p.backlog, description=f"backlog {p.backlog}")

        return run_application([replace(job, on_batch=on_batch)], target, options)


def summary_table(summary: RunSummary) -> Table:
    table = Table(title=f"{summary.queue} ({summary.group_type} group)", show_header=True)
    table.add_column("outcome")
    table.add_column("records", justify="right")
    for outcome in (ACCEPTED, RELEASED, DEAD_LETTERED):
        table.add_row(outcome, str(summary.counts.get(outcome, 0)))
    if summary.counts.get(REDELIVERED):  # kmq: deliveries the tracker timed out and produced again
        table.add_row(REDELIVERED, str(summary.counts[REDELIVERED]))
    if summary.counts.get(SKIPPED):  # consumer groups: handled before a restart, below the committed offset
        table.add_row(SKIPPED, str(summary.counts[SKIPPED]))
    if summary.counts.get(DUPLICATE):  # kmq: copies of messages that had ended already
        table.add_row(DUPLICATE, str(summary.counts[DUPLICATE]))
    table.add_section()
    table.add_row("duration", f"{summary.duration_s:.1f}s")
    table.add_row("throughput", f"{summary.records_per_s:.0f} records/s")
    table.add_row("lag at exit", "unknown" if summary.lag_at_exit is None else str(summary.lag_at_exit))
    if summary.removed_by_retention:
        table.add_row("removed by retention, unread", str(summary.removed_by_retention))
    if summary.kafka_outages:
        seconds = sum(o["seconds"] for o in summary.kafka_outages)
        table.add_row("Kafka not answering", f"{len(summary.kafka_outages)} time(s), {seconds:.0f}s in all")
    if summary.kafka_client_errors:
        errors = summary.kafka_client_errors
        table.add_row("Kafka client errors", ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
    if summary.dead_lettered_by_delivery_count:
        counts = summary.dead_lettered_by_delivery_count
        table.add_row("dlq by delivery count", ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return table
