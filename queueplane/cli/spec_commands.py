"""Commands on specs and the Kafka cluster: validate, plan, apply."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from queueplane.cli.common import cluster_flags, command, emit, err, out, output_flag, resolve_target
from queueplane.errors import EXIT_CHANGES, EXIT_OK, EXIT_REFUSED, EXIT_STALE, UsageError
from queueplane.kafka.target import named_target
from queueplane.provision import saved_plan, steps
from queueplane.provision.plan_text import render_plan


def register(commands: Any) -> None:
    p = command(
        commands,
        "validate",
        "check specs against the schema and the rules",
        "Check specs (files or directories). Offline, with Kafka's default "
        "share-group bounds, unless a cluster is named; then with its bounds.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH")
    cluster_flags(p)
    output_flag(p)
    p.set_defaults(handler=cmd_validate)

    p = command(
        commands,
        "plan",
        "show what apply would change on the cluster",
        "Diff the specs against the live cluster: + create, ~ change, ! refused. Changes nothing.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help=f"exit {EXIT_CHANGES} when there are changes to apply, {EXIT_OK} when none (CI gates on drift)",
    )
    p.add_argument(
        "-out",
        "--out",
        metavar="FILE",
        help="also save the plan to FILE (JSON), for `apply FILE` to apply exactly it or refuse "
        f"(exit {EXIT_STALE}) if the specs or the cluster moved since",
    )
    cluster_flags(p)
    output_flag(p)
    p.set_defaults(handler=cmd_plan)

    p = command(
        commands,
        "apply",
        "make the cluster match the specs",
        "Plan, show the plan, ask, then apply it. The cluster checks every "
        "request in a dry run first; a failure reports what was applied. Given a plan file "
        "saved by `plan --out`, apply exactly that plan without asking (it was the approval), "
        f"or refuse with exit {EXIT_STALE} if its specs or the cluster changed since.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="specs and folders, or one saved plan file")
    p.add_argument("-y", "--yes", action="store_true", help="apply without asking")
    cluster_flags(p)
    output_flag(p)
    p.set_defaults(handler=cmd_apply)


def cmd_validate(args: argparse.Namespace) -> int:
    target = named_target(args.bootstrap_servers, args.kafka_config)
    queues = steps.validate(args.paths, target)
    if args.output != "text":
        specs = [{"file": q.source, "name": q.name, "team": q.team, "group": q.group.type} for q in queues]
        emit(args.output, {"valid": True, "specs": specs})
    else:
        bounds = f"bounds of {target.label}" if target else "Kafka's default share-group bounds"
        for q in queues:
            out.print(f"ok  {q.source}  {q.team}/{q.name} ({q.group.type})", markup=False)
        out.print(f"{len(queues)} spec(s) valid ({bounds}).", markup=False)
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    with err.status("reading the cluster"):
        planned = steps.plan(args.paths, target)
    if args.out:
        saved_plan.write(planned, args.out)
    if args.output != "text":
        emit(args.output, planned.plan.as_dict())
    else:
        render_plan(planned.plan, out)
    if planned.plan.refused:
        return EXIT_REFUSED
    return EXIT_CHANGES if args.detailed_exitcode and planned.plan.changes else EXIT_OK


def cmd_apply(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    saved = _saved_plan(args.paths)
    with err.status("reading the cluster"):
        planned = steps.plan(args.paths, target) if saved is None else saved_plan.replan(saved, target)
    plan = planned.plan
    if args.output == "text":
        render_plan(plan, out)
    plan.raise_if_refused()
    if not plan.changes:
        if args.output != "text":
            emit(args.output, {"plan": plan.as_dict(), "applied": []})
        return EXIT_OK
    if not args.yes and saved is None:
        if not sys.stdin.isatty():
            raise UsageError("apply needs confirmation: run it in a terminal, or pass --yes")
        answer = err.input(f"Apply {len(plan.changes)} change(s) to {plan.cluster}? Only 'yes' applies: ")
        if answer.strip() != "yes":
            err.print("Apply cancelled; nothing was changed.")
            return EXIT_OK
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("applying", total=len(plan.changes))

        def on_step(title: str, count: int) -> None:
            progress.update(task, description=title, advance=count)

        report = steps.apply(planned, on_step)
    if args.output != "text":
        emit(args.output, {"plan": plan.as_dict(), **report.as_dict()})
    else:
        counts = plan.counts()
        adopted = f"{counts['adopt']} adopted, " if counts["adopt"] else ""
        deleted = f", {counts['delete']} deleted" if counts["delete"] else ""
        out.print(f"Apply complete: {counts['create']} created, {adopted}{counts['change']} changed{deleted}.")
    return EXIT_OK


def _saved_plan(paths: list[str]) -> saved_plan.SavedPlan | None:
    """The saved plan ``apply`` was given, or None for specs; a plan file comes alone."""
    plans = [p for p in paths if saved_plan.is_saved_plan(p)]
    if not plans:
        return None
    if len(paths) > 1:
        raise UsageError(f"apply takes one saved plan alone, not with other paths: {plans[0]}")
    return saved_plan.read(plans[0])
