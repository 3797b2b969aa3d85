"""Autoscaling policy benchmark: a step load (x4 for five minutes) through the policy.

Simulated second by second (queueplane.run.driver.scaling.simulation) with executors that take 15 s to
start, against a fixed fleet sized for the base load and one sized for the peak, side by
side: how late the scale-out comes, the worst lag in seconds of work, executor-seconds used
compared with the peak-sized fleet, and how often the count changed.

    .venv/bin/python bench/autoscale.py [--rate 100] [--base 60] [--target-lag 30]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

from queueplane.run.driver.scaling.policy import ScalingPolicy
from queueplane.run.driver.scaling.simulation import SimResult, simulate, step_load

RESULTS = Path(__file__).resolve().parent / "results"
STEP_START, STEP_S, DURATION_S = 120.0, 300.0, 1200.0


def figures(name: str, result: SimResult, target_lag_s: float) -> dict:
    first_up = next((t for t, frm, to, _ in result.changes if to > frm), None)
    return {
        "run": name,
        "scale_out_after_s": None if first_up is None else round(first_up - STEP_START, 1),
        "worst_lag_s": round(max(result.lag_seconds), 1),
        "seconds_over_target": sum(1 for s in result.lag_seconds if s > target_lag_s),
        "executor_seconds": sum(result.running),
        "changes": len(result.changes),
        "peak_executors": max(result.requested),
    }


def plot(runs: dict[str, SimResult], target_lag_s: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (load_ax, lag_ax, exec_ax) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    auto = runs["autoscaled"]
    minutes = [t / 60 for t in auto.times]
    load_ax.plot(minutes, auto.load, color="black")
    load_ax.set_ylabel("load (records/s)")
    for name, result in runs.items():
        lag_ax.plot(minutes, result.lag_seconds, label=name)
        exec_ax.step(minutes, result.running, where="post", label=name)
    lag_ax.axhline(target_lag_s, color="red", linestyle="--", linewidth=0.8, label="targetLagSeconds")
    lag_ax.set_ylabel("lag (seconds of work)")
    lag_ax.set_yscale("symlog")
    lag_ax.set_ylim(bottom=0)
    lag_ax.legend(loc="upper right")
    exec_ax.set_ylabel("executors running")
    exec_ax.set_xlabel("minutes")
    exec_ax.legend(loc="upper right")
    fig.suptitle("Step load x4 for 5 minutes: autoscaled vs fixed fleets")
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "autoscale.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="records/s one executor handles")
    parser.add_argument("--base", type=float, default=60.0, help="base load, records/s")
    parser.add_argument("--target-lag", type=float, default=30.0)
    args = parser.parse_args()
    load = step_load(args.base, 4, STEP_START, STEP_S)
    policy = ScalingPolicy(min_executors=1, max_executors=10, target_lag_s=args.target_lag)
    peak = math.ceil(4 * args.base / args.rate)
    fixed = replace(policy, max_executors=1)
    sized = replace(policy, min_executors=peak, max_executors=peak)
    runs = {
        "autoscaled": simulate(policy, load, duration_s=DURATION_S, rate_per_executor=args.rate),
        "fixed at min": simulate(fixed, load, duration_s=DURATION_S, rate_per_executor=args.rate),
        f"fixed at peak ({peak})": simulate(sized, load, duration_s=DURATION_S, rate_per_executor=args.rate),
    }
    table = [figures(name, result, args.target_lag) for name, result in runs.items()]
    auto, peak_run = table[0], table[2]
    summary = {
        "runs": table,
        "executor_seconds_vs_peak_fleet": round(auto["executor_seconds"] / peak_run["executor_seconds"], 3),
        "plot": str(plot(runs, args.target_lag)),
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
