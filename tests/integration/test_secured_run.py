"""The worker, lag and the dead-letter tools against the SASL_SSL listener, as least-privilege users.

The worker authenticates as the principal its spec declares and has only the ACLs apply gave
it; producers write as theirs; the platform's tools (lag, dlq) run as the super user.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from helpers import run_cli
from worker_support import cluster_flags, make_queue, order, produce, read_all, run_worker, start_worker

from queueplane.kafka import clients
from queueplane.kafka.connection import connect
from queueplane.kafka.refused import Refused
from queueplane.kafka.target import KafkaTarget

pytestmark = pytest.mark.kafka

COUNT = 200
POISON = {7, 70}


@pytest.mark.parametrize(
    ("group_type", "login"),
    [
        ("share", "scram"),
        ("consumer", "scram"),
        ("kmq", "scram"),
        ("share", "oauthbearer"),
        ("consumer", "oauthbearer"),
        ("share", "mtls"),
        ("consumer", "mtls"),
    ],
)
def test_a_worker_with_only_its_declared_acls_processes_its_queue_on_a_secured_listener(
    secure_kafka, tmp_path, cli_env, group_type, login
):
    """SCRAM over SASL_SSL, an OAuth client's tokens over SASL_SSL, or a client certificate
    (mTLS): every client of the worker (librdkafka, Spark's Java client, queueplane's own
    share-group requests) logs in the same way."""
    tag = uuid.uuid4().hex[:6]
    logins = {"scram": secure_kafka.user, "oauthbearer": secure_kafka.oauth_user, "mtls": secure_kafka.certificate_user}
    worker, producer = logins[login](f"w{tag}"), secure_kafka.user(f"p{tag}")
    access = {"worker": f"User:w{tag}", "producers": [f"User:p{tag}"]}
    queue = make_queue(tmp_path, secure_kafka.admin, group_type=group_type, lock="3s", access=access)
    produce(producer, queue.topic, [order(i, mode="reject" if i in POISON else "ok") for i in range(COUNT)])

    admin = cluster_flags(secure_kafka.admin, queue.folder)
    lag = run_cli(["lag", str(queue.spec_path), *admin, "-o", "json"], cli_env)
    assert lag.returncode == 0, lag.stderr
    assert json.loads(lag.stdout)["total"] == COUNT, lag.stdout

    summary = run_worker(queue, worker, "--until-idle", "4s")
    assert (summary["counts"]["accepted"], summary["counts"]["dlq"]) == (COUNT - len(POISON), len(POISON))
    assert summary["kafka_client_errors"] == {}, summary["kafka_client_errors"]
    if login == "oauthbearer":
        assert f"w{tag}" in secure_kafka.issuer.issued, "the worker's clients asked the token endpoint"
    assert summary["lag_at_exit"] == 0, "the backlog was read as the worker's principal"
    assert len(read_all(secure_kafka.admin, queue.output, expect_at_least=COUNT - len(POISON))) >= COUNT - len(POISON)

    lag = run_cli(["lag", str(queue.spec_path), *admin, "-o", "json"], cli_env)
    assert json.loads(lag.stdout)["total"] == 0, lag.stdout
    listed = run_cli(["dlq", "list", str(queue.spec_path), *admin, "-o", "json"], cli_env)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["pending"] == len(POISON)
    redriven = run_cli(["dlq", "redrive", str(queue.spec_path), *admin, "-o", "json"], cli_env)
    assert redriven.returncode == 0, redriven.stderr
    assert json.loads(redriven.stdout)["moved"] == len(POISON)


def test_refused_credentials_and_missing_acls_are_one_line_within_seconds_naming_no_secret(
    secure_kafka, tmp_path, cli_env
):
    tag = uuid.uuid4().hex[:6]
    queue = make_queue(tmp_path, secure_kafka.admin, group_type="share")
    wrong = secure_kafka.stack.secure_settings("admin", f"not-the-password-{tag}")
    nobody = secure_kafka.user(f"nobody{tag}")
    cases = [
        ("refused credentials", KafkaTarget(wrong, wrong["bootstrap.servers"]), "refused the credentials"),
        ("no ACL at all", nobody, "CLUSTER_AUTHORIZATION_FAILED"),
    ]
    for what, target, said in cases:
        flags = cluster_flags(target, queue.folder)
        for command, extra in ((["run"], ["--until-idle", "5s"]), (["lag"], []), (["dlq", "list"], []), (["plan"], [])):
            started = time.monotonic()
            result = run_cli([*command, str(queue.spec_path), *extra, *flags], cli_env, timeout=60)
            took = time.monotonic() - started
            assert result.returncode == 1, (what, command, result.stderr)
            (line,) = result.stderr.strip().splitlines()
            assert said in line and "internal error" not in line, (what, command, line)
            assert took < 10, (what, command, took)
            assert target.settings["sasl.password"] not in result.stdout + result.stderr


@pytest.mark.parametrize("group_type", ["share", "consumer"])
def test_a_worker_that_loses_its_acls_mid_run_stops_with_one_line_instead_of_idling(secure_kafka, tmp_path, group_type):
    """An operator revokes the worker's ACLs while it runs: its next backlog read is refused, and
    it stops with the refusal (on Kubernetes: not ready, then the pod restarts and is refused at
    start, in the open), instead of running on with nothing to read."""
    tag = uuid.uuid4().hex[:6]
    worker, producer = secure_kafka.user(f"w{tag}"), secure_kafka.user(f"p{tag}")
    access = {"worker": f"User:w{tag}", "producers": [f"User:p{tag}"]}
    queue = make_queue(tmp_path, secure_kafka.admin, group_type=group_type, lock="3s", access=access)
    produce(producer, queue.topic, [order(i) for i in range(50)])
    log = queue.folder / "worker.log"
    running = start_worker(queue, worker, "--until-idle", "120s", log=log)
    deadline = time.monotonic() + 120
    while sum(1 for e in queue.events() if e.get("result") == "ok") < 50:
        assert running.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)

    admin = clients.admin(secure_kafka.admin)
    everything = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, f"User:w{tag}", None, AclOperation.ANY, AclPermissionType.ANY
    )
    assert admin.delete_acls([everything])[everything].result(), "the worker had ACLs"
    revoked = time.monotonic()
    code = running.wait(60)
    took = time.monotonic() - revoked
    assert code == 1, log.read_text()[-3000:]
    errors = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "AUTHORIZATION_FAILED" in errors[0] and "spec.access.worker" in errors[0], errors
    assert "Traceback" not in log.read_text()
    assert took < 15, took


def test_queueplanes_own_requests_are_refused_in_kafkas_words_for_a_mechanism_or_password_the_listener_refuses(
    secure_kafka,
):
    """The lag and backlog reads speak Kafka's protocol themselves: a refusal there is a Refused
    (the worker stops on it in one line), not a broker that does not answer."""
    settings = secure_kafka.stack.secure_settings()
    host, port = settings["bootstrap.servers"].rsplit(":", 1)
    cases = [
        ({"sasl.mechanism": "SCRAM-SHA-256"}, "UNSUPPORTED_SASL_MECHANISM"),
        ({"sasl.password": "not-the-password"}, "SASL_AUTHENTICATION_FAILED"),
    ]
    for change, what in cases:
        with pytest.raises(Refused) as refused:
            connect(host, int(port), {**settings, **change}, timeout=10).close()
        assert refused.value.what == what, change
