"""Contract: the driver command the chart renders is the command that works.

The test takes the driver container's command, args and env from the rendered Deployment
and runs exactly that here: only the master is switched to local, and paths inside the
image (and the pod's mounts) are mapped to this checkout and to local folders holding what
the ConfigMap and the Secret would hold. It must consume and process a load from the broker,
then stop cleanly on SIGTERM, as a deleted pod is asked to.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import REPO
from spark_standalone import free_port
from worker_support import make_queue, order, produce, read_all

from queueplane.deploy.render import render
from queueplane.provision import steps
from queueplane.run.spark.interpreter import LAUNCHER, launcher

pytestmark = pytest.mark.kafka

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
FIELD_VALUES = {
    "metadata.name": "contract-driver-0",
    "metadata.namespace": "test",
    "metadata.uid": "0f5e3c2a-6b1d-4c8e-9a7f-2d4b6c8e0a1b",
}


def _kubelet_expand(text: str, env: dict[str, str]) -> str:
    """$(VAR) references in args, expanded from the container's env as the kubelet does."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def _mounts(pod: dict, container: dict, objects: list[dict], properties: str, root: Path) -> dict[str, str]:
    """Each mountPath → a local folder holding what Kubernetes would mount there."""
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mapped = {}
    for mount in container["volumeMounts"]:
        volume, folder = volumes[mount["name"]], root / mount["name"]
        folder.mkdir(parents=True)
        if "configMap" in volume:
            data = config_maps[volume["configMap"]["name"]]["data"]
            for item in volume["configMap"]["items"]:
                (folder / item["path"]).write_text(data[item["key"]])
        elif "secret" in volume:  # the cluster's Secret: a librdkafka properties file
            (folder / "client.properties").write_text(properties)
        else:  # a claim starts as empty as an emptyDir
            assert "emptyDir" in volume or "persistentVolumeClaim" in volume, f"unexpected volume {volume}"
        mapped[mount["mountPath"]] = str(folder)
    return mapped


def test_the_rendered_driver_command_consumes_and_processes_a_load(kafka, tmp_path):
    queue_dir = make_queue(tmp_path, kafka, partitions=3, concurrency=4)
    total = 300
    produce(kafka, queue_dir.topic, [order(i, sleep_ms=5) for i in range(total)])
    (queue,) = steps.validate([str(queue_dir.spec_path)], kafka)
    metrics_port = free_port()
    overrides = {
        "kafka": {"configSecret": {"name": "test-kafka"}, "bootstrapServers": ""},
        "metrics": {"port": metrics_port},
        "spark": {"driverPort": free_port(), "blockManagerPort": free_port(), "eventLog": {"enabled": True, "dir": ""}},
        "checkpoint": {"persistentVolumeClaim": {"enabled": True}},
    }
    rendered = render(queue, output_dir=tmp_path / "render", overrides=overrides)
    deployment = next(o for o in rendered.objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]

    mounts = _mounts(pod, container, rendered.objects, f"bootstrap.servers={kafka.bootstrap}\n", tmp_path / "pod")
    image_paths = {
        "/opt/queueplane/handlers": str(queue_dir.folder),  # the team's handler code in the image
        "/opt/queueplane/": f"{REPO}/",
        **mounts,
    }

    # One pass, longest path first, whole path segments only: /tmp must not match inside a mapped folder.
    pattern = re.compile(
        "(?<![\\w./-])("
        + "|".join(re.escape(p) for p in sorted(image_paths, key=len, reverse=True))
        + ")(?:(?<=/)|(?=/|$|[^\\w.-]))"
    )

    def local(text: str) -> str:
        return pattern.sub(lambda m: image_paths[m.group(1)], text)

    env = {}
    for item in container["env"]:
        if "valueFrom" in item:
            env[item["name"]] = FIELD_VALUES[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            value = _kubelet_expand(item["value"], env)
            env[item["name"]] = {"python3": sys.executable, LAUNCHER: launcher()}.get(value) or local(value)
    master = "'k8s://https://kubernetes.default.svc'"
    assert master in env["PYSPARK_SUBMIT_ARGS"] and env["PYSPARK_SUBMIT_ARGS"].endswith(" pyspark-shell")
    env["PYSPARK_SUBMIT_ARGS"] = env["PYSPARK_SUBMIT_ARGS"].replace(master, "'local[2]'")
    # Spark takes a secret file on Kubernetes only; in local mode it makes the secret itself.
    secret_file = re.compile(r"'--conf' 'spark\.authenticate\.secret\.file=[^']*' ")
    assert secret_file.search(env["PYSPARK_SUBMIT_ARGS"]) and "'spark.authenticate=true'" in env["PYSPARK_SUBMIT_ARGS"]
    env["PYSPARK_SUBMIT_ARGS"] = secret_file.sub("", env["PYSPARK_SUBMIT_ARGS"])
    # tini is the image's init, which hands SIGTERM to the worker; here the test is the parent that sends it.
    assert container["command"] == ["/usr/bin/tini", "--", "python3"]
    command = [sys.executable]
    args = [local(_kubelet_expand(a, env)) for a in container["args"]]
    assert Path(env["QUEUEPLANE_KAFKA_CONFIG"]).read_text().startswith("bootstrap.servers=")

    process_env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUEPLANE_", "PYSPARK_", "SPARK_"))}
    process_env.update(env)
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(
        [*command, *args], env=process_env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    probes = {kind: container[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe")}
    assert {probe["port"] for probe in probes.values()} == {"metrics"}
    base = f"http://127.0.0.1:{metrics_port}"
    try:
        # Done when the driver counts every record accepted, on the port the probes ask.
        accepted_line = f'queueplane_records_total{{outcome="accepted",queue="{queue.name}"}} {float(total)}'
        deadline, scraped = time.monotonic() + 300, ""
        while time.monotonic() < deadline and driver.poll() is None and accepted_line not in scraped:
            time.sleep(1)
            try:
                scraped = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
            except OSError:
                continue
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-4000:]
        assert accepted_line in scraped, scraped[-2000:]
        for kind, probe in probes.items():
            with urllib.request.urlopen(f"{base}{probe['path']}", timeout=5) as answer:
                assert answer.status == 200, (kind, answer.read())
        handled = {e["id"] for e in queue_dir.events() if e.get("result") == "ok"}
        assert len(handled) == total
        # Event logs on the checkpoint volume, rolled (a folder of numbered files) and compressed
        # (Spark 4 writes zstd by default), for a history server.
        logs = sorted(Path(mounts["/var/queueplane/checkpoints"]).glob("spark-events/eventlog_v2_*/events_*"))
        assert logs and logs[0].read_bytes()[:4] == ZSTD_MAGIC, logs

        # What the kubelet does to a deleted pod: SIGTERM to the worker, which stops cleanly.
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(90) == 0, (tmp_path / "driver.log").read_text()[-4000:]
        assert "SIGTERM: finishing the batch in hand" in (tmp_path / "driver.log").read_text()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGTERM)
            try:
                driver.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(driver.pid, signal.SIGKILL)
    outputs = {m.value() for m in read_all(kafka, queue_dir.output, expect_at_least=total)}
    assert len(outputs) == total
