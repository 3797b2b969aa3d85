"""Which Kafka cluster a command talks to, as librdkafka settings.

Order: --kafka-config FILE (any librdkafka settings, SASL/SSL included) and
--bootstrap-servers (which wins over the file's), then $QUEUEPLANE_BOOTSTRAP_SERVERS
and $QUEUEPLANE_KAFKA_CONFIG; the command line then falls back to the running local stack.
Secrets stay out of specs: a config file may read them from the environment as ${NAME}.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queueplane.errors import UsageError
from queueplane.kafka import oauth
from queueplane.kafka.connection import speaks

ENV_BOOTSTRAP = "QUEUEPLANE_BOOTSTRAP_SERVERS"
ENV_KAFKA_CONFIG = "QUEUEPLANE_KAFKA_CONFIG"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class KafkaTarget:
    """librdkafka settings for one cluster, and a label for messages (never the secrets).

    Values are text, except the callbacks an Airflow Kafka connection resolves (``oauth_cb``, ...).
    """

    settings: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    local: bool = False

    @property
    def bootstrap(self) -> str:
        return str(self.settings.get("bootstrap.servers", ""))

    @property
    def first_server(self) -> str:
        """The first of the bootstrap servers, HOST:PORT."""
        return self.bootstrap.split(",")[0].strip()

    @property
    def principal(self) -> str | None:
        """``User:<name>`` when the settings authenticate with SASL and a user name, else None."""
        user = self.settings.get("sasl.username")
        sasl = self.settings.get("security.protocol", "").upper().startswith("SASL")
        return f"User:{user}" if user and sasl else None

    def speaks_share_requests(self) -> bool:
        """Whether queueplane's own protocol requests (share-group offsets and members) can reach
        this cluster: PLAINTEXT or TLS, SASL PLAIN or SCRAM (kafka/connection.py)."""
        return speaks(self.settings)


def read_kafka_config(path: str) -> dict[str, str]:
    """librdkafka settings from a properties file: key=value lines, # comments, ${ENV} references."""
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"--kafka-config {path}: cannot read the file: {exc.strerror}") from None
    settings: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith(("#", "!")):
            continue
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            # The line itself is never shown: a value broken over lines (a PEM key) would be printed.
            raise UsageError(f"{path}:{number}: expected key=value (a value on one line); the line is not shown")

        def env(match: re.Match[str], number: int = number) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise UsageError(f"{path}:{number}: ${{{name}}} is not set in the environment")
            return os.environ[name]

        settings[key.strip()] = _ENV_REF.sub(env, value.strip())
    return settings


def named_target(bootstrap_servers: str | None = None, kafka_config: str | None = None) -> KafkaTarget | None:
    """The cluster named by flags or the environment; None when none was named.

    Falling back to the embedded local stack is the command line's choice (queueplane.cli),
    not this module's: a worker or an operator must never guess a cluster.
    """
    config_file = kafka_config or os.environ.get(ENV_KAFKA_CONFIG)
    settings = read_kafka_config(config_file) if config_file else {}
    bootstrap = bootstrap_servers or settings.get("bootstrap.servers") or os.environ.get(ENV_BOOTSTRAP)
    if not bootstrap:
        return None
    settings["bootstrap.servers"] = bootstrap
    return KafkaTarget(settings, bootstrap)


_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def java_client_settings(settings: dict[str, str]) -> dict[str, str]:
    """The same cluster for Kafka's Java client (Spark's Kafka source and sink), from librdkafka settings.

    Covers what a config file usually holds: bootstrap servers, the security protocol,
    SASL PLAIN/SCRAM credentials, OAUTHBEARER (kafka/oauth.py), a PEM CA (file or inline), a
    client certificate and key for mTLS (files or inline), and hostname verification turned off.
    """
    java = {"bootstrap.servers": settings.get("bootstrap.servers", "")}
    if "security.protocol" in settings:
        java["security.protocol"] = settings["security.protocol"].upper()
    mechanism = settings.get("sasl.mechanisms") or settings.get("sasl.mechanism")
    if oauth.uses_oauth(settings):
        java.update(oauth.java_settings(settings))
    elif mechanism:
        java["sasl.mechanism"] = mechanism.upper()
        module = _JAAS_MODULES.get(mechanism.upper())
        if module and "sasl.username" in settings:
            user = settings["sasl.username"].replace('"', '\\"')
            password = settings.get("sasl.password", "").replace('"', '\\"')
            java["sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
    if "ssl.ca.location" in settings:
        java["ssl.truststore.type"] = "PEM"
        java["ssl.truststore.location"] = settings["ssl.ca.location"]
    elif "ssl.ca.pem" in settings:
        java["ssl.truststore.type"] = "PEM"
        java["ssl.truststore.certificates"] = settings["ssl.ca.pem"]
    # A client certificate (mTLS): the JVM reads PEM key stores inline; its key must be PKCS#8.
    certificate = _pem(settings, "ssl.certificate.pem", "ssl.certificate.location")
    key = _pem(settings, "ssl.key.pem", "ssl.key.location")
    if certificate and key:
        java["ssl.keystore.type"] = "PEM"
        java["ssl.keystore.certificate.chain"] = certificate
        java["ssl.keystore.key"] = key
        if "ssl.key.password" in settings:
            java["ssl.key.password"] = settings["ssl.key.password"]
    if settings.get("ssl.endpoint.identification.algorithm", "").lower() == "none":
        java["ssl.endpoint.identification.algorithm"] = ""
    return java


def _pem(settings: dict[str, str], inline: str, location: str) -> str | None:
    """A PEM setting given inline or as a file (read here: executors get the text, not the path)."""
    if settings.get(inline):
        return settings[inline]
    if settings.get(location):
        try:
            return Path(settings[location]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{location} {settings[location]}: cannot read the file: {exc.strerror}") from None
    return None
