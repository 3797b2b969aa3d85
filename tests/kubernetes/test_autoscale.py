"""Autoscaling on Kubernetes: a load step x4 turns into executor pods, and back.

A share queue whose executor handles about 10 records/s runs at 4 records/s, then 16 for a
minute, then 4 again. The driver's controller asks Spark's Kubernetes backend for executors,
which appear as pods; once the backlog is gone it drains them and they are deleted. Sampled
every second: the executor pods (kubectl), the driver's `queueplane_executors` and backlog
metrics. The run is drawn beside the simulation of the same step through the same policy
(tests/results/autoscale-kubernetes.png).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, run_cli, tagged_examples, unique_tag
from kube_support import DRIVER, EXECUTOR, outcomes, pods, ready, restricted_namespace, show, sized_for_the_node

from queueplane.kafka import clients
from queueplane.ops.load import make_order
from queueplane.run.driver.scaling.policy import ScalingPolicy
from queueplane.run.driver.scaling.simulation import simulate
from queueplane.spec.durations import parse_seconds

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka, pytest.mark.heavy]

BASE, FACTOR = 4.0, 4  # records/s, and the step's multiple of it
# The tail outlasts a 60 s scale-down cooldown and a drain, twice over for a peak reached late on a
# loaded machine; it ends two decisions after the scale-down.
WARM_S, STEP_S, TAIL_S = 20, 60, 200
MAX_EXECUTORS, TARGET_LAG_S, INTERVAL_S = 4, 5, 10.0  # the policy's decision interval (its default)
PER_EXECUTOR = 10.0  # 2 handler slots, 0.2 s per order
PLOT = REPO / "tests" / "results" / "autoscale-kubernetes.png"


def _rate(t: float) -> float:
    return BASE * FACTOR if WARM_S <= t < WARM_S + STEP_S else BASE


def _produce(kafka, topic: str, stop: threading.Event) -> list[str]:
    """Slow orders at the step's rate, paced against the clock; returns their ids."""
    producer, rng, ids = clients.producer(kafka.settings), random.Random(7), []
    started, sent = time.monotonic(), 0.0
    while not stop.is_set() and (now := time.monotonic() - started) < WARM_S + STEP_S + TAIL_S:
        sent += _rate(now) * 0.1
        while len(ids) < int(sent):
            order_id, key, value = make_order(len(ids), 64, rng, slow=True, batch="as-")
            producer.produce(topic, key=key, value=value)
            ids.append(order_id)
        producer.poll(0)
        time.sleep(0.1)
    producer.flush(30)
    return ids


def _metric(text: str, name: str, **labels: str) -> float | None:
    """The sum of a metric's samples with these labels (the backlog has one per partition)."""
    found = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items())
    ]
    return sum(found) if found else None


def _sample(cluster, namespace: str, driver: str, started: float) -> dict:
    executors = [p for p in pods(cluster, namespace, EXECUTOR) if not p["metadata"].get("deletionTimestamp")]
    # Through the API server's proxy: this machine reaches pod addresses on the local cluster only.
    metrics = f"/api/v1/namespaces/{namespace}/pods/{driver}:9404/proxy/metrics"
    text = cluster.kubectl("get", "--raw", metrics, "--request-timeout=2s", check=False)
    return {
        "t": round(time.monotonic() - started, 1),
        "pods": len(executors),
        "pods_ready": sum(1 for p in executors if ready(p)),
        "running": _metric(text, "queueplane_executors", state="running"),
        "requested": _metric(text, "queueplane_executors", state="requested"),
        "backlog": _metric(text, "queueplane_backlog_records"),
    }


def _scaled_down(samples: list[dict], after_s: float) -> bool:
    """After the step and after the highest count asked for so far, the executors asked for,
    running and in pods agree, below it. A loaded machine may measure a slow executor rate and
    rise to a new peak late; the scale-down that counts is the one after it."""
    peak = max(s["requested"] or 0 for s in samples)
    if peak < 2:
        return False
    peak_at = next(i for i, s in enumerate(samples) if s["requested"] == peak)
    return any(
        s["t"] > after_s and s["requested"] == s["running"] == s["pods"] and (s["requested"] or 0) < peak
        for s in samples[peak_at:]
    )


def _plot(samples: list[dict], where: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policy = ScalingPolicy(min_executors=1, max_executors=MAX_EXECUTORS, target_lag_s=TARGET_LAG_S)
    duration = max(WARM_S + STEP_S, samples[-1]["t"]) if samples else WARM_S + STEP_S + TAIL_S
    sim = simulate(policy, _rate, duration_s=duration, rate_per_executor=PER_EXECUTOR)
    fig, axes = plt.subplots(2, 2, figsize=(12, 6), sharex=True)
    t = [s["t"] for s in samples]
    axes[0][0].plot(t, [s["backlog"] or 0 for s in samples], color="tab:red")
    axes[0][0].set_title(f"{where}: backlog (records)")
    axes[1][0].step(t, [s["requested"] or 0 for s in samples], where="post", label="requested (metric)")
    axes[1][0].step(t, [s["running"] or 0 for s in samples], where="post", label="running (metric)")
    axes[1][0].step(t, [s["pods"] for s in samples], where="post", label="executor pods (kubectl)", linestyle="--")
    axes[0][1].plot(sim.times, sim.lag, color="tab:red")
    axes[0][1].set_title("the simulation, same step and policy: backlog (records)")
    axes[1][1].step(sim.times, sim.requested, where="post", label="requested")
    axes[1][1].step(sim.times, sim.running, where="post", label="running")
    for ax in axes[0]:
        ax.axvspan(WARM_S, WARM_S + STEP_S, color="grey", alpha=0.15)
    for ax in axes[1]:
        ax.axvspan(WARM_S, WARM_S + STEP_S, color="grey", alpha=0.15)
        ax.set_xlabel("seconds (grey: load x4)")
        ax.set_ylabel("executors")
        ax.legend(loc="upper right")
    fig.suptitle(f"Autoscaling a share queue: {BASE:.0f} -> {BASE * FACTOR:.0f} records/s for {STEP_S} s")
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=100)
    return PLOT


@pytest.mark.timeout(900)
def test_a_load_step_becomes_executor_pods_and_they_are_drained_and_deleted_after(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    doc["spec"]["processing"]["concurrency"] = 2
    doc["spec"]["autoscaling"] = {"minExecutors": 1, "maxExecutors": MAX_EXECUTORS, "targetLagSeconds": TARGET_LAG_S}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    namespace = doc["spec"]["deployment"]["namespace"]
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    host = ["--bootstrap-servers", kafka.bootstrap]
    assert run_cli(["apply", str(path), "--yes", *host], cli_env).returncode == 0
    restricted_namespace(cluster, namespace)
    samples: list[dict] = []
    try:
        deploy = ["deploy", str(path), "--kubeconfig", str(cluster.kubeconfig), "--values", str(values)]
        deployed = run_cli([*deploy, "--timeout", "5m"], cli_env, timeout=420)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        (driver,) = pods(cluster, namespace, DRIVER)

        stop, produced = threading.Event(), []
        producer = threading.Thread(target=lambda: produced.extend(_produce(kafka, doc["spec"]["topic"]["name"], stop)))
        started = time.monotonic()
        producer.start()
        try:
            down_at = None  # the tail ends early once the step's executors are gone (and a drain logged)
            while time.monotonic() - started < WARM_S + STEP_S + TAIL_S:
                samples.append(_sample(cluster, namespace, driver["metadata"]["name"], started))
                if not _scaled_down(samples, after_s=WARM_S + STEP_S):
                    down_at = None  # not yet, or a new peak since
                elif down_at is None:
                    down_at = time.monotonic()
                if down_at is not None and time.monotonic() - down_at > 2 * INTERVAL_S:
                    break
                time.sleep(1.0)
        finally:
            stop.set()
            producer.join(60)
        (tmp_path / "samples.json").write_text(json.dumps(samples))
        print(f"plot: {_plot(samples, 'the local cluster' if cluster.local else 'the given cluster')}")

        # Up: every rise of the requested count is met by executor pods within two decisions;
        # down: every fall, by pods deleted once a draining batch (a few seconds) has run.
        peak = max(s["requested"] or 0 for s in samples)
        assert peak >= 2, f"the step should have asked for executors: {samples}"
        for i in range(1, len(samples)):
            before, now = samples[i - 1]["requested"] or 0, samples[i]["requested"] or 0
            if now > before:
                met = next((s["t"] for s in samples[i:] if s["pods"] >= now), None)
                assert met is not None and met - samples[i]["t"] <= 2 * INTERVAL_S, (now, samples[i:])
            if now < before:
                met = next((s["t"] for s in samples[i:] if s["pods"] <= now), None)
                assert met is not None and met - samples[i]["t"] <= 3 * INTERVAL_S, (now, samples[i:])
        # The metric agrees with kubectl: a moment with several executors running, and after the step.
        assert any((s["running"] or 0) >= 2 and s["running"] == s["pods_ready"] for s in samples), samples
        after_s = WARM_S + STEP_S
        assert _scaled_down(samples, after_s), f"never scaled down: {[s for s in samples if s['t'] > after_s]}"
        # Down: the driver drained before it removed executors, and their pods are gone.
        log = cluster.kubectl("-n", namespace, "logs", driver["metadata"]["name"])
        downs = [m.start() for m in re.finditer(r"executors (\d+) -> (\d+): ", log) if int(m[1]) > int(m[2])]
        draining = log.find("draining before removing executor(s)")
        drained = log.find("drained: removing the executor(s)", max(draining, 0))
        assert downs and 0 <= draining < drained, log[-3000:]
        # Nothing lost: every order produced has its output. An order a consumer held without an
        # acknowledgement (a removed executor's, or one fetched into a client's buffer while no one
        # polled: docs/runtimes.md) comes back when its lock runs out, so the wait covers two locks.
        deadline = time.monotonic() + 2 * parse_seconds(doc["spec"]["group"]["lockDuration"]) + 30
        while (missing := set(produced) - outcomes(kafka, doc, len(produced), 0)[0]) and time.monotonic() < deadline:
            time.sleep(2)
        assert not missing, f"{len(missing)} orders without output after two locks, e.g. {sorted(missing)[:5]}"
    except BaseException:
        show(cluster, namespace)
        raise
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
