"""Secured-cluster client settings: OAUTHBEARER for Java and queueplane's own requests; config file errors."""

from __future__ import annotations

import base64
import json

import pytest

from queueplane.errors import UsageError
from queueplane.kafka import oauth
from queueplane.kafka.connection import speaks
from queueplane.kafka.target import java_client_settings, read_kafka_config
from queueplane.run.spark.session import kafka_system_properties

OIDC = {
    "bootstrap.servers": "k:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "OAUTHBEARER",
    "sasl.oauthbearer.method": "oidc",
    "sasl.oauthbearer.client.id": "orders-worker",
    "sasl.oauthbearer.client.secret": 's"cret',
    "sasl.oauthbearer.token.endpoint.url": "https://idp.example.com/oauth2/token",
    "sasl.oauthbearer.scope": "kafka",
    "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
}


def test_client_credentials_become_the_java_login_handler_with_the_same_endpoint_and_jaas_options():
    java = java_client_settings(OIDC)
    assert java["sasl.mechanism"] == "OAUTHBEARER" and java["security.protocol"] == "SASL_SSL"
    assert java["sasl.login.callback.handler.class"] == oauth.LOGIN_HANDLER
    assert java["sasl.oauthbearer.token.endpoint.url"] == OIDC["sasl.oauthbearer.token.endpoint.url"]
    assert java["sasl.jaas.config"] == (
        f'{oauth.LOGIN_MODULE} required clientId="orders-worker" clientSecret="s\\"cret" scope="kafka" '
        'extension_logicalCluster="lkc-1" extension_identityPoolId="pool-2";'
    )
    assert kafka_system_properties(OIDC) == {oauth.ALLOWED_URLS_PROPERTY: OIDC["sasl.oauthbearer.token.endpoint.url"]}
    assert kafka_system_properties({"sasl.mechanism": "SCRAM-SHA-512"}) == {}


def test_the_unsecured_development_token_becomes_the_java_default_handlers_options_and_needs_no_url():
    settings = {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.config": "principal=alice scope=a,b lifeSeconds=60"}
    java = java_client_settings(settings)
    assert "sasl.login.callback.handler.class" not in java
    assert java["sasl.jaas.config"] == (
        f'{oauth.LOGIN_MODULE} required unsecuredLoginStringClaim_sub="alice" '
        'unsecuredLoginListClaim_scope=",a,b" unsecuredLoginLifetimeSeconds="60";'
    )
    assert kafka_system_properties(settings) == {}
    header, claims, signature = oauth.token(settings, timeout=1).split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "none"} and signature == ""
    decoded = json.loads(base64.urlsafe_b64decode(claims + "=="))
    assert decoded["sub"] == "alice" and decoded["scope"] == ["a", "b"] and decoded["exp"] - decoded["iat"] == 60


def test_queueplanes_own_requests_send_the_token_and_extensions_as_rfc_7628_says():
    assert speaks(OIDC)
    assert (
        oauth.initial_response(OIDC, "T0K")
        == b"n,,\x01auth=Bearer T0K\x01logicalCluster=lkc-1\x01identityPoolId=pool-2\x01\x01"
    )


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"sasl.oauthbearer.method": "oidc"}, r"sasl\.oauthbearer\.token\.endpoint\.url"),
        ({"sasl.oauthbearer.config": "scope=a"}, r"principal=NAME"),
        ({**OIDC, "sasl.oauthbearer.extensions": "novalue"}, r"sasl\.oauthbearer\.extensions"),
    ],
)
def test_incomplete_settings_name_the_setting_and_never_its_value(settings, needle):
    with pytest.raises(UsageError, match=needle) as raised:
        java_client_settings({"sasl.mechanism": "OAUTHBEARER", **settings})
    assert "cret" not in str(raised.value)


def test_a_malformed_config_line_is_named_by_its_number_and_never_shown(tmp_path):
    """A PEM key pasted over several lines must not reach the terminal through the error."""
    config = tmp_path / "client.properties"
    config.write_text("bootstrap.servers=k:9093\nssl.key.pem=-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0\n")
    with pytest.raises(UsageError) as raised:
        read_kafka_config(str(config))
    assert f"{config}:3: expected key=value" in str(raised.value) and "MIIE" not in str(raised.value)
