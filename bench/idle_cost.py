"""What an idle queue costs by group type: where bench/footprint's idle memory and CPU go.

For each group type in turn, one application of ``--queues`` idle queues of that type only
(same specs as bench/footprint's idle queues), measured the same way once every queue is
ready: RSS by role (driver JVM, driver Python, Python workers) and the tree's CPU time over
``--idle-seconds``. The figures per queue say which type to work on for footprint's goals;
this benchmark states no goal of its own.

    .venv/bin/python bench/idle_cost.py [--queues 6] [--idle-seconds 120]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from common import bench_broker, console, pyplot, save
from footprint import MIX, App, idle_figures, idle_queue, wait_ready
from marks import HANDLERS


def per_queue(figures: dict[str, Any], queues: int) -> dict[str, float]:
    roles = figures["by_role_mb_at_peak"]
    return {
        "rss_mb": round(figures["rss_mb_peak"] / queues, 1),
        "python_workers_mb": round(roles["python_workers"] / queues, 1),
        "cpu_percent_of_a_core": figures["idle_cpu_per_queue_percent_of_a_core"],
    }


def plot(result: dict[str, Any]) -> Any:
    plt = pyplot()
    fig, (memory_ax, cpu_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    kinds = list(result["by_type"])
    bottom = [0.0] * len(kinds)
    for role in ("driver_jvm", "driver_python", "python_workers"):
        values = [result["by_type"][k]["figures"]["by_role_mb_at_peak"][role] / 1024 for k in kinds]
        memory_ax.bar(kinds, values, bottom=bottom, label=role.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    memory_ax.set_title(f"{result['queues']} idle queues of one type: RSS (GB)")
    memory_ax.legend(fontsize=8)
    cpu_ax.bar(kinds, [result["by_type"][k]["per_queue"]["cpu_percent_of_a_core"] for k in kinds])
    cpu_ax.set_title("idle CPU per queue (% of a core)")
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=6, help="idle queues of each type, in one application")
    parser.add_argument("--idle-seconds", type=float, default=120.0)
    args = parser.parse_args()

    with bench_broker("qp-bench-idle-") as (folder, target):
        marks = folder / "marks"
        marks.mkdir()
        os.environ["QP_BENCH_MARKS"] = str(marks)
        (folder / "bench_handlers.py").write_text(HANDLERS)
        result: dict[str, Any] = {"queues": args.queues, "idle_seconds": args.idle_seconds, "by_type": {}}
        for kind in MIX:
            specs = [idle_queue(folder, target, kind)["path"] for _ in range(args.queues)]
            console.print(f"{args.queues} idle {kind} queues in one application")
            app = App(specs, target, folder)
            try:
                ready_s = wait_ready([app])
                figures = idle_figures([app], args.queues, args.idle_seconds)
            finally:
                app.stop()
            result["by_type"][kind] = {
                "ready_s": ready_s,
                "figures": figures,
                "per_queue": per_queue(figures, args.queues),
            }
            console.print(kind, result["by_type"][kind]["per_queue"])
        save("idle_cost", result, plot(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
