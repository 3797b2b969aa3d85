"""A real fault proxy between workers and a local broker: Toxiproxy, built from the Go module proxy.

The fault tests put it in front of a broker listener that advertises the proxy's port
(``LocalStack.proxied_at``), so every connection a worker makes, the Java client's in Spark
and librdkafka's alike, passes through it. Toxics then slow, reset or stall those
connections the way a flaky network or an overloaded broker does. Driven over Toxiproxy's
HTTP API with the standard library.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from queueplane.errors import QueueplaneError
from queueplane.local.go_install import go_install
from queueplane.local.processes import HOST, free_port, port_open, terminate
from queueplane.paths import cache_dir

TOXIPROXY_VERSION = "v2.12.0"
TOXIPROXY_PACKAGE = "github.com/Shopify/toxiproxy/v2/cmd/server"


class FaultProxyError(QueueplaneError):
    """The fault proxy could not be built, started or told what to do."""


def toxiproxy_binary() -> Path:
    """The pinned toxiproxy server, built on first use (under a minute, once)."""
    return go_install(
        TOXIPROXY_PACKAGE,
        TOXIPROXY_VERSION,
        cache_dir() / f"toxiproxy-{TOXIPROXY_VERSION}",
        "toxiproxy",
        FaultProxyError,
    )


class FaultProxy:
    """One toxiproxy server on loopback; ``proxy`` opens a listen port forwarding to an upstream."""

    def __init__(self, log_file: Path):
        self.api_port = free_port(HOST)
        self.log_file = log_file
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> FaultProxy:
        binary = toxiproxy_binary()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [str(binary), "-host", HOST, "-port", str(self.api_port)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while not port_open(HOST, self.api_port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise FaultProxyError(f"toxiproxy did not start; see {self.log_file}")
            time.sleep(0.1)
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._process is not None:
            terminate(self._process.pid)
            self._process.wait(10)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://{HOST}:{self.api_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise FaultProxyError(f"toxiproxy {method} {path}: {exc.code} {exc.read().decode()[:500]}") from None
        return json.loads(text) if text else None

    def proxy(self, name: str, listen_port: int, upstream_port: int) -> None:
        self._call(
            "POST", "/proxies", {"name": name, "listen": f"{HOST}:{listen_port}", "upstream": f"{HOST}:{upstream_port}"}
        )

    def toxic(self, proxy: str, name: str, kind: str, stream: str = "downstream", **attributes: int) -> None:
        """Add a toxic (``latency``, ``reset_peer``, ``timeout``, ...) to every connection of ``proxy``."""
        body = {"name": name, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes}
        self._call("POST", f"/proxies/{proxy}/toxics", body)

    def heal(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")
