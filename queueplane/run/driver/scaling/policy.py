"""How many executors a worker should run: a pure policy over lag and rates.

Spark's dynamic allocation scales on pending tasks, which a streaming queue worker always
has in the same number; what matters is the Kafka backlog. The policy sizes the executors
so that the backlog drains within ``targetLagSeconds`` while keeping up with the input:

    needed rate = input rate + backlog / targetLagSeconds
    desired     = ceil(needed rate / (rate one executor sustains * headroom))

(without the backlog term while a scale-down's drain pauses consumption: that backlog is the
pause's own), then clamps to [minExecutors, maxExecutors] and, for consumer groups, to the
executors that can get work at all (partitions * key slots over the executor's cores; share
and kmq groups hand records to any task, so no such cap). Against flapping: scale-up waits a short
cooldown after any change and moves at most ``max_step_up`` at once; scale-down waits a
longer cooldown, moves one executor at a time, and only when the load fits in fewer
executors with a margin and the backlog is well under the target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypedDict, Unpack

from queueplane.spec.model import QueueSpec


@dataclass(frozen=True)
class ScalingPolicy:
    min_executors: int
    max_executors: int
    target_lag_s: float
    cap: int | None = None  # executors that can get work (consumer groups); None: no cap
    interval_s: float = 10.0  # how often the controller decides
    up_cooldown_s: float = 10.0  # after any change, before scaling up again
    down_cooldown_s: float = 60.0  # after any change, before scaling down
    max_step_up: int = 4
    max_step_down: int = 1
    headroom: float = 0.8  # plan executors to run at most this busy
    down_margin: float = 0.9  # scale down only if the load fits in fewer executors with this much to spare

    @property
    def ceiling(self) -> int:
        cap = self.max_executors if self.cap is None else self.cap
        return max(self.min_executors, min(self.max_executors, cap))


@dataclass(frozen=True)
class Observation:
    """What the driver saw over the last decision interval."""

    now_s: float
    lag_by_partition: Mapping[int, int | None]
    input_rate: float  # records/s arriving
    processing_rate: float  # records/s handled by all executors
    executors: int  # executors running now (the processing rate is theirs)
    requested: int | None = None  # executors asked for, some perhaps still starting; default: running
    # Records in handler calls on average over the interval (their calls' busy seconds over its
    # length, Little's law): the lag holds them, yet they wait for nothing.
    in_flight: float = 0.0
    # Consumption stopped for a drain (a removal waiting for it) during the interval: the rate it
    # shows is a pause, not what the executors can do, and the backlog it built is no demand.
    paused: bool = False
    # The smallest backlog a micro-batch of the interval saw (None: not known). A burst of a few
    # records can stand in one reading; records that waited in every reading of the interval
    # show executors that never caught up, which is what a capacity is measured on.
    least_lag: int | None = None


@dataclass(frozen=True)
class ScalerState:
    last_change_s: float | None = None
    rate_per_executor: float | None = None  # sustained records/s of one executor, learned under backlog
    last_executors: int | None = None  # running executors at the previous decision
    changes: int = 0


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    state: ScalerState = field(default_factory=ScalerState)
    lag: int = 0
    lag_seconds: float | None = None


class Tuning(TypedDict, total=False):
    """What a worker's flags may set of a policy beyond its spec (``ScalingPolicy``'s fields)."""

    interval_s: float
    up_cooldown_s: float
    down_cooldown_s: float
    headroom: float
    down_margin: float


def policy_for(queue: QueueSpec, cap: int | None = None, **overrides: Unpack[Tuning]) -> ScalingPolicy:
    """The policy of a queue's spec: autoscaling bounds and target, and the runtime's executor cap;
    ``overrides`` tune the rest."""
    return replace(
        ScalingPolicy(queue.min_executors, queue.max_executors, float(queue.target_lag_seconds), cap), **overrides
    )


def _saturated(obs: Observation, lag: int) -> bool:
    """The executors are the bottleneck: at least a second of their work waits, beyond the records
    their handlers hold.

    A backlog of the records in flight is no sign of it: on a trickle of slow records the lag is
    about the records being handled, a second's worth or more at a low rate; read as a
    bottleneck, that demand would be taken for the capacity, which then falls with the load
    until a few records a second ask for more executors. A backlog being worked off is a sign:
    the executors run flat out, which is their capacity. So is a burst only if it never cleared:
    records must wait in every reading of the interval (``least_lag``), not only in the last.
    """
    least = lag if obs.least_lag is None else min(lag, obs.least_lag)
    waiting = least - obs.in_flight
    return waiting > 0 and waiting >= obs.processing_rate * 1.0


def _learn_rate(policy: ScalingPolicy, obs: Observation, state: ScalerState, lag: int) -> float | None:
    """One executor's sustained rate, measured while the executors are the bottleneck (else the rate
    shows demand, not capacity), their count held still over the interval (else it blends two
    counts) and nothing paused them (a drain: the backlog it builds would read as a bottleneck,
    and the pause as the capacity); otherwise only raised to what they were seen doing."""
    steady = state.last_executors == obs.executors
    if obs.paused or not steady or obs.executors <= 0 or obs.processing_rate <= 0:
        return state.rate_per_executor
    sample = obs.processing_rate / obs.executors
    if not _saturated(obs, lag):
        # Not the bottleneck, so the rate shows demand; still, what the executors just did they can
        # do. A rate learned low (executors warming up when it was measured) rises to it, else the
        # executors of a past peak would never look idle enough to remove.
        return None if state.rate_per_executor is None else max(state.rate_per_executor, sample)
    if state.rate_per_executor is None:
        return sample
    return 0.5 * state.rate_per_executor + 0.5 * sample


def decide(policy: ScalingPolicy, obs: Observation, state: ScalerState) -> Decision:
    """The executor count to run next, and why."""
    lag = sum(v for v in obs.lag_by_partition.values() if v is not None)
    rate = _learn_rate(policy, obs, state, lag)
    state = replace(state, rate_per_executor=rate, last_executors=obs.executors)
    current = obs.executors if obs.requested is None else obs.requested
    capacity = (rate or 0.0) * max(obs.executors, 1)
    lag_seconds = lag / capacity if capacity > 0 else (0.0 if lag == 0 else None)
    since_change = math.inf if state.last_change_s is None else obs.now_s - state.last_change_s

    def hold(reason: str) -> Decision:
        return Decision(current, reason, state, lag, lag_seconds)

    def change(to: int, reason: str) -> Decision:
        changed = replace(state, last_change_s=obs.now_s, changes=state.changes + 1)
        return Decision(to, reason, changed, lag, lag_seconds)

    if current < policy.min_executors or current > policy.ceiling:
        return change(min(max(current, policy.min_executors), policy.ceiling), "outside the bounds")
    if rate is None:
        # Without a measured rate the policy steps one executor at a time: up while the executors
        # are the bottleneck, down after a cooldown without that (a peak's executors, added faster
        # than their rate could be measured, would otherwise stay). Running at the bottleneck is
        # what measures the rate.
        if _saturated(obs, lag):
            if current < policy.ceiling and since_change >= policy.up_cooldown_s:
                return change(current + 1, "backlog and no measured rate yet: one more executor")
        elif current > policy.min_executors and since_change >= policy.down_cooldown_s:
            return change(current - 1, "no backlog and no measured rate yet: one executor fewer")
        return hold("no measured rate yet")
    # In an interval a drain paused, the backlog is the pause's own (nothing consumed while it
    # built, and a drain can take a lock's time): read as demand, a trickle's few records would
    # cancel every removal. Only the input rate counts then, which a surge still raises.
    backlog_rate = 0.0 if obs.paused else lag / policy.target_lag_s
    needed_rate = obs.input_rate + backlog_rate
    wanted = math.ceil(needed_rate / (rate * policy.headroom)) if needed_rate > 0 else 0
    wanted = min(max(wanted, policy.min_executors), policy.ceiling)
    if wanted > current:
        if obs.requested is not None and obs.requested > obs.executors:
            return hold(f"waiting for {obs.requested - obs.executors} executor(s) to start")
        if since_change < policy.up_cooldown_s:
            return hold("scale-up cooldown")
        return change(min(wanted, current + policy.max_step_up), f"need {needed_rate:.0f} records/s")
    if wanted < current:
        fits_fewer = needed_rate <= rate * policy.headroom * policy.down_margin * (current - 1)
        calm = lag_seconds is not None and lag_seconds <= policy.target_lag_s / 2
        if not (fits_fewer and calm):
            return hold("load does not fit in fewer executors with margin")
        if since_change < policy.down_cooldown_s:
            return hold("scale-down cooldown")
        return change(max(wanted, current - policy.max_step_down), f"need only {needed_rate:.0f} records/s")
    return hold("steady")
