"""Spark settings that no deployer value may set, on either deploy target.

The platform turns Spark's RPC authentication and encryption on, mounts only the volumes the
chart declares, and hands each queue the credentials it assigned to that queue's team. Extra
Spark settings come from the platform (chart values, the ``queueplane_spark_submit``
Variable), and even those may not undo any of that: a setting in one of the families below is
refused, naming it, wherever it comes from. The chart's values schema and its templates refuse
the same names (charts/queue-worker), so helm run on its own holds too.

Keys are compared without case: Spark's own keys are case-sensitive, but a refusal that a
differently spelled key slips past would be no refusal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from queueplane.errors import UsageError

# Named like a credential: the value would be one, readable wherever the setting is kept.
CREDENTIAL_NAME = re.compile(
    r"password|secret|jaas|token|credential|access[._-]?key|account\.key|key[._-]?file|keytab|keystore|truststore",
    re.IGNORECASE,
)

# (pattern over the key, why it is refused).
FORBIDDEN: tuple[tuple[str, str], ...] = (
    (r"^spark\.authenticate($|\.)", "Spark RPC authentication is the platform's and stays on"),
    (r"^spark\.network\.crypto\.", "Spark RPC encryption is the platform's and stays on"),
    (r"^spark\.network\.sasl\.", "Spark RPC encryption is the platform's and stays on"),
    (r"^spark\.io\.encryption\.", "Spark's local-disk encryption is the platform's"),
    (r"^spark\.ssl($|\.)", "Spark's TLS settings are the platform's"),
    (r"^spark\.kubernetes\.(driver|executor)\.volumes\.hostpath\.", "a worker never mounts a host path"),
    (r"^spark\.kubernetes\.(driver|executor)\.podtemplate", "the executors' pod template is the chart's"),
    (r"^spark\.kubernetes\.authenticate\.", "the driver's Kubernetes credentials are its ServiceAccount's"),
    (
        r"^spark\.(executorenv|kubernetes\.driverenv|yarn\.appmasterenv)\."
        r"(queueplane_|_?spark_|java_tool_options$|jdk_java_options$|_java_options$)",
        "the worker's Kafka properties file, Spark's secret and the JVM's options are the platform's to name",
    ),
)
_FORBIDDEN = [(re.compile(pattern, re.IGNORECASE), why) for pattern, why in FORBIDDEN]

# Java options of a Spark process: a -Dspark.* there sets what conf would, unchecked; an @file
# reads options from a file; the JAAS and key/trust store properties name credential files.
# Quotes and backslashes are refused too, since Spark's launcher strips them from a word.
JAVA_OPTIONS_KEY = re.compile(r"^spark\.(driver|executor|yarn\.am)\.(extra|default)JavaOptions$", re.IGNORECASE)
JAVA_OPTIONS_REFUSED = re.compile(
    r"['\"\\]|(^|\s)(@|-Dspark\.|-Djava\.security\.auth\.|-Djavax\.net\.ssl\.)", re.IGNORECASE
)

# The same rules as one pattern each, as the chart's values.schema.json and deployment.yaml
# carry them (Go's regexp syntax, which Helm's schema validator and templates use).
REFUSED_KEY = "(?i)" + "|".join([CREDENTIAL_NAME.pattern, *(pattern for pattern, _ in FORBIDDEN)])
REFUSED_JAVA_OPTIONS = "(?i)" + JAVA_OPTIONS_REFUSED.pattern


def refusal(key: str, value: object) -> str | None:
    """Why the Spark setting ``key`` = ``value`` is refused, or None when a deployer may set it."""
    if CREDENTIAL_NAME.search(key):
        return "credentials never go into Spark settings"
    for pattern, why in _FORBIDDEN:
        if pattern.search(key):
            return why
    if JAVA_OPTIONS_KEY.match(key):
        found = JAVA_OPTIONS_REFUSED.search(str(value))
        if found:
            return (
                f"Java options may not hold {found.group(0).strip()!r} (Spark settings go in conf, where they are "
                "checked; no option files, quotes or escapes; credentials come from the platform)"
            )
    return None


def check_conf(conf: Mapping[str, object], where: str) -> None:
    """UsageError naming the first refused setting of ``conf`` (from ``where``, a file or a JSON pointer)."""
    for key, value in conf.items():
        why = refusal(str(key), value)
        if why:
            raise UsageError(
                f"{where}/{key}: refused: {why}. Spark's authentication and encryption, host paths and "
                "credentials are set by the platform alone, and no value may change them"
            )
