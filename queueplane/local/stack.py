"""The embedded local stack: one real Apache Kafka broker on 127.0.0.1.

Jars come from Maven Central with Maven (cached under the user cache, so a fresh
machine fetches them once); state and logs live under ``.queueplane/local/`` of the
working directory, so each checkout has its own broker. The pytest fixture and the
CLI both use this module, so the broker the tests run against is the one users get.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from queueplane.errors import LocalStackError
from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.oauth import ALLOWED_URLS_PROPERTY
from queueplane.kafka.protocol import api_versions
from queueplane.local.kubernetes.host import node_address_present
from queueplane.local.kubernetes.layout import NODE_IP
from queueplane.local.maven import COMPLETE, copy_dependencies
from queueplane.local.processes import HOST, free_port, free_ports, pid_alive, port_open, terminate
from queueplane.local.tls import broker_tls
from queueplane.paths import cache_dir, home_dir

# Newest Kafka 4.x whose full dependency set Maven Central serves (4.4.0's kafka_2.13
# depends on a kafka-tools-api 4.4.0 that is not published there).
KAFKA_VERSION = "4.3.1"
READY_TIMEOUT_S = 60.0
# The broker's JIT and collector options (G1 unless set), read from the environment as Kafka's
# own start script reads KAFKA_JVM_PERFORMANCE_OPTS: a test suite that starts and stops brokers
# for minutes at a time can trade peak speed for less compiling.
BROKER_JVM_OPTS = "KAFKA_JVM_PERFORMANCE_OPTS"
POM = Path(__file__).with_name("kafka-pom.xml")
# The SCRAM user of a secure local broker that is a super user (its password: tls/admin-password).
ADMIN_USER = "admin"

# Kafka tools reachable through `queueplane local kafka TOOL`, named as in Kafka's bin/.
KAFKA_TOOLS = {
    "topics": "org.apache.kafka.tools.TopicCommand",
    "configs": "kafka.admin.ConfigCommand",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "groups": "org.apache.kafka.tools.GroupsCommand",
    "features": "org.apache.kafka.tools.FeatureCommand",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
}

# Broker settings for a one-node development cluster. Share-group lower bounds are relaxed so
# tests can use short locks, and the consumer-protocol session's (45 s by default) so a consumer
# queue's group gets the 10 s session plan asks for, as production brokers that allow it do;
# everything else is Kafka's default.
LOCAL_BROKER_SETTINGS = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "8",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "8",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    kn.BROKER_DEFAULT_REPLICATION: "1",
    kn.BROKER_SHARE_LOCK_MIN: "1000",
    # Share members learn their assignment on a heartbeat: 1s instead of 5s gets workers going sooner.
    "group.share.min.heartbeat.interval.ms": "1000",
    "group.share.heartbeat.interval.ms": "1000",
    kn.BROKER_SHARE_DELIVERY_MIN: "2",
    kn.BROKER_CONSUMER_SESSION_MIN: str(kn.MEMBER_SESSION_TIMEOUT_MS),
    kn.BROKER_CONSUMER_HEARTBEAT_MIN: str(kn.MEMBER_HEARTBEAT_INTERVAL_MS),
}


def jars_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_dir() / f"kafka-{version}" / "libs"


@dataclass
class StackState:
    """What `up` recorded: enough for `status`, `down` and clients to find the broker."""

    pid: int
    port: int
    controller_port: int
    version: str
    directory: str
    started_at: float
    # A listener for Kubernetes pods (their 127.0.0.1 is their own), on the local cluster's node
    # address unless `up` was given another (``pod_host``).
    pod_port: int | None = None
    # The SASL_SSL listener (SCRAM-SHA-512 over TLS), when the broker was started secure.
    secure_port: int | None = None
    # The TLS listener that requires a client certificate (mTLS), beside it.
    mtls_port: int | None = None
    # The address the pod listener is on; None (state written before it was recorded): the node address.
    pod_host: str | None = None

    @property
    def secure_bootstrap(self) -> str | None:
        return f"{HOST}:{self.secure_port}" if self.secure_port else None

    @property
    def mtls_bootstrap(self) -> str | None:
        return f"{HOST}:{self.mtls_port}" if self.mtls_port else None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pod_bootstrap(self) -> str | None:
        """bootstrap.servers for Kubernetes pods, when the broker listens for them."""
        return f"{self.pod_host or NODE_IP}:{self.pod_port}" if self.pod_port else None


@dataclass
class LocalStack:
    """One local broker rooted at ``directory`` (default ``.queueplane/local``)."""

    directory: Path
    version: str = KAFKA_VERSION
    share_version: int = 1  # feature level formatted into the cluster; < 1 leaves share groups off
    # A port a fault proxy listens on (tests): the broker gets a listener of its own (PROXIED,
    # ``proxied_listener_port``) that advertises this port, so clients that bootstrap at the proxy
    # are sent back to it for every connection and all their traffic passes through it.
    proxied_at: int | None = None
    # A SASL_SSL listener beside PLAINTEXT, and the StandardAuthorizer: ACLs apply to SCRAM
    # users there; the PLAINTEXT and controller listeners' anonymous principal is a super user.
    secure: bool = False

    @classmethod
    def default(cls) -> LocalStack:
        return cls(home_dir() / "local")

    # -- files ---------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.directory / "stack.json"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_file(self) -> Path:
        return self.directory / "logs" / "server.log"

    @property
    def properties_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def ports_file(self) -> Path:
        return self.directory / "ports.json"

    def read_state(self) -> StackState | None:
        try:
            return StackState(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise up/down of one directory (two terminals, or pytest-xdist workers)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- jars ----------------------------------------------------------------------------------
    def fetch(self, say: Callable[[str], None] = lambda _m: None) -> Path:
        """Resolve the pinned Kafka jars with Maven into the cache, once."""
        target = jars_dir(self.version)
        if not (target / COMPLETE).is_file():
            say(f"fetching Apache Kafka {self.version} jars from Maven Central")
        return copy_dependencies(
            POM, target, {"kafka.version": self.version}, f"Apache Kafka {self.version}", LocalStackError
        )

    def _java(self) -> str:
        java = shutil.which("java")
        if not java:
            raise LocalStackError("Java is not on PATH; Kafka 4 needs Java 17 or newer.")
        return java

    def _classpath(self) -> str:
        return str(jars_dir(self.version) / "*")

    def tool_command(self, tool: str, args: list[str]) -> list[str]:
        """A Kafka CLI tool (topics, consumer-groups, ...) against this broker, as a command line."""
        if tool not in KAFKA_TOOLS:
            raise LocalStackError(f"unknown Kafka tool {tool!r}; known: {', '.join(sorted(KAFKA_TOOLS))}")
        state = self.running_state()
        if state is None:
            raise LocalStackError("the local stack is not running; start it with `queueplane local up`")
        self.fetch()
        return [
            self._java(),
            "-Xmx512m",
            f"-Dlog4j2.configurationFile={self._log4j_file(tools=True)}",
            "-cp",
            self._classpath(),
            KAFKA_TOOLS[tool],
            "--bootstrap-server",
            state.bootstrap,
            *args,
        ]

    # -- lifecycle -----------------------------------------------------------------------------
    def running_state(self) -> StackState | None:
        """The recorded state if its process is alive and is our broker, else None."""
        state = self.read_state()
        if state is None or not _is_our_broker(state.pid, self.properties_file):
            return None
        return state

    def up(
        self, say: Callable[[str], None] = lambda _m: None, pods: bool | None = None, pod_host: str | None = None
    ) -> StackState:
        """Start the broker unless it already runs; return once it serves requests.

        ``pods`` asks for the listener Kubernetes pods reach the broker at (True) or for none
        (False): a running broker without it is restarted, on the same data and ports. None
        leaves a running broker as it is, so ``local up`` never restarts one that clients use,
        and a broker it starts listens for pods when the local cluster's bridge exists.
        ``pod_host`` is the address of this machine that pods reach, where that listener binds
        and which it advertises: the local cluster's node address unless another cluster's pods
        come in elsewhere (a kind network's gateway, say); a listener on another one is moved.
        """
        with self._lock():
            state = self.running_state()
            if pods is None:
                pods = state.pod_port is not None if state is not None else node_address_present()
                pod_host = pod_host or (state.pod_host if state is not None else None)
            pod_host = (pod_host or NODE_IP) if pods else None
            running_pod_host = (state.pod_host or NODE_IP) if state is not None and state.pod_port else None
            # A restart (for the pod listener) keeps a SASL_SSL listener that clients use.
            secure = self.secure or (state is not None and state.secure_port is not None)
            if state is not None and port_open(HOST, state.port):
                if pod_host == running_pod_host and secure == (state.secure_port is not None):
                    say("already running")
                    return state
                if pod_host == running_pod_host:
                    say("restarting to add the SASL_SSL listener")
                elif pod_host and running_pod_host:
                    say(f"restarting to move the listener for Kubernetes pods to {pod_host}")
                else:
                    say("restarting to " + ("add" if pods else "drop") + " the listener for Kubernetes pods")
                terminate(state.pid)
            self.fetch(say)
            port, controller_port = self._ports()
            taken = {port, controller_port}
            pod_port = self._kept_port("pod-port.json", pod_host, taken) if pod_host else None
            secure_port = self._kept_port("secure-port.json", HOST, taken) if secure else None
            mtls_port = self._kept_port("mtls-port.json", HOST, taken) if secure else None
            self._write_configs(port, controller_port, pod_port, secure_port, mtls_port, pod_host)
            if not (self.data_dir / "meta.properties").is_file():
                say("formatting KRaft storage")
                self._format()
            say(f"starting Kafka {self.version} on {HOST}:{port}")
            pid = self._start()
            state = StackState(
                pid,
                port,
                controller_port,
                self.version,
                str(self.directory),
                time.time(),
                pod_port,
                secure_port,
                mtls_port,
                pod_host,
            )
            self.state_file.write_text(json.dumps(asdict(state), indent=2))
            self._wait_ready(state, say)
            if secure_port is not None:
                self.add_user(ADMIN_USER, self._admin_password())
                oauth = ", OAUTHBEARER" if self.oauth_jwks.is_file() else ""
                say(f"SASL_SSL (SCRAM-SHA-512{oauth}) on {state.secure_bootstrap}, CA {self.tls_dir / 'ca.pem'}")
                say(f"SSL with client certificates (mTLS) on {state.mtls_bootstrap}")
            return state

    def down(self, purge: bool = False) -> bool:
        """Stop our broker by its recorded pid; True if one was running."""
        with self._lock():
            state = self.read_state()
            was_running = False
            if state is not None and _is_our_broker(state.pid, self.properties_file):
                was_running = True
                terminate(state.pid)
            self.state_file.unlink(missing_ok=True)
            if purge:
                files = (
                    "server.properties",
                    "log4j2.yaml",
                    "tools-log4j2.yaml",
                    "ports.json",
                    "pod-port.json",
                    "secure-port.json",
                    "mtls-port.json",
                )
                for child in ("data", "logs", "tls", *files):
                    path = self.directory / child
                    if path.is_dir():
                        shutil.rmtree(path)
                    else:
                        path.unlink(missing_ok=True)
            return was_running

    def status(self) -> dict[str, object]:
        state = self.running_state()
        if state is None:
            return {"running": False, "directory": str(self.directory), "version": self.version}
        pods = {"bootstrap.servers for pods": state.pod_bootstrap} if state.pod_bootstrap else {}
        secure = {"bootstrap.servers (SASL_SSL)": state.secure_bootstrap} if state.secure_bootstrap else {}
        if state.mtls_bootstrap:
            secure["bootstrap.servers (mTLS)"] = state.mtls_bootstrap
        return {
            "running": True,
            "bootstrap.servers": state.bootstrap,
            **pods,
            **secure,
            "pid": state.pid,
            "version": state.version,
            "directory": str(self.directory),
            "log": str(self.log_file),
            "uptime_s": round(time.time() - state.started_at, 1),
        }

    # -- internals -----------------------------------------------------------------------------
    def _ports(self) -> tuple[int, int]:
        """Reuse the recorded ports so clients' bootstrap setting survives a restart."""
        if self.ports_file.is_file() and (self.data_dir / "meta.properties").is_file():
            port, controller_port = json.loads(self.ports_file.read_text())
            if not port_open(HOST, port) and not port_open(HOST, controller_port):
                return port, controller_port
            raise LocalStackError(
                f"port {port} or {controller_port} of the stopped local broker is taken by another "
                f"process; free it, or start afresh with `queueplane local down --purge`"
            )
        port, controller_port = free_ports(HOST, 2)
        ports = port, controller_port
        self.ports_file.write_text(json.dumps(ports))
        return ports

    def proxied_listener_port(self) -> int:
        """The port of the listener behind the fault proxy (``proxied_at``), kept across restarts."""
        path = self.directory / "proxied-port.json"
        if path.is_file():
            return int(json.loads(path.read_text()))
        port = free_port(HOST)
        self.directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(port))
        return port

    def _kept_port(self, name: str, host: str, taken: set[int]) -> int:
        """A listener's port, recorded in ``name`` and kept across restarts while it is free;
        added to ``taken``, the ports of the broker's other listeners, which it differs from."""
        path = self.directory / name
        port = int(json.loads(path.read_text())) if path.is_file() else None
        if port is None or port in taken or port_open(host, port):
            port = free_port(host, avoid=taken)
            path.write_text(json.dumps(port))
        taken.add(port)
        return port

    # -- the SASL_SSL listener -----------------------------------------------------------------
    @property
    def tls_dir(self) -> Path:
        return self.directory / "tls"

    @property
    def oauth_jwks(self) -> Path:
        """The keys (a JWKS file) whose OAUTHBEARER tokens the SASL_SSL listener accepts: when the
        file is there as the broker starts, it takes OAUTHBEARER beside SCRAM (the principal is
        the token's ``sub``). Put your identity provider's keys, or a test issuer's, there."""
        return self.tls_dir / "oauth-jwks.json"

    def mtls_settings(self, certificate: Path, key: Path) -> dict[str, str]:
        """librdkafka settings for the mTLS listener with a client certificate the local CA signed
        and its key (PEM files; the principal is the certificate's CN)."""
        return {
            **self._secured_listener("mTLS", "SSL"),
            "ssl.certificate.location": str(certificate),
            "ssl.key.location": str(key),
        }

    def _secured_listener(self, listener: str, protocol: str) -> dict[str, str]:
        """Where a secured listener (SASL_SSL or mTLS) of the running broker is, and the CA it uses."""
        state = self.running_state()
        bootstrap = (
            None if state is None else state.secure_bootstrap if protocol == "SASL_SSL" else state.mtls_bootstrap
        )
        if bootstrap is None:
            raise LocalStackError(f"the local broker runs without its {listener} listener; start it with --secure")
        return {
            "bootstrap.servers": bootstrap,
            "security.protocol": protocol,
            "ssl.ca.location": str(self.tls_dir / "ca.pem"),
        }

    def _admin_password(self) -> str:
        path = self.tls_dir / "admin-password"
        if not path.is_file():
            self.tls_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(18))
            path.chmod(0o600)
        return path.read_text().strip()

    def add_user(self, name: str, password: str) -> None:
        """A SCRAM-SHA-512 user on the running broker, set through its PLAINTEXT listener."""
        state = self.running_state()
        if state is None:
            raise LocalStackError("the local broker is not running")
        admin = clients.admin({"bootstrap.servers": state.bootstrap})
        credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        upsert = UserScramCredentialUpsertion(name, credential, password.encode())
        admin.alter_user_scram_credentials([upsert])[name].result(30)

    def secure_settings(self, user: str = ADMIN_USER, password: str | None = None) -> dict[str, str]:
        """librdkafka settings for the SASL_SSL listener as ``user`` (default: the super user)."""
        return {
            **self._secured_listener("SASL_SSL", "SASL_SSL"),
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": password if password is not None else self._admin_password(),
        }

    def _log4j_file(self, tools: bool = False) -> Path:
        path = self.directory / ("tools-log4j2.yaml" if tools else "log4j2.yaml")
        if tools:
            body = (
                "Configuration:\n  Appenders:\n    Console: {name: E, target: SYSTEM_ERR, "
                "PatternLayout: {pattern: '%p %m%n'}}\n  Loggers:\n    Root: {level: WARN, "
                "AppenderRef: [{ref: E}]}\n"
            )
        else:
            body = (
                "Configuration:\n  Appenders:\n    RollingFile:\n      name: F\n"
                f"      fileName: {self.log_file}\n      filePattern: {self.log_file}.%i\n"
                "      PatternLayout: {pattern: '[%d] %p %m (%c)%n'}\n"
                "      Policies: {SizeBasedTriggeringPolicy: {size: 50MB}}\n"
                "      DefaultRolloverStrategy: {max: 3}\n"
                "  Loggers:\n    Root: {level: INFO, AppenderRef: [{ref: F}]}\n"
                "    Logger:\n      - {name: kafka.request.logger, level: WARN}\n"
                "      - {name: org.apache.kafka.controller, level: WARN}\n"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        return path

    def _write_configs(
        self,
        port: int,
        controller_port: int,
        pod_port: int | None = None,
        secure_port: int | None = None,
        mtls_port: int | None = None,
        pod_host: str | None = None,
    ) -> None:
        # Each listener advertises itself, so a client is sent back to the address it came in on.
        advertised = f"PLAINTEXT://{HOST}:{port}" + (f",PODS://{pod_host}:{pod_port}" if pod_host else "")
        advertised += f",SASL_SSL://{HOST}:{secure_port}" if secure_port else ""
        advertised += f",MTLS://{HOST}:{mtls_port}" if mtls_port else ""
        listeners = advertised
        if self.proxied_at is not None:
            listeners += f",PROXIED://{HOST}:{self.proxied_listener_port()}"
            advertised += f",PROXIED://{HOST}:{self.proxied_at}"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{controller_port}",
            "listeners": f"{listeners},CONTROLLER://{HOST}:{controller_port}",
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,PODS:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL"
            ),
            "log.dirs": str(self.data_dir),
            **LOCAL_BROKER_SETTINGS,
            **(self._secure_configs() if secure_port else {}),
        }
        self.properties_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log4j_file()

    def _secure_configs(self) -> dict[str, str]:
        keytool = str(Path(self._java()).resolve().with_name("keytool"))
        tls = broker_tls(self.tls_dir, keytool, HOST)
        oauth = {}
        if self.oauth_jwks.is_file():
            oauth = {
                "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config": (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
                ),
                "listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class": (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
                ),
                "sasl.oauthbearer.jwks.endpoint.url": self.oauth_jwks.resolve().as_uri(),
            }
        return {
            "sasl.enabled.mechanisms": "SCRAM-SHA-512" + (",OAUTHBEARER" if oauth else ""),
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            **oauth,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(tls.keystore),
            "ssl.keystore.password": tls.password,
            "ssl.key.password": tls.password,
            # The mTLS listener trusts client certificates the local CA signed (the keystore holds
            # the CA as a trusted entry); a certificate's CN is its principal.
            "listener.name.mtls.ssl.client.auth": "required",
            "listener.name.mtls.ssl.truststore.type": "PKCS12",
            "listener.name.mtls.ssl.truststore.location": str(tls.keystore),
            "listener.name.mtls.ssl.truststore.password": tls.password,
            "ssl.principal.mapping.rules": "RULE:^CN=(.*)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:ANONYMOUS;User:{ADMIN_USER}",
        }

    def _format(self) -> None:
        cmd = [
            self._java(),
            "-Xmx256m",
            f"-Dlog4j2.configurationFile={self._log4j_file(tools=True)}",
            "-cp",
            self._classpath(),
            "kafka.tools.StorageTool",
            "format",
            # One argument, "--cluster-id=ID": a URL-safe id may start with "-", which the
            # tool's argument parser would otherwise take for an option.
            f"--cluster-id={_cluster_id()}",
            "-c",
            str(self.properties_file),
            "--feature",
            f"{kn.SHARE_FEATURE}={self.share_version}",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise LocalStackError(f"formatting KRaft storage failed: {(done.stdout + done.stderr).strip()}")

    def _start(self) -> int:
        cmd = [
            self._java(),
            "-Xms256m",
            "-Xmx1g",
            *os.environ.get(BROKER_JVM_OPTS, "-XX:+UseG1GC").split(),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.yaml'}",
            # Kafka reads OAuth keys only from URLs the JVM allows.
            f"-D{ALLOWED_URLS_PROPERTY}={self.oauth_jwks.resolve().as_uri()}",
            f"-Dkafka.logs.dir={self.log_file.parent}",
            "-cp",
            self._classpath(),
            "kafka.Kafka",
            str(self.properties_file),
        ]
        out = open(self.log_file.parent / "stdout.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.directory,
        )
        out.close()
        return proc.pid

    def _wait_ready(self, state: StackState, say: Callable[[str], None]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if not pid_alive(state.pid):
                raise LocalStackError(
                    f"Kafka exited during start-up; see {self.log_file} and {self.log_file.parent / 'stdout.log'}"
                )
            try:
                versions = api_versions(HOST, state.port, timeout=2.0)
            except OSError as exc:
                last_error = str(exc)
                time.sleep(0.2)
                continue
            level = versions.finalized_features.get(kn.SHARE_FEATURE, 0)
            if level < 1:
                terminate(state.pid)
                raise LocalStackError(
                    f"the broker reports feature {kn.SHARE_FEATURE}={level}; share groups need >= 1. "
                    f"Start afresh with `queueplane local down --purge` then `queueplane local up`."
                )
            if _broker_registered(state):
                say(f"ready, {kn.SHARE_FEATURE}={level}")
                return
            time.sleep(0.2)
        terminate(state.pid)
        raise LocalStackError(
            f"Kafka did not become ready within {READY_TIMEOUT_S:.0f}s ({last_error}); see {self.log_file}"
        )


def _broker_registered(state: StackState) -> bool:
    """True once the broker answers metadata with itself as a live broker."""
    admin = clients.admin({"bootstrap.servers": state.bootstrap})
    try:
        metadata = admin.list_topics(timeout=2)
    except Exception:
        return False
    return bool(metadata.brokers)


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as kafka-storage prints)."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _is_our_broker(pid: int, properties: Path) -> bool:
    """The pid is alive and runs kafka.Kafka with our properties file (guards against pid reuse)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline and str(properties).encode() in cmdline
