"""Certificates for the local broker's SASL_SSL listener, made with the JDK's keytool.

Every machine that runs the broker has a JDK, so its keytool makes a private CA and a broker
certificate for 127.0.0.1 without another tool or a download. Clients get the CA as PEM
(librdkafka's ``ssl.ca.location``; the JVM clients read PEM truststores too). The files live
beside the broker's state and are made once per data directory.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from queueplane.errors import LocalStackError

VALID_DAYS = "3650"


@dataclass(frozen=True)
class BrokerTls:
    """The broker's PKCS12 keystore (key, certificate, CA) and the CA certificate clients trust."""

    keystore: Path
    password: str
    ca_file: Path


def _keytool(keytool: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([keytool, *args], input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise LocalStackError(f"keytool {args[0]} failed: {(done.stdout + done.stderr).strip()}")
    return done.stdout


def broker_tls(folder: Path, keytool: str, host: str) -> BrokerTls:
    """The CA and the broker's keystore under ``folder``, made on first use."""
    keystore, ca_file, secret = folder / "broker.p12", folder / "ca.pem", folder / "password"
    if keystore.is_file() and ca_file.is_file() and secret.is_file():
        return BrokerTls(keystore, secret.read_text().strip(), ca_file)
    folder.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(18)
    secret.write_text(password)
    secret.chmod(0o600)
    ca_store = folder / "ca.p12"
    for path in (ca_store, keystore):
        path.unlink(missing_ok=True)
    store = ["-storetype", "PKCS12", "-storepass", password, "-keypass", password]
    _keytool(
        keytool, "-genkeypair", "-alias", "ca", "-keyalg", "RSA", "-keysize", "2048", "-validity", VALID_DAYS,
        "-dname", "CN=queueplane local CA", "-ext", "bc:c", "-keystore", str(ca_store), *store,
    )  # fmt: skip
    ca_pem = _keytool(keytool, "-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca_store), *store)
    ca_file.write_text(ca_pem)
    names = f"SAN=ip:{host},dns:localhost"
    _keytool(
        keytool, "-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", VALID_DAYS,
        "-dname", "CN=localhost", "-ext", names, "-keystore", str(keystore), *store,
    )  # fmt: skip
    request = _keytool(keytool, "-certreq", "-alias", "broker", "-keystore", str(keystore), *store)
    signed = _keytool(
        keytool, "-gencert", "-rfc", "-alias", "ca", "-validity", VALID_DAYS, "-ext", names,
        "-keystore", str(ca_store), *store, stdin=request,
    )  # fmt: skip
    trust_ca = ["-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_file)]
    _keytool(keytool, *trust_ca, "-keystore", str(keystore), *store)
    _keytool(keytool, "-importcert", "-alias", "broker", "-keystore", str(keystore), *store, stdin=signed)
    return BrokerTls(keystore, password, ca_file)
