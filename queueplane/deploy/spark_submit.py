"""The spark-submit deploy target: a queue's worker as a driver on a Spark standalone cluster.

For teams that run Spark without Kubernetes. The worker is a PySpark application, and Spark
refuses Python in standalone cluster mode ("Cluster deploy mode is currently not supported
for python applications on standalone clusters"); its own Python launcher, ``PythonRunner``
in spark-core's jar, is a JVM main class, so the submission names that class and jar and
hands it the worker script. The master then supervises the driver like any other: it runs on
a worker node, is listed and killed by id, and survives the submitter.

What the nodes must hold, as Spark's docs require of any cluster-mode application: the
worker script, the spec and the handler's module at the paths the submission names (a shared
checkout or a synced folder), and a Python with queueplane installed (``spark.pyspark.python``).

Kafka: Spark's standalone client ships the submitting process's environment to the driver,
so the submission runs with a minimal environment and names the cluster with
``QUEUEPLANE_BOOTSTRAP_SERVERS``, or with ``QUEUEPLANE_KAFKA_CONFIG``, a librdkafka properties
file on the nodes. Credentials never go on a command line or into that environment.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queueplane.errors import DeployError, UsageError
from queueplane.kafka.target import ENV_BOOTSTRAP, ENV_KAFKA_CONFIG, KafkaTarget
from queueplane.paths import shipped_file
from queueplane.run.spark_python import launcher
from queueplane.spec.model import QueueSpec

PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"
# The driver states of a standalone master (org.apache.spark.deploy.master.DriverState) after
# which it runs no more; SUBMITTED, RUNNING and RELAUNCHING are the live ones.
ENDED_STATES = frozenset({"FINISHED", "KILLED", "FAILED", "ERROR", "UNKNOWN"})
DEFAULT_METRICS_PORT = 9404
# Librdkafka settings that only name the cluster; any other (SASL, SSL) is a credential or a
# file on the Airflow side, which a driver on another machine cannot use.
_PLAIN_SETTINGS = frozenset({"bootstrap.servers", "client.id"})
# What spark-submit itself needs from the submitting process; nothing else is shipped.
_SUBMIT_ENV = ("PATH", "JAVA_HOME", "SPARK_HOME", "HOME", "LANG", "LC_ALL", "TMPDIR", "SPARK_LOCAL_IP")


@dataclass(frozen=True)
class SubmitSettings:
    """The Spark cluster's side of a submission: the same for every queue of a platform.

    Read from the Airflow Variable ``queueplane_spark_submit`` (JSON), with a run's values on top.
    """

    conf: dict[str, str] = field(default_factory=dict)  # Spark conf, e.g. spark.pyspark.python
    kafka_config: str | None = None  # a librdkafka properties file on the Spark nodes
    spark_home: str | None = None  # SPARK_HOME on the nodes; default: this machine's pyspark
    worker_script: str | None = None  # queue_worker.py on the nodes; default: the one queueplane ships
    checkpoint_dir: str | None = None  # a shared folder or object store; a folder per queue goes under it
    metrics_port: int = DEFAULT_METRICS_PORT
    start_timeout_s: float = 300.0

    @classmethod
    def layered(cls, *layers: tuple[Mapping[str, Any] | None, str]) -> SubmitSettings:
        """Each layer's keys over the layer's before it (``conf`` key by key); each layer is a
        mapping and where it comes from, which an unknown key or a malformed ``conf`` names."""
        known = set(cls.__dataclass_fields__)
        merged: dict[str, Any] = {}
        conf: dict[str, str] = {}
        for data, where in layers:
            data = dict(data or {})
            unknown = sorted(set(data) - known)
            if unknown:
                raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
            layer_conf = data.pop("conf", {})
            if not isinstance(layer_conf, dict):
                raise UsageError(f"{where}: conf must be an object of Spark settings, got {type(layer_conf).__name__}")
            conf.update({str(k): str(v) for k, v in layer_conf.items()})
            merged.update(data)
        return cls(conf=conf, **merged)


@dataclass(frozen=True)
class Submission:
    """One spark-submit of a queue's worker, as SparkSubmitHook takes it."""

    name: str
    application: str  # spark-core's jar, which holds PythonRunner
    application_args: list[str]
    conf: dict[str, str]
    executor_cores: int
    executor_memory: str
    driver_memory: str
    total_executor_cores: int
    env: dict[str, str]

    def command(self, master: str) -> list[str]:
        """The spark-submit command line this submission amounts to (for the task log and dry runs)."""
        confs = [arg for key, value in sorted(self.conf.items()) for arg in ("--conf", f"{key}={value}")]
        return [
            "spark-submit",
            *("--master", master, "--deploy-mode", "cluster", "--name", self.name, "--class", PYTHON_RUNNER),
            *("--executor-cores", str(self.executor_cores), "--executor-memory", self.executor_memory),
            *("--driver-memory", self.driver_memory, "--total-executor-cores", str(self.total_executor_cores)),
            *confs,
            self.application,
            *self.application_args,
        ]


def spark_core_jar(spark_home: str | None) -> str:
    """The spark-core jar under ``spark_home`` (default: the installed pyspark's)."""
    home = Path(spark_home) if spark_home else _pyspark_home()
    jars = sorted((home / "jars").glob("spark-core_*.jar"))
    if not jars:
        raise DeployError(f"no spark-core jar under {home / 'jars'}: set spark_home to SPARK_HOME on the Spark nodes")
    return str(jars[-1])


def _pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def submission(queue: QueueSpec, kafka: KafkaTarget, settings: SubmitSettings) -> Submission:
    """The submission of ``queue``'s worker with the platform's ``settings``."""
    cores = int(queue.executor.get("cores", 1))
    python = settings.conf.get("spark.pyspark.python") or launcher()
    conf = {
        # The worker's own controller asks the master for executors (requestExecutors), between
        # minExecutors and maxExecutors: Spark's dynamic allocation would fight it.
        "spark.dynamicAllocation.enabled": "false",
        "spark.executor.instances": str(queue.min_executors),
        "spark.driver.cores": str(int(queue.driver.get("cores", 1))),
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        # The master restarts a driver that exits non-zero or loses its node, as a Deployment would.
        "spark.driver.supervise": "true",
        **settings.conf,
    }
    args = [settings.worker_script or str(shipped_file("spark_apps/queue_worker.py")), ""]  # "": no py-files
    args += ["--spec", str(Path(queue.source).resolve()), "--metrics-port", str(settings.metrics_port)]
    if settings.checkpoint_dir:
        args += ["--checkpoint-dir", f"{settings.checkpoint_dir.rstrip('/')}/{queue.team}/{queue.name}"]
    return Submission(
        name=f"queueplane-{queue.team}-{queue.name}",
        application=spark_core_jar(settings.spark_home),
        application_args=args,
        conf=conf,
        executor_cores=cores,
        executor_memory=str(queue.executor.get("memory", "1g")),
        driver_memory=str(queue.driver.get("memory", "1g")),
        total_executor_cores=queue.max_executors * cores,
        env=_environment(kafka, settings),
    )


def _environment(kafka: KafkaTarget, settings: SubmitSettings) -> dict[str, str]:
    env = {key: os.environ[key] for key in _SUBMIT_ENV if key in os.environ}
    if settings.kafka_config:
        env[ENV_KAFKA_CONFIG] = settings.kafka_config
        return env
    secured = sorted(set(kafka.settings) - _PLAIN_SETTINGS)
    if secured:
        raise UsageError(
            f"the Kafka connection sets {', '.join(secured)}, which a driver on the Spark cluster cannot be "
            "handed on its command line or environment (the master keeps both); install a librdkafka "
            "properties file on the Spark nodes and name it in kafka_config of the Variable queueplane_spark_submit"
        )
    env[ENV_BOOTSTRAP] = kafka.bootstrap
    return env


class StandaloneDrivers:
    """A standalone master's REST submission server (``spark.master.rest.enabled``): driver state and kill.

    The Spark provider's hook polls and kills through the same endpoints; a streaming worker
    never finishes, so the deploy waits for RUNNING instead of for the end.
    """

    def __init__(self, rest_endpoint: str, timeout_s: float = 30.0):
        self.rest_endpoint = rest_endpoint.rstrip("/")
        self.timeout_s = timeout_s

    def state(self, driver_id: str) -> str:
        answer = self._call("GET", f"/v1/submissions/status/{driver_id}")
        return str(answer.get("driverState") or "UNKNOWN")

    def kill(self, driver_id: str) -> None:
        answer = self._call("POST", f"/v1/submissions/kill/{driver_id}")
        if not answer.get("success") and self.state(driver_id) not in ENDED_STATES:
            raise DeployError(f"the master did not kill driver {driver_id}: {answer.get('message', answer)}")

    def wait_for(self, driver_id: str, states: frozenset[str], timeout_s: float, poll_s: float = 1.0) -> str:
        """The driver's state once it is one of ``states`` or has ended; DeployError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.state(driver_id)
            if state in states or state in ENDED_STATES:
                return state
            if time.monotonic() > deadline:
                raise DeployError(f"driver {driver_id} is still {state} after {timeout_s:.0f}s")
            time.sleep(poll_s)

    def stop(self, driver_id: str, timeout_s: float) -> str | None:
        """Kill the driver if it still runs and wait until it has ended; its state before, or None if ended."""
        state = self.state(driver_id)
        if state in ENDED_STATES:
            return None
        self.kill(driver_id)
        self.wait_for(driver_id, ENDED_STATES, timeout_s)
        return state

    def _call(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.rest_endpoint}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:  # the server answers errors with a JSON body too
            try:
                return json.loads(exc.read() or b"{}")
            except ValueError:
                raise DeployError(f"Spark master {self.rest_endpoint}{path}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise DeployError(
                f"cannot reach the Spark master's REST server at {self.rest_endpoint} ({exc}); "
                "it needs spark.master.rest.enabled=true"
            ) from None
