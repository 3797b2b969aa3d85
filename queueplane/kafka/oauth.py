"""SASL OAUTHBEARER from librdkafka's settings, for the clients that are not librdkafka.

librdkafka fetches and refreshes tokens itself (``sasl.oauthbearer.method=oidc``: the OAuth
client-credentials grant against ``sasl.oauthbearer.token.endpoint.url``; the default method:
an unsecured JWT made from ``sasl.oauthbearer.config``, for development only). The same
settings must reach Kafka's Java client (Spark's Kafka source and sink), which names them
differently and, since Kafka 3.9.1, contacts only the URLs a JVM system property allows; and
queueplane's own protocol connection, which needs one token per connection.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from queueplane.errors import UsageError
from queueplane.kafka.refused import Refused

MECHANISM = "OAUTHBEARER"
LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
LOGIN_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
# The JVM system property listing the token and JWKS URLs Kafka's Java client may contact.
ALLOWED_URLS_PROPERTY = "org.apache.kafka.sasl.oauthbearer.allowed.urls"


def uses_oauth(settings: Mapping[str, str]) -> bool:
    return (settings.get("sasl.mechanism") or settings.get("sasl.mechanisms") or "").upper() == MECHANISM


def _oidc(settings: Mapping[str, str]) -> bool:
    return settings.get("sasl.oauthbearer.method", "default").lower() == "oidc"


def _extensions(settings: Mapping[str, str]) -> dict[str, str]:
    """``sasl.oauthbearer.extensions`` (key=value,key=value)."""
    text = settings.get("sasl.oauthbearer.extensions", "")
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise UsageError("sasl.oauthbearer.extensions: expected key=value pairs separated by commas")
    return {key.strip(): value.strip() for key, value in pairs}


def _unsecured_config(settings: Mapping[str, str]) -> dict[str, str]:
    """``sasl.oauthbearer.config`` of the default method: ``principal=NAME [scope=A,B] [lifeSeconds=N]``."""
    pairs = [item.split("=", 1) for item in settings.get("sasl.oauthbearer.config", "").split()]
    config = {pair[0]: pair[1] for pair in pairs if len(pair) == 2}
    if not config.get("principal"):
        raise UsageError("sasl.oauthbearer.config: the unsecured OAUTHBEARER method needs principal=NAME")
    return config


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """Kafka Java client settings for the OAUTHBEARER login the librdkafka settings describe."""
    options: dict[str, str] = {}
    java = {"sasl.mechanism": MECHANISM}
    if _oidc(settings):
        endpoint = settings.get("sasl.oauthbearer.token.endpoint.url")
        if not endpoint:
            raise UsageError("sasl.oauthbearer.method=oidc needs sasl.oauthbearer.token.endpoint.url")
        java["sasl.login.callback.handler.class"] = LOGIN_HANDLER
        java["sasl.oauthbearer.token.endpoint.url"] = endpoint
        options["clientId"] = settings.get("sasl.oauthbearer.client.id", "")
        options["clientSecret"] = settings.get("sasl.oauthbearer.client.secret", "")
        if settings.get("sasl.oauthbearer.scope"):
            options["scope"] = settings["sasl.oauthbearer.scope"]
    else:  # the Java client's default login handler makes the same unsecured token
        config = _unsecured_config(settings)
        options["unsecuredLoginStringClaim_sub"] = config["principal"]
        if config.get("scope"):
            options["unsecuredLoginListClaim_scope"] = "," + config["scope"]  # first character: separator
        if config.get("lifeSeconds"):
            options["unsecuredLoginLifetimeSeconds"] = config["lifeSeconds"]
    for key, value in _extensions(settings).items():
        options[f"unsecuredLoginExtension_{key}" if not _oidc(settings) else f"extension_{key}"] = value
    body = " ".join(f"{key}={_quoted(value)}" for key, value in options.items())
    java["sasl.jaas.config"] = f"{LOGIN_MODULE} required {body};"
    return java


def allowed_urls(settings: Mapping[str, str]) -> str | None:
    """The value the Java client's JVM needs in ``ALLOWED_URLS_PROPERTY``, or None when no URL is used."""
    if uses_oauth(settings) and _oidc(settings):
        return settings.get("sasl.oauthbearer.token.endpoint.url") or None
    return None


def token(settings: Mapping[str, str], timeout: float) -> str:
    """An access token for one connection: from the token endpoint (oidc), else an unsecured JWT."""
    if not _oidc(settings):
        config = _unsecured_config(settings)
        now = int(time.time())
        claims = {"sub": config["principal"], "iat": now, "exp": now + int(config.get("lifeSeconds", "3600"))}
        if config.get("scope"):
            claims["scope"] = config["scope"].split(",")
        return f"{_b64url({'alg': 'none'})}.{_b64url(claims)}."
    endpoint = settings["sasl.oauthbearer.token.endpoint.url"]
    form = {"grant_type": "client_credentials"}
    if settings.get("sasl.oauthbearer.scope"):
        form["scope"] = settings["sasl.oauthbearer.scope"]
    client = f"{settings.get('sasl.oauthbearer.client.id', '')}:{settings.get('sasl.oauthbearer.client.secret', '')}"
    request = urllib.request.Request(
        endpoint,
        data=urllib.parse.urlencode(form).encode(),
        headers={
            "Authorization": "Basic " + base64.b64encode(client.encode()).decode(),
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            issued = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise Refused(
            "SASL_AUTHENTICATION_FAILED", f"the token endpoint refused the client credentials (HTTP {exc.code})"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConnectionError(f"the token endpoint did not answer with a token: {exc}") from None
    if not isinstance(issued, dict) or not issued.get("access_token"):
        raise ConnectionError("the token endpoint's answer holds no access_token")
    return str(issued["access_token"])


def initial_response(settings: Mapping[str, str], access_token: str) -> bytes:
    """The client's first (and only) SASL message of RFC 7628, with the configured extensions."""
    extensions = "".join(f"\x01{key}={value}" for key, value in _extensions(settings).items())
    return f"n,,\x01auth=Bearer {access_token}{extensions}\x01\x01".encode()


def _b64url(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).rstrip(b"=").decode()
