"""A queue simulated second by second, driven by the autoscaling policy.

Used by the policy's tests and by bench/autoscale.py: a load curve arrives, executors
handle a fixed rate each once they have started, and the policy decides every interval
what it would decide in the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from queueplane.run.driver.scaling.policy import Observation, ScalerState, ScalingPolicy, decide


@dataclass
class SimResult:
    times: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    lag_seconds: list[float] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    requested: list[int] = field(default_factory=list)
    changes: list[tuple[float, int, int, str]] = field(default_factory=list)  # (time, from, to, reason)


def step_load(base: float, factor: float, start_s: float, duration_s: float) -> Callable[[float], float]:
    """``base`` records/s, ``factor`` times that from ``start_s`` for ``duration_s``."""
    return lambda t: base * factor if start_s <= t < start_s + duration_s else base


def simulate(
    policy: ScalingPolicy,
    load: Callable[[float], float],
    *,
    duration_s: float,
    rate_per_executor: float,
    startup_s: float = 15.0,
    partitions: int = 6,
) -> SimResult:
    """Run the queue for ``duration_s`` seconds in one-second steps."""
    result = SimResult()
    state = ScalerState()
    lag = 0.0
    requested = policy.min_executors
    starting: list[float] = []  # times at which requested executors come up
    running = policy.min_executors
    window_in = window_out = 0.0
    next_decision = policy.interval_s
    t = 0.0
    while t < duration_s:
        arriving = load(t)
        capacity = running * rate_per_executor
        handled = min(lag + arriving, capacity)
        lag = lag + arriving - handled
        window_in += arriving
        window_out += handled
        while starting and starting[0] <= t:
            starting.pop(0)
            running += 1
        t += 1.0
        if t >= next_decision:
            per_partition = {p: int(lag // partitions) for p in range(partitions)}
            per_partition[0] += int(lag) - sum(per_partition.values())
            obs = Observation(
                now_s=t,
                lag_by_partition=per_partition,
                input_rate=window_in / policy.interval_s,
                processing_rate=window_out / policy.interval_s,
                executors=running,
                requested=requested,
            )
            decision = decide(policy, obs, state)
            state = decision.state
            if decision.desired != requested:
                result.changes.append((t, requested, decision.desired, decision.reason))
                if decision.desired > requested:
                    starting += [t + startup_s] * (decision.desired - requested)
                else:
                    drop = requested - decision.desired
                    cancelled = min(drop, len(starting))
                    del starting[len(starting) - cancelled :]
                    running -= drop - cancelled
                requested = decision.desired
            window_in = window_out = 0.0
            next_decision += policy.interval_s
        result.times.append(t)
        result.load.append(arriving)
        result.lag.append(lag)
        result.lag_seconds.append(lag / (running * rate_per_executor) if running else float("inf"))
        result.running.append(running)
        result.requested.append(requested)
    return result
