"""The Kubernetes API from inside the driver pod, as the pod's service account.

Plain HTTPS to the API server with the projected token (read again on each call, as the
kubelet rotates it) and the cluster CA: the worker image needs no Kubernetes client for the
few requests the driver makes (its Queue's status, the ownership of what Spark made for it).
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class InClusterApi:
    """``api(method, path, body)``: one request, its JSON answer. A PATCH is a merge patch."""

    def __init__(self, timeout_s: float = 10.0, account: Path = SERVICE_ACCOUNT):
        self.timeout_s = timeout_s
        self.account = account

    def namespace(self) -> str:
        """The pod's own namespace, as its service account's token was issued in."""
        return (self.account / "namespace").read_text().strip()

    def __call__(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        # Outside a pod (no API address, no service account) each call fails: the worker itself
        # runs anywhere, and its callers say so once.
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise OSError("not in a Kubernetes pod: KUBERNETES_SERVICE_HOST is not set")
        url = f"https://[{host}]:{port}{path}" if ":" in host else f"https://{host}:{port}{path}"
        context = ssl.create_default_context(cafile=str(self.account / "ca.crt"))
        token = (self.account / "token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json" if method == "PATCH" else "application/json"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError):  # the API server's Status object, when it sent one
                detail = json.loads(detail).get("message", detail)
            raise OSError(f"{method} {path.partition('?')[0]}: {exc.code} {detail}") from None
        return json.loads(text) if text else {}
