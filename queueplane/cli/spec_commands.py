"""Commands on specs and the Kafka cluster: validate, plan, apply."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from queueplane.cli.common import (
    cluster_flags,
    command,
    duration_flag,
    emit,
    err,
    kube_flags,
    out,
    output_flag,
    resolve_target,
)
from queueplane.errors import EXIT_CHANGES, EXIT_OK, EXIT_REFUSED, EXIT_STALE, UsageError
from queueplane.kafka.target import named_target
from queueplane.provision import saved_plan, steps
from queueplane.provision.plan import Plan, RemovalOptions
from queueplane.provision.plan_text import render_plan

DEFAULT_GRACE = "24h"


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
        "Diff the specs against the live cluster: + create, = adopt or keep, ~ change, - delete, "
        "> wait, ! refused. A queue whose spec is gone from the planned files and folders (found by "
        "the cluster's owner records) is removed: its release, ACLs, group and owner records go, its "
        "topics as its spec.deletionPolicy said. Changes nothing.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help=f"exit {EXIT_CHANGES} when there are changes to apply or waiting, removals too, {EXIT_OK} when none "
        "(CI gates on drift)",
    )
    p.add_argument(
        "-out",
        "--out",
        metavar="FILE",
        help="also save the plan to FILE (JSON), for `apply FILE` to apply exactly it or refuse "
        f"(exit {EXIT_STALE}) if the specs or the cluster moved since",
    )
    _removal_flags(p)
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
        f"or refuse with exit {EXIT_STALE} if its specs or the cluster changed since. A removal "
        "uninstalls the removed queue's Helm release first (with --kubeconfig, else $KUBECONFIG, else "
        "~/.kube/config), then revokes its ACLs, deletes its group and its configs, the topics its "
        "deletionPolicy lets go, and its owner records.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="specs and folders, or one saved plan file")
    p.add_argument("-y", "--yes", action="store_true", help="apply without asking")
    _removal_flags(p)
    kube_flags(p, "kubeconfig of the cluster whose releases a removal uninstalls")
    cluster_flags(p)
    output_flag(p)
    p.set_defaults(handler=cmd_apply)


def _removal_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--removal-grace",
        metavar="DURATION",
        help="a removed queue's deletionPolicy: delete topics go only once their newest record is older than "
        f"this ({DEFAULT_GRACE})",
    )
    parser.add_argument(
        "--force-delete-dlq",
        action="store_true",
        help="also delete a removed queue's dead-letter topic that still holds records (deletionPolicy: delete)",
    )


def _removal_options(args: argparse.Namespace) -> RemovalOptions:
    grace = duration_flag(args.removal_grace or DEFAULT_GRACE, "--removal-grace") or 0.0
    return RemovalOptions(int(grace), args.force_delete_dlq)


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
        planned = steps.plan(args.paths, target, _removal_options(args))
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

    from queueplane.deploy.kube_access import KubeAccess, default_kubeconfig

    target = resolve_target(args.bootstrap_servers, args.kafka_config)
    saved = _saved_plan(args.paths)
    if saved is not None and (args.removal_grace or args.force_delete_dlq):
        raise UsageError("a saved plan was planned with its own --removal-grace and --force-delete-dlq: plan again")
    with err.status("reading the cluster"):
        if saved is None:
            planned = steps.plan(args.paths, target, _removal_options(args))
        else:
            planned = saved_plan.replan(saved, target)
    plan = planned.plan
    if args.output == "text":
        render_plan(plan, out)
    plan.raise_if_refused()
    if not plan.actionable:
        if args.output != "text":
            emit(args.output, {"plan": plan.as_dict(), "applied": []})
        elif plan.pending:
            out.print(f"Nothing to apply now: {len(plan.pending)} line(s) kept or waiting.")
        return EXIT_OK
    if not args.yes and saved is None:
        if not sys.stdin.isatty():
            raise UsageError("apply needs confirmation: run it in a terminal, or pass --yes")
        answer = err.input(f"Apply {len(plan.actionable)} change(s) to {plan.cluster}? Only 'yes' applies: ")
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
        task = progress.add_task("applying", total=len(plan.actionable))

        def on_step(title: str, count: int) -> None:
            progress.update(task, description=title, advance=count)

        kube = KubeAccess(args.kubeconfig or default_kubeconfig(), args.context, in_cluster=False)
        report = steps.apply(planned, on_step, kube=kube)
    if args.output != "text":
        emit(args.output, {"plan": plan.as_dict(), **report.as_dict()})
    else:
        out.print(_applied_text(plan))
    return EXIT_OK


def _applied_text(plan: Plan) -> str:
    counts = plan.counts()
    adopted = f"{counts['adopt']} adopted, " if counts["adopt"] else ""
    deleted = f", {counts['delete']} deleted" if counts["delete"] else ""
    later = f" {counts['wait']} waiting for a later plan." if counts["wait"] else ""
    return f"Apply complete: {counts['create']} created, {adopted}{counts['change']} changed{deleted}.{later}"


def _saved_plan(paths: list[str]) -> saved_plan.SavedPlan | None:
    """The saved plan ``apply`` was given, or None for specs; a plan file comes alone."""
    plans = [p for p in paths if saved_plan.is_saved_plan(p)]
    if not plans:
        return None
    if len(paths) > 1:
        raise UsageError(f"apply takes one saved plan alone, not with other paths: {plans[0]}")
    return saved_plan.read(plans[0])
