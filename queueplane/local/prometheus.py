"""A real Prometheus on loopback, built from the Go module proxy: what the monitoring tests scrape with.

The chart's alert rules are unit-tested with ``promtool test rules``, and a Prometheus
scrapes a running local worker and evaluates those rules and the dashboard's queries against
what it scraped. Both binaries come from the ``github.com/prometheus/prometheus`` module at
a pinned version, built with ``remove_all_sd`` (no cloud service discovery: the tests name
their targets), which keeps a cold build to a few minutes.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from queueplane.errors import QueueplaneError
from queueplane.local.go_install import go_install
from queueplane.local.processes import HOST, free_port, terminate
from queueplane.paths import cache_dir

# The Go module's version of Prometheus 3.16.0 (its releases v3.X.Y are module versions v0.3XX.Y).
PROMETHEUS_VERSION = "v0.316.0"
MODULE = "github.com/prometheus/prometheus"
BUILD_TAGS = ("remove_all_sd",)


class PrometheusError(QueueplaneError):
    """Prometheus could not be built, started or asked."""


def _binary(name: str) -> Path:
    return go_install(
        f"{MODULE}/cmd/{name}",
        PROMETHEUS_VERSION,
        cache_dir() / f"prometheus-{PROMETHEUS_VERSION}",
        name,
        PrometheusError,
        tags=BUILD_TAGS,
    )


def prometheus_binary() -> Path:
    return _binary("prometheus")


def promtool_binary() -> Path:
    return _binary("promtool")


def build_both() -> str:
    """Both binaries (what the set-up step builds): the second reuses the first one's compile cache."""
    prometheus_binary()
    promtool_binary()
    return f"prometheus and promtool {PROMETHEUS_VERSION}"


class LocalPrometheus:
    """One Prometheus server scraping ``targets`` (host:port → extra labels) every ``interval``.

    ``rule_files`` are loaded and evaluated at the same interval. Its HTTP API is asked with
    the standard library; the data lives in ``directory`` and goes with it.
    """

    def __init__(
        self,
        directory: Path,
        targets: dict[str, dict[str, str]],
        rule_files: tuple[Path, ...] = (),
        interval: str = "1s",
    ):
        self.directory = directory
        self.targets = targets
        self.rule_files = list(rule_files)
        self.interval = interval
        self.port = free_port(HOST)
        self.url = f"http://{HOST}:{self.port}"
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        binary = prometheus_binary()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "queueplane",
                    "static_configs": [
                        {"targets": [target], "labels": labels} for target, labels in self.targets.items()
                    ],
                }
            ],
        }
        config_file = self.directory / "prometheus.yml"  # JSON is YAML, and needs no YAML library
        config_file.write_text(json.dumps(config, indent=2), encoding="utf-8")
        log = (self.directory / "prometheus.log").open("w")
        self._process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address={HOST}:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PrometheusError(f"Prometheus exited with {self._process.returncode}: see {log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise PrometheusError(f"Prometheus did not get ready in {timeout_s:.0f}s: see {log.name}")

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a GET on the HTTP API (``/api/v1/...``); an error answer raises."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as response:
            answer = json.loads(response.read())
        if answer.get("status") != "success":
            raise PrometheusError(f"Prometheus answered {path}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            terminate(self._process.pid)
            self._process.wait(timeout=30)
        self._process = None
