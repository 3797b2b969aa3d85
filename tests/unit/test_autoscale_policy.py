"""The autoscaling policy: a simulated step load, the bounds, and the consumer-group cap."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml
from helpers import EXAMPLES

from queueplane.provision import steps
from queueplane.run.driver.group_types import runtime_class
from queueplane.run.driver.scaling.policy import Observation, ScalerState, ScalingPolicy, decide, policy_for
from queueplane.run.driver.scaling.simulation import simulate, step_load

RATE = 100.0  # records/s one executor handles
BASE = 60.0  # fits in one executor
STEP_START, STEP_S = 60.0, 300.0  # x4 for five minutes
MAX_CHANGES = 7  # two steps up, one trim, one step down per executor back to min


def _run(policy: ScalingPolicy):
    return simulate(policy, step_load(BASE, 4, STEP_START, STEP_S), duration_s=1200, rate_per_executor=RATE)


def test_step_load_scales_out_fast_drains_lag_returns_to_min_without_flapping():
    policy = ScalingPolicy(min_executors=1, max_executors=10, target_lag_s=30.0)
    result = _run(policy)
    first_up = result.changes[0]
    assert first_up[2] > first_up[1], "the first change is a scale-up"
    assert first_up[0] <= STEP_START + 2 * policy.interval_s, "scaled out within two decision intervals"

    step_end = STEP_START + STEP_S
    during = [i for i, t in enumerate(result.times) if STEP_START + 90 <= t < step_end]
    assert all(result.lag_seconds[i] < policy.target_lag_s for i in during), "lag fell under the target"
    assert max(result.requested) * RATE >= 4 * BASE, "enough executors for the step"

    back_at_min = next(t for t, req in zip(result.times, result.requested, strict=True) if t > step_end and req == 1)
    assert back_at_min - step_end <= policy.down_cooldown_s * (max(result.requested) - 1) + 2 * policy.interval_s
    assert result.requested[-1] == policy.min_executors
    assert all(req == 1 for t, req in zip(result.times, result.requested, strict=True) if t > back_at_min)
    assert len(result.changes) <= MAX_CHANGES, result.changes


def test_bounds_hold_however_large_the_lag():
    policy = ScalingPolicy(min_executors=2, max_executors=5, target_lag_s=10.0)
    result = simulate(policy, step_load(50, 40, 30, 600), duration_s=700, rate_per_executor=RATE)
    assert max(result.requested) == 5 and min(result.requested) == 2
    steps_up = [to - frm for _, frm, to, _ in result.changes if to > frm]
    assert max(steps_up) <= policy.max_step_up


def _obs(lag: int, executors: int, now: float = 100.0) -> Observation:
    return Observation(now, {0: lag}, input_rate=1000.0, processing_rate=100.0 * executors, executors=executors)


def test_consumer_groups_are_capped_by_partitions_and_key_slots_share_groups_are_not():
    payments = steps.validate([str(EXAMPLES / "payments" / "payment-events.yaml")], None)[0]  # consumer, ordering=key
    policy = policy_for(payments, runtime_class(payments).executor_cap(payments))
    assert policy.cap == payments.topic.partitions * payments.concurrency // 2  # 2 cores per executor
    coffee = steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)[0]  # share group
    assert policy_for(coffee, runtime_class(coffee).executor_cap(coffee)).cap is None


def test_consumer_cap_without_key_ordering_is_the_partitions(tmp_path: Path):
    doc = yaml.safe_load((EXAMPLES / "payments" / "payment-events.yaml").read_text())
    doc["spec"]["group"]["ordering"] = "partition"
    doc["spec"]["processing"]["exactlyOnce"] = False
    doc["spec"]["autoscaling"]["maxExecutors"] = 50
    doc["spec"]["deployment"]["executor"] = {"cores": 1, "memory": "1g"}
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(doc))
    queue = steps.validate([str(path)], None)[0]
    policy = policy_for(queue, runtime_class(queue).executor_cap(queue), up_cooldown_s=0)
    state = ScalerState(rate_per_executor=100.0, last_executors=12)
    decision = decide(policy, _obs(lag=1_000_000, executors=12), state)
    assert decision.desired == queue.topic.partitions == 12, "no executor beyond one per partition"
    share = ScalingPolicy(1, 50, 30.0, cap=None, up_cooldown_s=0)
    assert decide(share, _obs(lag=1_000_000, executors=12), state).desired == 16, "share: one bounded step up"


def test_no_measured_rate_yet_adds_one_executor_for_a_backlog_and_holds_when_idle():
    policy = ScalingPolicy(1, 10, 30.0)
    assert decide(policy, _obs(lag=500, executors=1), ScalerState()).desired == 2
    idle = Observation(100.0, {0: 0, 1: 0}, 0.0, 0.0, 1)
    assert decide(policy, idle, ScalerState()).desired == 1


def test_a_rate_learned_low_rises_to_what_the_executors_did_so_a_past_peak_is_trimmed():
    """Executors still warming up when the rate was learned made it low: at the base load the
    learned rate asks for every executor of the peak, until what they actually handle raises it."""
    policy = ScalingPolicy(min_executors=1, max_executors=4, target_lag_s=5.0)
    low = ScalerState(last_change_s=0.0, rate_per_executor=1.2, last_executors=4)
    idle = Observation(100.0, {0: 0, 1: 1}, input_rate=4.0, processing_rate=4.0, executors=4, requested=4)
    assert decide(policy, idle, low).desired == 4, "at 1.2 records/s an executor, 4 records/s need all four"

    # A drain after the peak: 4 executors handled 20 records/s with no second of work waiting.
    busy = Observation(100.0, {0: 3, 1: 2}, input_rate=4.0, processing_rate=20.0, executors=4, requested=4)
    trimmed = decide(policy, busy, low)
    assert trimmed.state.rate_per_executor == 5.0
    assert trimmed.desired == 3 and "need only" in trimmed.reason, trimmed
    # Demand alone never sets a first rate: with none learned, an idle queue holds.
    assert decide(policy, idle, ScalerState(last_executors=4)).state.rate_per_executor is None


def test_executors_added_faster_than_their_rate_was_measured_are_trimmed_one_at_a_time():
    """A step that scaled up every cooldown never held a count still long enough to measure a rate:
    once the backlog is gone, executors go one per down cooldown, and none while work waits."""
    policy = ScalingPolicy(min_executors=1, max_executors=4, target_lag_s=5.0)
    peak = ScalerState(last_change_s=0.0, last_executors=4)
    calm = Observation(30.0, {0: 1, 1: 0}, input_rate=4.0, processing_rate=4.0, executors=4, requested=4)
    assert decide(policy, calm, peak).desired == 4, "within the down cooldown"
    later = decide(policy, replace(calm, now_s=61.0), peak)
    assert later.desired == 3 and "one executor fewer" in later.reason, later
    busy = Observation(61.0, {0: 40, 1: 40}, input_rate=16.0, processing_rate=12.0, executors=4, requested=4)
    assert decide(policy, busy, replace(peak, last_executors=3)).desired == 4, "saturated: no step down"
    at_min = Observation(61.0, {0: 0}, input_rate=0.0, processing_rate=0.0, executors=1, requested=1)
    assert decide(policy, at_min, ScalerState(last_change_s=0.0)).desired == 1


def test_a_trickle_of_slow_records_keeps_the_rate_learned_under_load():
    """After a peak, 3 records/s of 300 ms each: the lag is about the records being handled. Taken
    for a bottleneck, it would lower the learned rate to the trickle's until 3 records/s asked
    for two executors."""
    policy = ScalingPolicy(min_executors=1, max_executors=3, target_lag_s=5.0, down_cooldown_s=0)
    state = ScalerState(last_change_s=0.0, rate_per_executor=20.0, last_executors=1)
    trickle = Observation(100.0, {0: 2, 1: 1}, input_rate=3.0, processing_rate=3.0, executors=1, in_flight=0.9)
    for step in range(6):
        decision = decide(policy, replace(trickle, now_s=100.0 + 4 * step), state)
        state = decision.state
        assert decision.desired == 1, decision
    assert state.rate_per_executor == 20.0
    # The same backlog beyond what the handlers hold is a second of work waiting: a bottleneck.
    waiting = replace(trickle, lag_by_partition={0: 5, 1: 1})
    assert decide(policy, waiting, state).state.rate_per_executor == 11.5


def test_a_burst_in_one_reading_teaches_no_rate_where_records_waited_at_no_other():
    """Three executors at the end of a peak, a trickle produced three records at a time: the
    reading at the decision fell on a burst. Taken as capacity, under a record a second an
    executor, 3 records/s kept all three executors until the worker stopped."""
    policy = ScalingPolicy(min_executors=1, max_executors=3, target_lag_s=5.0, down_cooldown_s=0)
    state = ScalerState(last_change_s=0.0, last_executors=3)
    burst = Observation(100.0, {0: 3}, input_rate=2.0, processing_rate=2.0, executors=3, in_flight=0.6, least_lag=0)
    learned = decide(policy, burst, state)
    assert learned.state.rate_per_executor is None, learned
    assert learned.desired == 2 and "one executor fewer" in learned.reason, learned
    # Records that waited in every reading of the interval: the executors never caught up.
    backlog = replace(burst, lag_by_partition={0: 30}, least_lag=20, processing_rate=15.0)
    assert decide(policy, backlog, state).state.rate_per_executor == 5.0


def test_a_drain_pause_teaches_no_rate_and_its_backlog_cancels_no_removal():
    """A removal waits for its drain, which stops consumption: 3 executors handled 1 record/s
    while the trickle's records built up. Read as capacity, a few such windows ask for an
    executor back, which cancels the removal."""
    policy = ScalingPolicy(min_executors=1, max_executors=3, target_lag_s=5.0)
    pause = Observation(
        100.0, {0: 12, 1: 8}, input_rate=4.0, processing_rate=1.0, executors=3, requested=1, paused=True
    )

    def desired(observation: Observation) -> list[int]:
        state, wanted = ScalerState(last_change_s=0.0, rate_per_executor=20.0, last_executors=3), []
        for step in range(3):
            decision = decide(policy, replace(observation, now_s=100.0 + 4 * step), state)
            state = replace(decision.state, last_change_s=0.0)
            wanted.append(decision.desired)
        assert (state.rate_per_executor == 20.0) == observation.paused
        return wanted

    assert desired(pause) == [1, 1, 1]
    assert 2 in desired(replace(pause, paused=False)), "the pause read as capacity"


def test_the_backlog_a_drain_built_is_no_demand_but_a_surge_during_it_is():
    """A drain of 9 s on a trickle of 3 records/s: 27 records wait, which at 9 records/s an
    executor would ask for a second one within a 5 s target. The surge's input rate still does."""
    policy = ScalingPolicy(min_executors=1, max_executors=3, target_lag_s=5.0)
    state = ScalerState(last_change_s=0.0, rate_per_executor=9.0, last_executors=3)
    pause = Observation(100.0, {0: 27}, input_rate=3.0, processing_rate=0.0, executors=3, requested=1, paused=True)
    assert decide(policy, pause, state).desired == 1
    assert decide(policy, replace(pause, paused=False), state).desired == 2, "the backlog read as demand"
    surge = replace(pause, input_rate=30.0)
    assert decide(policy, surge, state).desired == 3, "demand rose: the removal is cancelled"
