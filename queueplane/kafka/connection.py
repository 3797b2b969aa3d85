"""One authenticated connection to a broker, for queueplane's own protocol requests (protocol.py).

confluent-kafka's clients cannot send the share-group requests queueplane needs, so those go
over a socket of queueplane's own, which must reach a secured cluster the way the clients do:
TLS (with the cluster's CA, and a client certificate for mTLS), SASL PLAIN, SCRAM (RFC 5802,
as Kafka speaks it) and OAUTHBEARER (RFC 7628, kafka/oauth.py) from the same librdkafka
settings. A mechanism it does not speak (GSSAPI) is reported as such; callers treat the
answer as unknown.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

from queueplane.kafka import oauth
from queueplane.kafka.refused import Refused
from queueplane.kafka.wire import Reader, recv_exact, uvarint

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", oauth.MECHANISM)
_SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class UnsupportedSecurity(ConnectionError):
    """The settings ask for a security mechanism this connection does not speak."""


def protocol_of(settings: Mapping[str, str]) -> str:
    return settings.get("security.protocol", "plaintext").upper()


def mechanism_of(settings: Mapping[str, str]) -> str:
    return (settings.get("sasl.mechanism") or settings.get("sasl.mechanisms") or "GSSAPI").upper()


def speaks(settings: Mapping[str, str]) -> bool:
    """Whether a connection can be opened with these settings."""
    return not protocol_of(settings).startswith("SASL") or mechanism_of(settings) in SUPPORTED_MECHANISMS


def _tls_context(settings: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=settings.get("ssl.ca.location"), cadata=settings.get("ssl.ca.pem") or None
    )
    if settings.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    if settings.get("ssl.certificate.location"):
        context.load_cert_chain(
            settings["ssl.certificate.location"], settings.get("ssl.key.location"), settings.get("ssl.key.password")
        )
    elif settings.get("ssl.certificate.pem") and settings.get("ssl.key.pem"):
        # ssl loads a key pair from files only: a private folder, gone once loaded.
        with tempfile.TemporaryDirectory() as folder:
            pair = Path(folder) / "client.pem"
            pair.touch(mode=0o600)
            pair.write_text(settings["ssl.key.pem"].strip() + "\n" + settings["ssl.certificate.pem"].strip() + "\n")
            context.load_cert_chain(str(pair), password=settings.get("ssl.key.password"))
    return context


def _exchange(sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes, flexible: bool) -> bytes:
    """One request and its answer's body (the response header stripped)."""
    client_id = b"queueplane"
    header = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
    if flexible:
        header += b"\x00"  # no tagged fields
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    answer = recv_exact(sock, struct.unpack(">i", recv_exact(sock, 4))[0])
    if struct.unpack(">i", answer[:4])[0] != correlation:
        raise ConnectionError("Kafka answered another request")
    return answer[5:] if flexible else answer[4:]  # flexible responses carry an empty tag buffer


def _authenticate(sock: socket.socket, token: bytes, correlation: int) -> bytes:
    """SaslAuthenticate v2: send ``token``, return the broker's; raises on an error code."""
    body = uvarint(len(token) + 1) + token + b"\x00"
    answer = Reader(_exchange(sock, SASL_AUTHENTICATE_KEY, 2, correlation, body, flexible=True))
    error, message = answer.int16(), answer.compact_string()
    if error:
        raise Refused("SASL_AUTHENTICATION_FAILED", message or f"error {error}")
    return answer.take(answer.uvarint() - 1)


def _scram(sock: socket.socket, mechanism: str, user: str, password: str) -> None:
    """The SCRAM exchange of RFC 5802 (no channel binding), checking the server's signature too."""
    digest = _SCRAM_HASHES[mechanism]
    name = user.replace("=", "=3D").replace(",", "=2C")
    client_nonce = base64.b64encode(secrets.token_bytes(24)).decode()
    first_bare = f"n={name},r={client_nonce}"
    server_first = _authenticate(sock, f"n,,{first_bare}".encode(), 2).decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
    if not nonce.startswith(client_nonce):
        raise Refused("SASL_AUTHENTICATION_FAILED", "the broker's SCRAM nonce does not extend ours")
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", digest)
    stored_key = hashlib.new(digest, client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(stored_key, auth_message, digest)
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
    server_final = _authenticate(sock, f"{without_proof},p={proof}".encode(), 3).decode()
    expected = hmac.digest(hmac.digest(salted, b"Server Key", digest), auth_message, digest)
    if server_final != "v=" + base64.b64encode(expected).decode():
        raise Refused("SASL_AUTHENTICATION_FAILED", "the broker's SCRAM signature does not match")


def connect(host: str, port: int, settings: Mapping[str, str], timeout: float) -> socket.socket:
    """A socket to ``host:port`` secured and authenticated as ``settings`` say (librdkafka names)."""
    protocol = protocol_of(settings)
    if not speaks(settings):
        raise UnsupportedSecurity(f"SASL mechanism {mechanism_of(settings)} (queueplane's own requests speak "
                                  f"{', '.join(SUPPORTED_MECHANISMS)})")  # fmt: skip
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        if protocol in ("SSL", "SASL_SSL"):
            sock = _tls_context(settings).wrap_socket(sock, server_hostname=host)
        if protocol.startswith("SASL"):
            mechanism = mechanism_of(settings)
            body = struct.pack(">h", len(mechanism)) + mechanism.encode()
            answer = _exchange(sock, SASL_HANDSHAKE_KEY, 1, 1, body, flexible=False)
            if struct.unpack(">h", answer[:2])[0]:
                raise Refused("UNSUPPORTED_SASL_MECHANISM", f"the broker does not enable {mechanism}")
            user, password = settings.get("sasl.username", ""), settings.get("sasl.password", "")
            if mechanism == oauth.MECHANISM:
                challenge = _authenticate(sock, oauth.initial_response(settings, oauth.token(settings, timeout)), 2)
                if challenge:  # RFC 7628: an error (JSON); the client answers ^A and the broker fails the login
                    _authenticate(sock, b"\x01", 3)
                    raise Refused("SASL_AUTHENTICATION_FAILED", challenge.decode(errors="replace"))
            elif mechanism == "PLAIN":
                _authenticate(sock, b"\x00" + user.encode() + b"\x00" + password.encode(), 2)
            else:
                _scram(sock, mechanism, user, password)
        return sock
    except BaseException:
        sock.close()
        raise
