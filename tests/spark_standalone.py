"""A real Spark standalone cluster on loopback: one master and one worker from the pyspark install.

With ``auth_args``, its daemons run as a platform's would under queueplane's spark-submit target:
Spark RPC authenticated and encrypted, the secret read from a Java argument file
(``-Dspark.authenticate.secret=KEY``), the same file the submissions name.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

from queueplane.local import processes

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"


def free_port() -> int:
    return processes.free_port(processes.HOST)


def write_auth_args(path: Path) -> Path:
    """A Java argument file holding a new Spark RPC secret, readable by its owner alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"-Dspark.authenticate.secret={secrets.token_hex(32)}\n")
    return path


def spark_env(auth_args: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    # The master and worker JVMs start like the tests' drivers (tests/conftest.py's SPARK_SUBMIT_OPTS).
    options = [os.environ.get("SPARK_SUBMIT_OPTS", "")]
    if auth_args:
        options += ["-Dspark.authenticate=true", "-Dspark.network.crypto.enabled=true", f"@{auth_args}"]
    env["SPARK_DAEMON_JAVA_OPTS"] = " ".join(o for o in options if o)
    return env


@dataclass
class Standalone:
    master_url: str
    master_ui: str
    processes: list[subprocess.Popen]
    rest_port: int | None = None  # the REST submission server (cluster deploy mode's status and kill)

    def state(self) -> dict:
        """The master's state; ConnectionError (an OSError, as when it is down) while its UI is
        starting: it answered ``/json/`` with its HTML page once, before the JSON page was attached."""
        with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=5) as response:
            body = response.read()
        try:
            return json.loads(body)
        except ValueError:
            raise ConnectionError(f"the master's UI answered /json/ with {body[:40]!r}") from None

    def cores_used(self) -> int:
        return int(self.state().get("coresused", 0))

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def start_standalone(
    work: Path, cores: int, memory: str, rest: bool = False, auth_args: Path | None = None
) -> Standalone:
    port, ui, worker_ui, rest_port = processes.free_ports(processes.HOST, 4)
    rest_port = rest_port if rest else None
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    master_env = spark_env(auth_args)
    if rest_port:
        master_env["SPARK_MASTER_OPTS"] = f"-Dspark.master.rest.enabled=true -Dspark.master.rest.port={rest_port}"
    master = subprocess.Popen(
        [
            str(SPARK_CLASS),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        env=master_env,
        stdout=(logs / "master.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    cluster = Standalone(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}", [master], rest_port)
    worker = subprocess.Popen(
        [
            str(SPARK_CLASS),
            "org.apache.spark.deploy.worker.Worker",
            cluster.master_url,
            "--host",
            "127.0.0.1",
            "--cores",
            str(cores),
            "--memory",
            memory,
            "--webui-port",
            str(worker_ui),
            "--work-dir",
            str(work / "w"),
        ],
        env=spark_env(auth_args),
        stdout=(logs / "worker.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    cluster.processes.append(worker)
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if cluster.state().get("aliveworkers", 0) >= 1:
                    return cluster
            time.sleep(0.5)
        raise RuntimeError(f"the standalone cluster did not come up; see {logs}")
    except BaseException:
        cluster.stop()  # not left running past the test that could not use it
        raise
