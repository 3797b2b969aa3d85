"""The worker as a person watches it: rich progress bars while it runs, a table at the end."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from queueplane.kafka.lag import queue_backlog, total_lag
from queueplane.kafka.target import KafkaTarget
from queueplane.ops.status import queue_reads
from queueplane.run.driver import QueueJob, run_application, run_queue
from queueplane.run.options import BatchProgress, RunOptions, RunSummary
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, DUPLICATE, REDELIVERED, RELEASED, SKIPPED
from queueplane.spec.model import QueueSpec


def run_with_progress(
    queue: QueueSpec, target: KafkaTarget, options: RunOptions, console: Console, show: bool
) -> RunSummary:
    backlog = queue_backlog(target, queue)
    # Served metrics include the oldest wait and the DLQ count, read every few seconds.
    reads = queue_reads(target, queue) if options.metrics_port is not None else None
    if not show:
        return run_queue(queue, target, options, backlog=backlog, reads=reads)
    initial = total_lag(backlog()) or 0
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

        return run_queue(queue, target, options, on_batch=on_batch, backlog=backlog, reads=reads)


def run_application_of(queues: list[QueueSpec], target: KafkaTarget, options: RunOptions) -> list[RunSummary]:
    """Several queues in one worker application, each read and served as it would be alone."""
    jobs = [
        QueueJob(
            queue,
            backlog=queue_backlog(target, queue),
            reads=queue_reads(target, queue) if options.metrics_port is not None else None,
        )
        for queue in queues
    ]
    return run_application(jobs, target, options)


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
