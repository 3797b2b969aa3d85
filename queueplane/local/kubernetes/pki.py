"""The local cluster's certificates: one CA and a certificate per component, made with openssl.

Client certificates carry the subjects Kubernetes' RBAC expects (``O=system:masters`` for the
admin, ``system:node:<node>`` for the kubelet, ...), so no bootstrap tokens or CSR approval are
needed. The CA also becomes ``kube-root-ca.crt`` in every namespace, which is how pods (the Spark
driver among them) trust the API server.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from queueplane.errors import LocalStackError

CA_SUBJECT = "/CN=queueplane-local-ca"
DAYS = "3650"

# name -> (subject, extended key usage)
CLIENTS = {
    "admin": ("/O=system:masters/CN=kubernetes-admin", "clientAuth"),
    "apiserver-kubelet-client": ("/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth"),
    "controller-manager": ("/CN=system:kube-controller-manager", "clientAuth"),
    "scheduler": ("/CN=system:kube-scheduler", "clientAuth"),
    "kube-proxy": ("/CN=system:kube-proxy", "clientAuth"),
    "coredns": ("/CN=system:coredns", "clientAuth"),
}


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise LocalStackError(f"openssl {args[0]} failed in {cwd}: {done.stderr.strip()}")


def _key(directory: Path, name: str) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=directory)


def _signed(directory: Path, name: str, subject: str, usage: str, san: str | None = None) -> None:
    _key(directory, name)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=directory)
    extensions = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    extensions.append(f"extendedKeyUsage={usage}")
    if san:
        extensions.append(f"subjectAltName={san}")
    (directory / f"{name}.ext").write_text("\n".join(extensions) + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-sha256", "-days", DAYS, "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=directory,
    )  # fmt: skip
    (directory / f"{name}.csr").unlink()
    (directory / f"{name}.ext").unlink()


def ensure_pki(directory: Path, node: str, node_ip: str, service_ip: str) -> Path:
    """Create the CA and every certificate once; a directory that has a CA is left as it is."""
    if (directory / "ca.crt").is_file() and (directory / "sa.pub").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    _key(directory, "ca")
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", DAYS, "-subj", CA_SUBJECT,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.crt", cwd=directory,
    )  # fmt: skip
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    names.append("kubernetes.default.svc.cluster.local")
    san = ",".join([*(f"DNS:{n}" for n in names), "IP:127.0.0.1", f"IP:{node_ip}", f"IP:{service_ip}"])
    _signed(directory, "apiserver", "/CN=kube-apiserver", "serverAuth", san)
    _signed(directory, "kubelet", f"/O=system:nodes/CN=system:node:{node}", "clientAuth")
    for name, (subject, usage) in CLIENTS.items():
        _signed(directory, name, subject, usage)
    # The service-account token signing pair; RSA because every token verifier accepts it.
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=directory)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    (directory / "ca.srl").unlink(missing_ok=True)
    return directory
