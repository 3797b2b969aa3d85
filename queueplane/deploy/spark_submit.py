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
file on the nodes that the platform assigned to the queue's team (``kafka_config``: a file per
team, or a path holding ``{team}``). Credentials never go on a command line or into that
environment, and a setting that names another team's file is refused.

Spark RPC: every submission is authenticated and encrypted (``spark.authenticate``,
``spark.network.crypto.enabled``) with the secret the platform installs on the Airflow workers
and on every Spark node, the one the master and the workers run with. A standalone driver takes
its secret from ``spark.authenticate.secret`` alone (``spark.authenticate.secret.file`` is read on
Kubernetes only, and a worker strips ``-Dspark.authenticate.secret`` from the driver's options), so
the platform's file is a Java argument file holding ``-Dspark.authenticate.secret=KEY``: the
spark-submit client reads it through ``SPARK_SUBMIT_OPTS=@FILE``, the driver through
``spark.driver.extraJavaOptions=@FILE``, and the key itself is never on a command line, in the
submission or in Airflow. The executors get it from their worker. A submission without the file
is refused; so is any setting that would switch authentication or encryption off
(queueplane.deploy.spark_conf).

The settings come from the platform's Airflow Variable ``queueplane_spark_submit`` only.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queueplane.deploy.spark_conf import check_conf
from queueplane.errors import DeployError, UsageError
from queueplane.kafka.target import ENV_BOOTSTRAP, ENV_KAFKA_CONFIG, KafkaTarget
from queueplane.paths import shipped_file
from queueplane.run.spark.interpreter import launcher
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


SETTINGS_VARIABLE = "queueplane_spark_submit"
SETTINGS_SOURCE = f"Airflow Variable {SETTINGS_VARIABLE}"
TEAM_FIELD = "{team}"


@dataclass(frozen=True)
class SubmitSettings:
    """The Spark cluster's side of a submission, the platform's alone: the Airflow Variable
    ``queueplane_spark_submit`` (JSON). Checked whole when made, so no path reaches a submission
    unchecked.
    """

    conf: dict[str, str] = field(default_factory=dict)  # Spark conf, e.g. spark.pyspark.python
    # A Java argument file on the Airflow workers and every Spark node: -Dspark.authenticate.secret=KEY.
    auth_secret_file: str | None = None
    # Each team's librdkafka properties file on the Spark nodes: {team: path}, or a path holding {team}.
    kafka_config: dict[str, str] | str | None = None
    spark_home: str | None = None  # SPARK_HOME on the nodes; default: this machine's pyspark
    worker_script: str | None = None  # queue_worker.py on the nodes; default: the one queueplane ships
    checkpoint_dir: str | None = None  # a shared folder or object store; a folder per queue goes under it
    metrics_port: int = DEFAULT_METRICS_PORT
    start_timeout_s: float = 300.0
    source: str = field(default=SETTINGS_SOURCE, compare=False)  # where they come from, for errors

    def __post_init__(self) -> None:
        if not isinstance(self.conf, dict):
            raise UsageError(f"{self.source}: /conf must be an object of Spark settings, got {_kind(self.conf)}")
        check_conf(self.conf, f"{self.source}: /conf")
        for name in ("auth_secret_file", "spark_home", "worker_script"):
            value = getattr(self, name)
            if value is not None:
                _node_path(value, f"{self.source}: /{name}")
        if isinstance(self.kafka_config, str):
            _team_template(self.kafka_config, f"{self.source}: /kafka_config")
        elif isinstance(self.kafka_config, dict):
            owners: dict[str, str] = {}
            for team, path in self.kafka_config.items():
                _node_path(path, f"{self.source}: /kafka_config/{team}")
                if path in owners:
                    raise UsageError(
                        f"{self.source}: /kafka_config/{team}: {path} is assigned to team {owners[path]} too; each "
                        "team's Kafka credentials are a file of its own, so one team's worker never holds another's"
                    )
                owners[path] = str(team)
        elif self.kafka_config is not None:
            raise UsageError(
                f"{self.source}: /kafka_config must map each team to its properties file, or be a path holding "
                f"{TEAM_FIELD}, got {_kind(self.kafka_config)}"
            )

    @classmethod
    def from_variable(cls, data: Mapping[str, Any] | None, source: str = SETTINGS_SOURCE) -> SubmitSettings:
        """The settings of the Variable's JSON ``data``; UsageError naming ``source`` and the key when wrong."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise UsageError(f"{source}: must be a JSON object of spark-submit settings, got {_kind(data)}")
        known = set(cls.__dataclass_fields__) - {"source"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        conf = data.get("conf", {})
        if not isinstance(conf, dict):
            raise UsageError(f"{source}: /conf must be an object of Spark settings, got {_kind(conf)}")
        rest = {key: value for key, value in data.items() if key != "conf"}
        return cls(conf={str(k): str(v) for k, v in conf.items()}, source=source, **rest)

    def kafka_config_for(self, team: str) -> str | None:
        """The properties file the platform assigned to ``team``, or None when it assigned none."""
        if isinstance(self.kafka_config, str):
            return _node_path(self.kafka_config.replace(TEAM_FIELD, team), f"{self.source}: /kafka_config")
        if isinstance(self.kafka_config, dict):
            return self.kafka_config.get(team)
        return None

    def refuse_other_teams_files(self, team: str) -> None:
        """UsageError when a setting names a Kafka properties file the platform assigned to another team."""
        if isinstance(self.kafka_config, dict):
            others = {path: owner for owner, path in self.kafka_config.items() if owner != team}

            def owner_of(text: str) -> str | None:
                return next((owner for path, owner in others.items() if path in text), None)

        elif isinstance(self.kafka_config, str):
            head, _, tail = self.kafka_config.partition(TEAM_FIELD)
            pattern = re.compile(re.escape(head) + r"([A-Za-z0-9._-]+)" + re.escape(tail))

            def owner_of(text: str) -> str | None:
                return next((m.group(1) for m in pattern.finditer(text) if m.group(1) != team), None)

        else:
            return
        named = [(f"/conf/{key}", value) for key, value in self.conf.items()]
        named += [(f"/{name}", getattr(self, name)) for name in ("spark_home", "worker_script", "checkpoint_dir")]
        for pointer, value in named:
            owner = owner_of(str(value)) if value else None
            if owner:
                raise UsageError(
                    f"{self.source}: {pointer} names the Kafka properties file of team {owner}, which the platform "
                    f"did not assign to team {team}: a queue's worker reads only its own team's credentials"
                )


def _kind(value: object) -> str:
    return type(value).__name__


def _node_path(path: object, where: str) -> str:
    """``path`` when it is an absolute, normalized path on the nodes; else UsageError naming ``where``."""
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or posixpath.normpath(path) != path
        or path.startswith("//")
        or any(c in path for c in "\0\n\r")
    ):
        raise UsageError(f"{where}: {path!r} is not an absolute, normalized path (no '..', '.', '//' or trailing '/')")
    return path


def _team_template(template: str, where: str) -> None:
    rest = template.replace(TEAM_FIELD, "")
    if template.count(TEAM_FIELD) != 1 or "{" in rest or "}" in rest:
        raise UsageError(
            f"{where}: {template!r} names one file for every team; give each team its own file, as a mapping of "
            f"team to path or as a path holding {TEAM_FIELD} once (e.g. /etc/queueplane/kafka/{TEAM_FIELD}.properties)"
        )
    _node_path(template.replace(TEAM_FIELD, "team"), where)


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
    """The submission of ``queue``'s worker with the platform's ``settings``, Spark RPC authenticated."""
    if not settings.auth_secret_file:
        raise UsageError(
            f"{settings.source}: /auth_secret_file is not set, and the spark-submit target submits only with Spark "
            "RPC authentication on: name the Java argument file (-Dspark.authenticate.secret=KEY) that the platform "
            "installs on the Airflow workers and every Spark node, the secret the master and workers run with"
        )
    settings.refuse_other_teams_files(queue.team)
    cores = int(queue.executor.get("cores", 1))
    python = settings.conf.get("spark.pyspark.python") or launcher()
    secret = f"@{settings.auth_secret_file}"
    java_options = " ".join(filter(None, [secret, settings.conf.get("spark.driver.extraJavaOptions")]))
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
        # After the platform's conf, which may not set these anyway (spark_conf.check_conf).
        "spark.authenticate": "true",
        "spark.network.crypto.enabled": "true",
        "spark.driver.extraJavaOptions": java_options,
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
        env={**_environment(queue, kafka, settings), "SPARK_SUBMIT_OPTS": secret},
    )


def _environment(queue: QueueSpec, kafka: KafkaTarget, settings: SubmitSettings) -> dict[str, str]:
    env = {key: os.environ[key] for key in _SUBMIT_ENV if key in os.environ}
    properties = settings.kafka_config_for(queue.team)
    if properties:
        env[ENV_KAFKA_CONFIG] = properties
        return env
    secured = sorted(set(kafka.settings) - _PLAIN_SETTINGS)
    if secured:
        raise UsageError(
            f"the Kafka connection sets {', '.join(secured)}, which a driver on the Spark cluster cannot be "
            "handed on its command line or environment (the master keeps both); install a librdkafka "
            f"properties file for team {queue.team} on the Spark nodes and assign it in kafka_config of "
            f"{settings.source}"
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
