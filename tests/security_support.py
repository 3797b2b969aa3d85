"""Credentials other than SCRAM for the secure local broker: OAuth tokens and client certificates.

`OAuthIssuer` is an OAuth 2 token endpoint on loopback (the client-credentials grant, RS256
JWTs) whose public keys the broker trusts through the stack's JWKS file; `client_certificate`
signs a client certificate with the stack's own CA, for its mTLS listener.
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

TOKEN_LIFETIME_S = 3600


class OAuthIssuer:
    """A token endpoint for registered clients; each token's ``sub`` is the client id."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(8)
        self.clients: dict[str, str] = {}
        self.issued: list[str] = []  # client ids, in the order tokens went out
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                scheme, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
                client, _, secret = base64.b64decode(encoded or b"").decode().partition(":")
                if scheme != "Basic" or form.get("grant_type") != ["client_credentials"]:
                    return self._answer(400, {"error": "invalid_request"})
                if issuer.clients.get(client) != secret:
                    return self._answer(401, {"error": "invalid_client"})
                issuer.issued.append(client)
                return self._answer(200, {"access_token": issuer.token(client), "token_type": "Bearer"})

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="oauth-issuer", daemon=True)

    @property
    def token_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/token"

    def start(self) -> OAuthIssuer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def write_jwks(self, path: Path) -> None:
        """The public key as the broker's JWKS file."""
        numbers = self.key.public_key().public_numbers()

        def b64(value: int) -> str:
            raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
            return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

        key = {"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256", "n": b64(numbers.n), "e": b64(numbers.e)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"keys": [key]}))

    def token(self, subject: str) -> str:
        now = int(time.time())
        claims = {"sub": subject, "iat": now, "exp": now + TOKEN_LIFETIME_S, "scope": "kafka"}
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})

    def client(self, client_id: str) -> str:
        """Register a client; returns its secret."""
        self.clients[client_id] = secrets.token_urlsafe(16)
        return self.clients[client_id]


def client_certificate(tls_dir: Path, common_name: str) -> tuple[str, str]:
    """A client certificate (CN=``common_name``) signed by the local stack's CA, and its PKCS#8 key, as PEM."""
    password = (tls_dir / "password").read_text().strip().encode()
    ca_key, ca_cert, _ = pkcs12.load_key_and_certificates((tls_dir / "ca.p12").read_bytes(), password)
    assert ca_key is not None and ca_cert is not None
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()
