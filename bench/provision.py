"""Provisioning benchmark: plan + apply of 200 generated specs against a real local broker.

Reports the first apply, the no-op re-plan, and the re-plan as a ratio to the least any
tool must do: connect and describe every topic in one batched request, run side by side
in the same run. Goals: re-plan of 200 specs under 5 s, ratio under 3.

    .venv/bin/python bench/provision.py [--specs 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import TopicCollection
from rich.console import Console
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import RESULTS, goal
from specs_factory import dump, spec

from queueplane.kafka import clients
from queueplane.kafka.target import KafkaTarget
from queueplane.local.stack import LocalStack
from queueplane.provision import steps
from queueplane.provision.plan import desired_state

WARMUP_ROUNDS = 2
console = Console(stderr=True)


def generate(directory: Path, count: int) -> None:
    """A realistic mix: a third each of share, consumer and kmq queues, 2-12 partitions."""
    for i in range(count):
        kind = ("share", "consumer", "kmq")[i % 3]
        doc = spec(kind, name=f"q{i:03d}", group=f"team{i % 17}-g{i:03d}", topic=f"team{i % 17}.queue{i:03d}.v1")
        doc["metadata"]["team"] = f"team{i % 17}"
        doc["spec"]["topic"]["partitions"] = 2 + (i % 6) * 2
        doc["spec"]["topic"]["config"] = {"retention.ms": str(86_400_000 * (1 + i % 7))}
        (directory / f"q{i:03d}.yaml").write_text(dump(doc))


def wait_until_quiet(pid: int, idle_share: float = 0.1, window_s: float = 2.0, limit_s: float = 120.0) -> float:
    """Wait until the broker uses under ``idle_share`` of a core for a whole window.

    After a big apply the broker keeps creating partition logs for tens of seconds; timing
    against a busy broker measures its backlog, not the plan.
    """
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu_s() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        before = cpu_s()
        time.sleep(window_s)
        if (cpu_s() - before) / window_s < idle_share:
            break
    return time.monotonic() - started


def batched_describe(target: KafkaTarget, topics: list[str]) -> None:
    admin = clients.admin(target.settings)
    for future in admin.describe_topics(TopicCollection(topics)).values():
        future.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    RESULTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qp-bench-") as tmp:
        os.environ["QUEUEPLANE_HOME"] = tmp  # own spec cache and broker, nothing shared with a checkout
        stack = LocalStack(Path(tmp) / "local")
        with console.status("starting a local Kafka broker for the benchmark"):
            state = stack.up()
        try:
            target = KafkaTarget({"bootstrap.servers": state.bootstrap}, state.bootstrap)
            specs_dir = Path(tmp) / "specs"
            specs_dir.mkdir()
            generate(specs_dir, args.specs)

            started = time.perf_counter()
            planned = steps.plan([str(specs_dir)], target)
            first_plan_s = time.perf_counter() - started
            steps.apply(planned)
            first_apply_s = time.perf_counter() - started
            topics = [t.name for t in desired_state(planned.queues)[0]]
            changes = len(planned.plan.changes)
            with console.status("waiting for the broker to finish creating partition logs"):
                settle_s = wait_until_quiet(state.pid)

            replan, describe, cold = [], [], []
            spec_cache = Path(tmp) / "cache" / "spec-checks.json"
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("re-plan vs batched describe", total=args.rounds + WARMUP_ROUNDS)
                for round_no in range(args.rounds + WARMUP_ROUNDS):
                    t0 = time.perf_counter()
                    again = steps.plan([str(specs_dir)], target)
                    replan.append(time.perf_counter() - t0)
                    assert again.plan.changes == [], "re-plan after apply must be empty"
                    t0 = time.perf_counter()
                    batched_describe(target, topics)
                    describe.append(time.perf_counter() - t0)
                    spec_cache.unlink()  # the same re-plan with every spec parsed and checked again
                    t0 = time.perf_counter()
                    steps.plan([str(specs_dir)], target)
                    cold.append(time.perf_counter() - t0)
                    if round_no < WARMUP_ROUNDS:  # JIT and caches of a fresh broker, not the plan
                        replan.pop()
                        describe.pop()
                        cold.pop()
                    progress.advance(task)
        finally:
            stack.down(purge=True)

    result = {
        "specs": args.specs,
        "topics": len(topics),
        "first_apply_changes": changes,
        "first_plan_s": round(first_plan_s, 3),
        "first_apply_s": round(first_apply_s, 3),
        "noop_replan_median_s": round(statistics.median(replan), 3),
        "noop_replan_cold_spec_cache_median_s": round(statistics.median(cold), 3),
        "batched_describe_median_s": round(statistics.median(describe), 3),
        "replan_to_describe_ratio": round(statistics.median(replan) / statistics.median(describe), 2),
        "cold_replan_to_describe_ratio": round(statistics.median(cold) / statistics.median(describe), 2),
        "rounds": args.rounds,
        "broker_settle_s": round(settle_s, 1),
    }
    result["goals"] = [
        goal("no-op re-plan, seconds / 5 s", result["noop_replan_median_s"], 5.0, at_most=1.0),
        goal(
            "no-op re-plan / batched describe",
            result["noop_replan_median_s"],
            result["batched_describe_median_s"],
            at_most=3.0,
        ),
    ]
    (RESULTS / "provision.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, replan, describe, cold)
    print(json.dumps(result, indent=2))
    console.print(f"re-plan rounds (s): {[round(x, 3) for x in replan]}")
    console.print(f"cold re-plan rounds (s): {[round(x, 3) for x in cold]}")
    console.print(f"describe rounds (s): {[round(x, 3) for x in describe]}")
    return 0


def plot(result: dict, replan: list[float], describe: list[float], cold: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = ["first plan+apply", "re-plan", "re-plan\n(cold cache)", "batched\ndescribe"]
    values = [
        result["first_apply_s"],
        result["noop_replan_median_s"],
        result["noop_replan_cold_spec_cache_median_s"],
        result["batched_describe_median_s"],
    ]
    left.bar(labels, values, color=["#4c72b0", "#55a868", "#8172b2", "#c44e52"])
    left.axhline(5, color="grey", linestyle="--", linewidth=1, label="re-plan goal (5 s)")
    left.set_ylabel("seconds")
    left.set_title(f"{result['specs']} specs, {result['topics']} topics")
    left.legend()
    rounds = range(1, len(replan) + 1)
    right.plot(rounds, replan, marker="o", label="no-op re-plan")
    right.plot(rounds, cold, marker="o", label="re-plan, cold spec cache")
    right.plot(rounds, describe, marker="o", label="batched describe")
    right.set_xlabel("round")
    right.set_ylabel("seconds")
    right.set_title(f"ratio {result['replan_to_describe_ratio']} (goal < 3)")
    right.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "provision.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
