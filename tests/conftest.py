"""Shared fixtures: the real local Kafka broker, started once per test session.

The broker lives in a temporary QUEUEPLANE_HOME so the tests never touch a developer's
own `queueplane local up` broker, and it is started by the same code users run.

`make test` runs the suite in parallel processes (tests/parallel.py says how it is split).
Most tests wait on brokers, Spark and pods rather than compute, so the processes overlap
their waits on a small machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import parallel
import pytest
import timeline
import worker_support
from security_support import OAuthIssuer, client_certificate

from queueplane.kafka.target import KafkaTarget
from queueplane.local import spark_archive
from queueplane.local.stack import BROKER_JVM_OPTS, LocalStack, StackState

# The Spark drivers and Kafka brokers the tests start compile with C1 only and collect with the
# serial collector. They live seconds to minutes: on two cores, C2's and G1's threads take about
# a third of a short worker run's CPU, and half a broker's under a 200k-record produce, consume
# and share-consume (docs/benchmarks.md), from the test beside them. What they do is the same;
# bench/, `queueplane local up` and deployed workers keep the JVM's defaults. The drivers also
# map the classes Spark loads from the archive the set-up recorded (queueplane.local.spark_archive).
TEST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SPARK_SUBMIT_OPTS", f"{TEST_JVM} {spark_archive.java_options()}".strip())
    os.environ.setdefault(BROKER_JVM_OPTS, TEST_JVM)
    parallel.run_started(config)
    parallel.process_started()


def pytest_unconfigure(config: pytest.Config) -> None:
    parallel.process_ending()
    parallel.run_ended(config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    timeline.record(report)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Each phase's report carries its process's CPU time meanwhile, for the timeline (xdist
    sends a report's extra attributes to the controller)."""
    report = yield
    cpu_s = parallel.phase_cpu_seconds()
    if cpu_s is not None:
        report.cpu_s = round(cpu_s, 2)
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    parallel.mark_check(items)
    parallel.in_run_order(items)
    parallel.note_kinds(items)


@pytest.fixture(autouse=True)
def _heavy_tests_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test under the run's lock; the timeline learns how long it waited for it, and when it got it."""
    asked = time.monotonic()
    with parallel.heavy_tests_alone(request.node):
        waited_s = time.monotonic() - asked
        request.node.user_properties.append(("run_lock", {"at": time.time(), "waited_s": waited_s}))
        if waited_s > 1:
            parallel.timeout_from_now(request.node)
        yield


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    yield
    worker_support.stop_started_workers()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`make test`'s split (``--dist loadfile``): shared folders go to one process whole."""
    if config.getvalue("dist") != "loadfile":
        return None
    return parallel.SharedFolderScheduling(config, log)


@pytest.fixture(scope="session")
def queueplane_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("queueplane-home")


@pytest.fixture(scope="session")
def oauth_issuer() -> Iterator[OAuthIssuer]:
    issuer = OAuthIssuer().start()
    yield issuer
    issuer.stop()


@pytest.fixture(scope="session")
def local_stack(queueplane_home: Path, oauth_issuer: OAuthIssuer) -> Iterator[LocalStack]:
    """The session's broker: PLAINTEXT for most tests; SASL_SSL (SCRAM, and OAUTHBEARER tokens of
    the session's issuer) and mTLS with the authorizer for the secured ones."""
    stack = LocalStack(queueplane_home / "local", secure=True)
    oauth_issuer.write_jwks(stack.oauth_jwks)  # read as the broker starts
    stack.up()
    yield stack
    stack.down(purge=True)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, KafkaTarget]]:
    """A broker for one module's tests to stop and start (same data directory, same ports), so
    the session's shared broker stays up for every other test."""
    stack = LocalStack(tmp_path_factory.mktemp("own-broker") / "local")
    state = stack.up()
    yield stack, KafkaTarget({"bootstrap.servers": state.bootstrap}, state.bootstrap)
    stack.down(purge=True)


@pytest.fixture(scope="session")
def local_kafka(local_stack: LocalStack) -> StackState:
    state = local_stack.running_state()
    assert state is not None
    return state


@pytest.fixture(scope="session")
def kafka(local_kafka: StackState) -> KafkaTarget:
    return KafkaTarget({"bootstrap.servers": local_kafka.bootstrap}, local_kafka.bootstrap)


@dataclass
class SecureKafka:
    """The session broker's SASL_SSL listener: its super user's target, and users made on demand."""

    stack: LocalStack
    admin: KafkaTarget
    issuer: OAuthIssuer

    def user(self, name: str) -> KafkaTarget:
        """A new SCRAM user (no ACLs yet) and its client settings."""
        password = f"pw-{name}"
        self.stack.add_user(name, password)
        settings = self.stack.secure_settings(name, password)
        return KafkaTarget(settings, settings["bootstrap.servers"])

    def oauth_user(self, name: str) -> KafkaTarget:
        """A new OAuth client of the session's issuer (principal ``User:<name>``), over SASL_SSL."""
        secret = self.issuer.client(name)
        settings = {
            **{k: v for k, v in self.stack.secure_settings().items() if not k.startswith("sasl.")},
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": name,
            "sasl.oauthbearer.client.secret": secret,
            "sasl.oauthbearer.token.endpoint.url": self.issuer.token_url,
        }
        return KafkaTarget(settings, settings["bootstrap.servers"])

    def certificate_user(self, name: str) -> KafkaTarget:
        """A client certificate with CN=``name`` (principal ``User:<name>``), over the mTLS listener."""
        certificate, key = client_certificate(self.stack.tls_dir, name)
        folder = self.stack.tls_dir / "clients"
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.pem").write_text(certificate)
        (folder / f"{name}.key").touch(mode=0o600)
        (folder / f"{name}.key").write_text(key)
        settings = self.stack.mtls_settings(folder / f"{name}.pem", folder / f"{name}.key")
        return KafkaTarget(settings, settings["bootstrap.servers"])


@pytest.fixture(scope="session")
def secure_kafka(local_stack: LocalStack, oauth_issuer: OAuthIssuer) -> SecureKafka:
    settings = local_stack.secure_settings()
    return SecureKafka(local_stack, KafkaTarget(settings, settings["bootstrap.servers"]), oauth_issuer)


@pytest.fixture
def cli_env(queueplane_home: Path) -> dict[str, str]:
    """Environment for running the CLI as a user would, pointed at the test session's local stack."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUEPLANE_")}
    env["QUEUEPLANE_HOME"] = str(queueplane_home)
    return env
