"""Kafka's "no" to queueplane's own requests: refused credentials, or an ACL the principal lacks.

Unlike a broker that does not answer, waiting does not help: the worker stops on it and the
command line says it in one line (cluster.refusal).
"""

from __future__ import annotations


class Refused(PermissionError):
    """Kafka answered and said no: the credentials (``what`` is SASL_AUTHENTICATION_FAILED) or an
    ACL the request needs (``what`` names the error, e.g. GROUP_AUTHORIZATION_FAILED). Waiting
    does not help, unlike the connection errors around it."""

    def __init__(self, what: str, detail: str = ""):
        super().__init__(f"{what}{f' ({detail})' if detail else ''}")
        self.what = what


# Kafka's error codes that mean the principal in use lacks an ACL.
AUTHORIZATION_ERRORS = {
    29: "TOPIC_AUTHORIZATION_FAILED",
    30: "GROUP_AUTHORIZATION_FAILED",
    31: "CLUSTER_AUTHORIZATION_FAILED",
}


def refuse_if_unauthorized(error: int, detail: str) -> None:
    """Raise Refused when ``error`` is one of Kafka's authorization errors."""
    if error in AUTHORIZATION_ERRORS:
        raise Refused(AUTHORIZATION_ERRORS[error], detail)
