"""A real Airflow for end-to-end tests: api-server, scheduler and dag-processor on loopback.

Everything lives in a private AIRFLOW_HOME (SQLite metadata DB, logs); the simple auth
manager makes every user an admin, so the REST API and the UI need no login form.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import parallel

from queueplane.local.processes import free_port

DAGS = Path(__file__).resolve().parents[1] / "dags"
COMPONENTS = ("api-server", "scheduler", "dag-processor")


@dataclass
class AirflowStack:
    home: Path
    env: dict[str, str]
    port: int
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    token: str = ""
    # From start to stop the stack holds the run's light lock (parallel.background_stack): its
    # processes work between tests, and no heavy test may run beside them.
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def create(cls, home: Path, extra_env: dict[str, str]) -> AirflowStack:
        port = free_port("127.0.0.1")
        base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env = {
            **base,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            # SQLite takes one writer at a time; the API server, scheduler, DAG processor and task
            # processes all write. sqlite3 waits 5 s for the lock by default, and on a loaded node
            # a trigger's write timed out (a 500 "Database error"): wait up to 30 s.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}?timeout=30",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": "queueplane-e2e-test-secret",
            "AIRFLOW__API__SECRET_KEY": "queueplane-e2e-test-secret",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            **extra_env,
        }
        return cls(home, env, port)

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(Path(sys.executable).with_name("airflow")), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )

    def start(self) -> None:
        self.held.enter_context(parallel.background_stack())
        self.airflow("db", "migrate")
        for name in COMPONENTS:
            log = open(self.home / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process in stop()
            self.processes[name] = subprocess.Popen(
                [str(Path(sys.executable).with_name("airflow")), name],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_for(lambda: self._token(), "the API server", timeout=180)

    def _token(self) -> bool:
        self.check_alive()
        try:
            with urllib.request.urlopen(f"{self.url}/auth/token", timeout=5) as response:
                self.token = json.load(response)["access_token"]
                return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {process.returncode}:\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.home / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"{self.url}/api/v2{path}",
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def wait_for(self, condition: Any, what: str, timeout: float = 240, interval: float = 1.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            result = condition()
            if result:
                return result
            time.sleep(interval)
        logs = "\n".join(f"--- {n}\n{self.log_tail(n)}" for n in self.processes)
        raise TimeoutError(f"waited {timeout:.0f}s for {what}\n{logs}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 240) -> dict[str, Any]:
        """The finished run (success or failed), polled through the REST API."""

        def finished() -> dict[str, Any] | None:
            status, run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            return run if status == 200 and run["state"] in ("success", "failed") else None

        return self.wait_for(finished, f"run {run_id} of {dag_id} to finish", timeout)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        _, body = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in body["task_instances"]}

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.held.close()
