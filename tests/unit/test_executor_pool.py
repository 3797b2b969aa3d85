"""The application's executor pool: Spark is asked for the sum of its queues' demands, and an
executor goes only once every share queue has run a batch that drained it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from helpers import EXAMPLES

from queueplane.provision import steps
from queueplane.run.driver.scaling import controller as controller_module
from queueplane.run.driver.scaling import pool as pool_module
from queueplane.run.driver.scaling.controller import ExecutorController
from queueplane.run.driver.scaling.policy import Observation
from queueplane.run.driver.scaling.pool import DRAIN_REASON, ExecutorPool


class _Seq(list):
    def mkString(self, sep: str) -> str:
        return sep.join(self)


class _Spark:
    """What the pool uses of a SparkSession on a cluster: the executor ids, requests and kills."""

    def __init__(self, executors: list[str]):
        self.executors = executors
        self.calls: list[tuple[str, object]] = []
        jvm = SimpleNamespace(PythonUtils=SimpleNamespace(toScalaMap=lambda m: m, toSeq=lambda ids: list(ids)))
        jsc = SimpleNamespace(
            getExecutorIds=lambda: _Seq(self.executors),
            requestTotalExecutors=lambda total, _local, _hosts: self.calls.append(("total", total)),
            killExecutors=self._kill,
        )
        self.sparkContext = SimpleNamespace(master="k8s://https://api", _jsc=SimpleNamespace(sc=lambda: jsc), _jvm=jvm)

    def _kill(self, ids: list[str]) -> None:
        self.calls.append(("kill", tuple(ids)))
        self.executors = [e for e in self.executors if e not in ids]


class _Drain:
    def __init__(self, settle_s: float = 0.0, wait_s: float = 0.0) -> None:
        self.settle_s = settle_s
        self.wait_s = wait_s
        self.in_group: int | None = 0  # the group's members, as the broker would describe them
        self.requested: list[str] = []
        self.released: list[str] = []

    def members(self) -> int | None:
        return self.in_group

    def request(self, reason: str) -> None:
        self.requested.append(reason)

    def release(self, reason: str) -> None:
        self.released.append(reason)


def _pool(executors: list[str]) -> tuple[ExecutorPool, _Spark, _Drain]:
    spark, drain = _Spark(executors), _Drain()
    pool = ExecutorPool(spark)
    pool.join("orders", 1, None)  # a consumer queue: does not drain
    pool.join("mail", 2, drain)  # a share queue
    for name in ("orders", "mail"):
        pool.batch_ran(name)  # the first batches: the pool is as large as asked, nothing trimmed
    return pool, spark, drain


def test_spark_is_asked_for_the_sum_of_the_demands() -> None:
    pool, spark, _drain = _pool(["1", "2", "3"])
    assert pool.requested == 3
    pool.set_demand("orders", 4, ["1", "2", "3"])
    assert spark.calls == [("total", 6)]
    assert pool.share("orders", 6) == 4 and pool.share("mail", 6) == 2


def test_a_scale_down_waits_for_every_share_queue_to_drain() -> None:
    pool, spark, drain = _pool(["1", "2", "3"])
    pool.set_demand("orders", 2, ["1", "2", "3"])
    assert spark.calls == [("total", 4)] and not drain.requested
    spark.executors.append("4")
    pool.set_demand("orders", 1, ["1", "2", "3", "4"])  # the consumer queue wants one executor less
    assert drain.requested == [DRAIN_REASON] and ("kill", ("4",)) not in spark.calls
    pool.batch_ran("orders")  # the asking queue's next batch
    pool.batch_ran("mail")  # the share queue's batch may have begun before the request: not drained
    assert ("kill", ("4",)) not in spark.calls
    pool.batch_ran("mail")  # began after it: drained
    assert spark.calls[-2:] == [("kill", ("4",)), ("total", 3)]
    assert drain.released == [DRAIN_REASON]


def test_a_scale_down_waits_until_processes_without_a_draining_task_have_let_go(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(pool_module.time, "monotonic", lambda: now[0])
    spark, drain = _Spark(["1", "2"]), _Drain(settle_s=7.0)
    pool = ExecutorPool(spark)
    pool.join("mail", 2, drain)
    pool.batch_ran("mail")
    pool.set_demand("mail", 1, ["1", "2"])
    pool.batch_ran("mail")  # drained, but a process that ran no task of it may still hold a consumer
    now[0] += 6.9
    pool.batch_ran("mail")
    assert ("kill", ("2",)) not in spark.calls and not drain.released, "the drain goes on until then"
    now[0] += 0.2
    pool.batch_ran("mail")
    assert spark.calls[-2:] == [("kill", ("2",)), ("total", 1)]
    assert drain.released == [DRAIN_REASON]


def test_without_a_share_queue_the_newest_executor_goes_at_once() -> None:
    spark = _Spark(["1", "2", "3"])
    pool = ExecutorPool(spark)
    pool.join("orders", 3, None)
    pool.batch_ran("orders")
    pool.set_demand("orders", 2, ["1", "2", "3"])
    assert spark.calls == [("kill", ("3",)), ("total", 2)]


def test_a_standalone_master_s_extra_executors_are_trimmed_to_the_sum_of_the_minimums() -> None:
    spark = _Spark(["1", "2", "3", "4", "5"])
    pool = ExecutorPool(spark)
    pool.join("orders", 1, None)
    pool.join("mail", 2, None)
    pool.batch_ran("orders")
    assert spark.calls == [("kill", ("4", "5")), ("total", 3)]


def test_a_scale_down_waits_for_the_groups_consumers_to_leave_and_not_past_its_bound(monkeypatch, caplog) -> None:
    now = [100.0]
    monkeypatch.setattr(pool_module.time, "monotonic", lambda: now[0])
    spark, drain = _Spark(["1", "2", "3"]), _Drain(settle_s=7.0, wait_s=30.0)
    pool = ExecutorPool(spark)
    pool.join("mail", 3, drain)
    pool.batch_ran("mail")
    drain.in_group = 1  # a process that ran no draining task is still closing its consumer
    pool.set_demand("mail", 2, ["1", "2", "3"])
    pool.batch_ran("mail")
    now[0] += 8.0  # past the settle time
    pool.batch_ran("mail")
    assert ("kill", ("3",)) not in spark.calls, "a consumer still in the group holds what it acquired"
    drain.in_group = 0
    pool.batch_ran("mail")
    assert spark.calls[-2:] == [("kill", ("3",)), ("total", 2)]

    drain.in_group = 1  # this time it never leaves
    pool.set_demand("mail", 1, ["1", "2"])
    pool.batch_ran("mail")
    now[0] += 29.0
    pool.batch_ran("mail")
    assert ("kill", ("2",)) not in spark.calls
    now[0] += 1.5
    pool.batch_ran("mail")
    assert spark.calls[-2:] == [("kill", ("2",)), ("total", 1)], "the drain ends by its bound"
    assert "consumers are still in their groups (mail: 1)" in caplog.text


def test_demand_that_rises_while_a_removal_drains_cancels_it() -> None:
    pool, spark, drain = _pool(["1", "2", "3"])
    pool.set_demand("mail", 1, ["1", "2", "3"])  # the share queue wants one executor less
    assert drain.requested == [DRAIN_REASON]
    pool.set_demand("mail", 2, ["1", "2", "3"])  # and, before its drain, one more again
    assert spark.calls == [("total", 3)] and drain.released == [DRAIN_REASON], "the drain is over"
    for _ in range(3):
        pool.batch_ran("mail")
        pool.batch_ran("orders")
    assert not [call for call in spark.calls if call[0] == "kill"], "the executor stays: it is wanted"
    assert spark.executors == ["1", "2", "3"]


def test_an_executor_once_removed_is_not_chosen_again_while_spark_still_lists_it() -> None:
    spark = _Spark(["1", "2", "3"])
    pool = ExecutorPool(spark)
    pool.join("orders", 3, None)
    pool.batch_ran("orders")
    pool.set_demand("orders", 2, ["1", "2", "3"])
    pool.set_demand("orders", 3, ["1", "2", "3"])  # Spark starts "4" for it and still lists "3"
    pool.set_demand("orders", 2, ["1", "2", "3", "4"])
    assert spark.calls == [("kill", ("3",)), ("total", 2), ("total", 3), ("kill", ("4",)), ("total", 2)]


def test_the_pool_says_it_is_draining_from_a_removal_until_the_kill_or_its_cancel() -> None:
    pool, spark, _drain = _pool(["1", "2", "3"])
    assert not pool.draining()
    pool.set_demand("orders", 0, ["1", "2", "3"])
    assert pool.draining(), "the removal waits for the share queue's drain"
    pool.set_demand("orders", 1, ["1", "2", "3"])
    assert not pool.draining(), "demand rose again: the removal is cancelled"
    pool.set_demand("orders", 0, ["1", "2", "3"])
    pool.batch_ran("orders")
    pool.batch_ran("mail")
    assert pool.draining(), "the share queue's batch may have begun before the request"
    pool.batch_ran("mail")
    assert ("kill", ("3",)) in spark.calls and not pool.draining()


def test_a_drain_pauses_the_window_of_the_queue_that_drains_not_of_one_that_goes_on(monkeypatch) -> None:
    payments = steps.validate([str(EXAMPLES / "payments" / "payment-events.yaml")], None)[0]  # consumer, 2
    coffee = steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)[0]  # share, 1
    seen: list[Observation] = []
    real = controller_module.decide

    def decide(policy: Any, observation: Observation, state: Any) -> Any:
        seen.append(observation)
        return real(policy, observation, state)

    monkeypatch.setattr(controller_module, "decide", decide)
    spark, now = _Spark(["1", "2", "3"]), [0.0]
    pool = ExecutorPool(spark)
    orders = ExecutorController(pool, payments, clock=lambda: now[0])
    mail = ExecutorController(pool, coffee, clock=lambda: now[0], drain=_Drain())
    for controller in (orders, mail):
        controller.on_batch(0, None)  # the first batches open the windows
    pool.set_demand(payments.name, 1, ["1", "2", "3"])  # a removal, which waits for the share queue's drain
    assert pool.draining()
    now[0] = 60.0
    orders.on_batch(10, {0: 0})
    mail.on_batch(10, {0: 0})
    (orders_seen, mail_seen) = seen
    assert mail_seen.paused and not orders_seen.paused


def _beside_a_queue_with_the_executor() -> tuple[ExecutorController, _Spark, list[float]]:
    """A consumer queue with no executor of its own (minExecutors 0), in a pool whose one
    executor is the share queue's; and the clock its controller reads."""
    spec = steps.validate([str(EXAMPLES / "payments" / "payment-events.yaml")], None)[0]
    spark, now = _Spark(["1"]), [0.0]
    pool = ExecutorPool(spark)
    pool.join("coffee-orders", 1, None)
    orders = ExecutorController(pool, dataclasses.replace(spec, min_executors=0), clock=lambda: now[0])
    return orders, spark, now


def test_a_queue_with_no_executor_whose_records_wait_unhandled_asks_for_one() -> None:
    """Its batches bring its decisions, and on a pool with fewer cores than busy queues Spark's
    FAIR pools tie and go by name: the last queue by name gets no task, so no batch and no
    decision. Once records have waited ``STARVED_S`` with no batch of its own, it asks for one."""
    orders, spark, now = _beside_a_queue_with_the_executor()
    assert orders.requested == 0 and orders.pool.requested == 1

    now[0] = controller_module.STARVED_S - 1
    orders.on_waiting(300)
    now[0] = controller_module.STARVED_S + 1
    orders.on_waiting(0)
    orders.on_waiting(None)
    assert spark.calls == [], "records that wait for less, or none known to wait, ask for nothing"

    orders.on_waiting(300)
    assert orders.requested == 1 and spark.calls == [("total", 2)]
    orders.on_waiting(300)
    assert spark.calls == [("total", 2)], "asked once"


def test_a_queue_whose_batches_end_asks_for_nothing_while_it_waits() -> None:
    orders, spark, now = _beside_a_queue_with_the_executor()
    now[0] = 30.0
    orders.on_batch(0, {0: 300})  # the first batch only opens the decisions' window
    now[0] = 30.0 + controller_module.STARVED_S - 1
    orders.on_waiting(300)
    assert orders.requested == 0 and spark.calls == []
