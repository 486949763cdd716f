"""The embedded Apache Kafka broker for the demo, the tests and the benchmarks.

Apache Kafka 4.x in KRaft mode: one JVM that is both the controller and the broker. Its jars come from Maven Central
through the project's own files (``jvm/kafka/pom.xml``, copied into ``.data/kafka/libs`` by ``make kafka``, which
``make setup`` runs). It listens on 127.0.0.1 only, on a free port unless one is given. Its log directories are on
disk: a test's broker removes them when it stops; ``tidewater broker start`` keeps the demo's in
``$TIDEWATER_HOME/kafka-<port>`` so that a restart keeps the topics. Production pipelines point at the platform's
Kafka cluster instead.

``start_cluster(3)`` starts three such nodes (each a controller and a broker; replication factor 3,
``min.insync.replicas`` 2) for the broker-fault tests: a node can be killed and started again on its own log.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tidewater.config.locations import home_dir
from tidewater.errors import ConfigError, TransientError
from tidewater_dev.process import LocalServer, wait_listening

log = logging.getLogger(__name__)

CHECKOUT = Path(__file__).resolve().parents[2]
JVM_DIR = CHECKOUT / "jvm" / "kafka"  # the pom and the broker's log4j2 configuration
HEAP = ("-Xms256m", "-Xmx1g")  # Kafka's own scripts start with 1 GB; the page cache holds the data, not the heap
# kafka-run-class.sh's JVM options for the broker, less the GC log
JVM_OPTS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
READY_SECONDS = 60  # a JVM start, a KRaft election and the broker's registration; ~5 s on two cores


def kafka_libs() -> Path:
    """The broker's classpath folder: ``$TIDEWATER_KAFKA_LIBS``, else the checkout's ``.data/kafka/libs``."""
    where = os.environ.get("TIDEWATER_KAFKA_LIBS")
    libs = Path(where) if where else CHECKOUT / ".data" / "kafka" / "libs"
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise ConfigError(
            f"Apache Kafka's jars are not in {libs}: run `make kafka` (make setup runs it), or set "
            "TIDEWATER_KAFKA_LIBS to a folder holding Kafka's libs"
        )
    return libs


def kafka_version(libs: Path | None = None) -> str:
    """The Apache Kafka release of the embedded broker (from its jar's name, e.g. ``4.4.0``)."""
    jar = next((libs or kafka_libs()).glob("kafka_2.13-*.jar"))
    return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")


def java() -> str:
    """The ``java`` of ``$JAVA_HOME``, else the PATH's."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").is_file() else shutil.which("java")
    if not found:
        raise ConfigError("the embedded broker needs Java 17 or later (make setup installs it): set JAVA_HOME")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` (a socket in TIME_WAIT does not count: the broker can bind over it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def node_properties(
    node_id: int, port: int, controller_port: int, voters: str, data_dir: Path, replication: int, host: str = "127.0.0.1"
) -> dict[str, str]:
    """One KRaft node's ``server.properties`` (controller and broker in one process, plaintext on ``host``: 127.0.0.1,
    or the address of a bridge that test hosts in network namespaces reach, tidewater_dev.hosts).
    ``voters``: the static quorum (``id@host:port,...``); ``replication``: the internal topics' and new topics'
    replication factor (``min.insync.replicas`` is 2 when it is 3 or more)."""
    isr = str(min(replication, 2))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": str(replication),
        "min.insync.replicas": isr,
        # the internal topics: Kafka's 50 partitions each are a production default; a few suit one machine
        "offsets.topic.replication.factor": str(replication),
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.replication.factor": str(replication),
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "5",
        "share.coordinator.state.topic.replication.factor": str(replication),
        "share.coordinator.state.topic.min.isr": isr,
        "group.initial.rebalance.delay.ms": "0",  # a consumer group's first join without Kafka's 3 s wait
        # records up to 10 MB (Kafka's default is 1 MB): the tests' bad-input corpus has a 4 MB value; a platform
        # raises a topic's max.message.bytes for such data (docs/reference/kafka.md)
        "message.max.bytes": "10485760",
    }


@dataclass
class Broker(LocalServer):
    """One Kafka node this project started: its process, client port and log; its configuration and log
    directories, to start it again after a kill (``restart``)."""

    config: str = ""  # its server.properties
    data_dir: str = ""  # its log directories (``log.dirs``)
    ephemeral: bool = False  # remove ``data_dir`` when it stops
    node_id: int = 1
    host: str = "127.0.0.1"  # the address it listens on and advertises

    grace: ClassVar[float] = 15.0  # a controlled shutdown moves leadership away first

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def kill(self) -> None:
        """SIGKILL, as a crashed host: no controlled shutdown, nothing flushed; its log directories stay for
        ``restart``."""
        LocalServer.stop(self, grace=0)

    def shutdown(self) -> None:
        """SIGTERM, as an operator's rolling restart: a controlled shutdown, which moves this node's partition
        leaderships to other replicas before it exits; its log directories stay for ``restart``."""
        LocalServer.stop(self)

    def restart(self, detach: bool = False) -> None:
        """Start this node again on its configuration and log directories (after ``kill`` or ``stop``)."""
        self.pid = _launch(Path(self.config), Path(self.log_path), detach)

    def stop(self, grace: float | None = None) -> None:
        super().stop(grace)
        if self.ephemeral and self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


@dataclass
class Cluster:
    """Several KRaft nodes that form one cluster (``start_cluster``)."""

    nodes: list[Broker] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> Broker:
        return next(n for n in self.nodes if n.node_id == node_id)

    def stop(self) -> None:
        for n in self.nodes:  # a node that loses its quorum cannot shut down in a controlled way: short grace
            n.stop(grace=5)


def _launch(config: Path, log_path: Path, detach: bool) -> int:
    libs = kafka_libs()
    cmd = [
        java(),
        *HEAP,
        *JVM_OPTS,
        f"-Dlog4j2.configurationFile={JVM_DIR / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
        "kafka.Kafka",
        str(config),
    ]
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=detach)
    return proc.pid


def _format(config: Path, cluster_id: str, log_path: Path) -> None:
    """``kafka-storage format``: new log directories get the cluster id and the metadata version (a formatted
    directory is never formatted again: Kafka refuses another cluster id for it)."""
    cmd = [
        java(),
        "-XX:TieredStopAtLevel=1",
        f"-Dlog4j2.configurationFile={JVM_DIR / 'log4j2.properties'}",
        "-cp",
        f"{kafka_libs()}/*",
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(config),
    ]
    with open(log_path, "ab") as logf:
        done = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, timeout=120, check=False)
    if done.returncode != 0:
        raise ConfigError(f"formatting the embedded broker's log directories failed; see {log_path}")


def _cluster_id() -> str:
    """A new KRaft cluster id (a random UUID in Kafka's base64 form, as `kafka-storage random-uuid` prints). Like
    Kafka's ``Uuid.randomUuid``, never one that starts with ``-``: the format command would read it as an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cid.startswith("-"):
            return cid


def _write_properties(path: Path, props: dict[str, str]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))


def wait_ready(bootstrap: str, brokers: int, timeout: float, nodes: list[Broker]) -> None:
    """Until the cluster's metadata lists ``brokers`` brokers (a node that listens may not be registered yet);
    TransientError naming the logs when it does not in ``timeout`` seconds or a node's process ended."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(wait_listening(n.port, 0.5, n.host) for n in nodes):
        if any(not n.alive() for n in nodes):
            break
    quiet = logging.getLogger(f"{__name__}.admin")  # librdkafka's connection errors while the nodes come up
    quiet.setLevel(logging.CRITICAL)
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 2000}, logger=quiet)
    while time.monotonic() < deadline:
        if any(not n.alive() for n in nodes):
            break
        try:
            if len(admin.list_topics(timeout=2).brokers) >= brokers:
                return
        except KafkaException:
            pass
        time.sleep(0.2)
    logs = ", ".join(n.log_path for n in nodes)
    raise TransientError(f"the embedded Kafka broker did not become ready on {bootstrap} in {timeout:.0f} s; see {logs}")


def start(
    port: int | None = None, log_path: Path | None = None, detach: bool = False, data_dir: Path | None = None, host: str = "127.0.0.1"
) -> Broker:
    """One Kafka node (controller and broker) on ``host``:``port`` (a free port when None), ready for clients.
    ``data_dir``: its log directories, kept when it stops (formatted on first use, restarted on the configuration
    written then); None: a temporary folder, removed when it stops. ``detach``: its own session, so that it outlives
    this process (the demo's broker)."""
    if port and not port_free(port):
        raise ConfigError(f"--port: 127.0.0.1:{port} is already in use by another process; choose another port")
    port = port or free_port()
    log_path = log_path or home_dir() / f"kafka-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ephemeral = data_dir is None
    data = Path(tempfile.mkdtemp(prefix=f"tidewater-kafka-{port}-")) if data_dir is None else data_dir
    data.mkdir(parents=True, exist_ok=True)
    config = data / "server.properties"  # beside the logs: a kept folder restarts on the configuration it was made with
    if not (data / "logs" / "meta.properties").is_file():  # a new folder: its configuration, then its cluster id
        controller = free_port()
        _write_properties(config, node_properties(1, port, controller, f"1@127.0.0.1:{controller}", data / "logs", 1, host))
        _format(config, _cluster_id(), log_path)
    broker = Broker(_launch(config, log_path, detach), port, str(log_path), str(config), str(data), ephemeral, host=host)
    try:
        wait_ready(broker.bootstrap, 1, READY_SECONDS, [broker])
    except TransientError:
        broker.stop(grace=0)
        raise
    log.info("embedded Kafka %s broker pid %d on %s", kafka_version(), broker.pid, broker.bootstrap)
    return broker


def start_cluster(size: int = 3, log_dir: Path | None = None) -> Cluster:
    """``size`` Kafka nodes, each a controller and a broker, forming one cluster on free 127.0.0.1 ports: topics
    are created with replication factor ``size`` (``min.insync.replicas`` 2). Each node's log directories are
    temporary, removed when it stops; ``Broker.kill`` and ``Broker.restart`` make a node fail and return."""
    log_dir = log_dir or Path(tempfile.gettempdir())
    ports = [(free_port(), free_port()) for _ in range(size)]
    voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
    cluster_id = _cluster_id()
    cluster = Cluster()
    for i, (port, controller) in enumerate(ports):
        data = Path(tempfile.mkdtemp(prefix=f"tidewater-kafka-node{i + 1}-"))
        config = data / "server.properties"
        _write_properties(config, node_properties(i + 1, port, controller, voters, data / "logs", size))
        log_path = log_dir / f"tidewater-kafka-node{i + 1}-{port}.log"
        _format(config, cluster_id, log_path)
        cluster.nodes.append(Broker(0, port, str(log_path), str(config), str(data), True, i + 1))
    for node in cluster.nodes:  # all at once: a quorum of three elects a leader only when two are up
        node.restart()
    try:
        wait_ready(cluster.bootstrap, size, READY_SECONDS * 2, cluster.nodes)
    except TransientError:
        cluster.stop()
        raise
    return cluster


@dataclass
class SecuredBroker(Broker):
    """A node with a SASL_SSL listener (``sasl_bootstrap``: SCRAM-SHA-512 over TLS, the certificate authority in
    ``ca_location``) and ACLs enforced, beside the plaintext listener of ``bootstrap`` on 127.0.0.1, whose anonymous
    principal is the super user: the tests' administrator (SCRAM users, ACLs, topics, producing)."""

    sasl_port: int = 0
    ca_location: str = ""

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    def client_settings(self, username: str, password: str) -> dict[str, str]:
        """librdkafka settings of a client of the SASL_SSL listener."""
        return {
            "bootstrap.servers": self.sasl_bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": username,
            "sasl.password": password,
            "ssl.ca.location": self.ca_location,
        }


def _self_signed(folder: Path) -> tuple[Path, str]:
    """A PKCS12 key store holding a new key and a self-signed certificate for 127.0.0.1 and localhost (keytool, the
    JDK's), and that certificate in PEM for the clients; returns (key store, its password). The password reaches
    keytool through its environment, never its command line."""
    password = secrets.token_hex(16)
    store, pem = folder / "broker.p12", folder / "ca.pem"
    env = {**os.environ, "TIDEWATER_STORE_PASS": password}
    keytool = str(Path(java()).parent / "keytool")
    common = ["-storepass:env", "TIDEWATER_STORE_PASS", "-keystore", str(store), "-storetype", "PKCS12", "-noprompt"]
    subprocess.run(
        [
            keytool,
            "-genkeypair",
            "-alias",
            "broker",
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-validity",
            "7",
            "-dname",
            "CN=localhost",
            "-ext",
            "SAN=IP:127.0.0.1,DNS:localhost",
            *common,
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [keytool, "-exportcert", "-rfc", "-alias", "broker", "-file", str(pem), *common],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return store, password


def start_secured(folder: Path) -> SecuredBroker:
    """One node (see ``SecuredBroker``) whose log directories, key store and log are in ``folder``: SASL_SSL with
    SCRAM-SHA-512, TLS from a self-signed certificate made here, Kafka's StandardAuthorizer with nothing allowed to a
    principal without an ACL. Users come from the admin API (``alter_user_scram_credentials``) on ``bootstrap``."""
    folder.mkdir(parents=True, exist_ok=True)
    store, store_password = _self_signed(folder)
    port, sasl_port, controller = free_port(), free_port(), free_port()
    props = node_properties(1, port, controller, f"1@127.0.0.1:{controller}", folder / "logs", 1)
    props.update(
        {
            "listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_port},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "ssl.keystore.location": str(store),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.password": store_password,
            "ssl.key.password": store_password,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",  # the plaintext listener on 127.0.0.1 and the controller's
            "allow.everyone.if.no.acl.found": "false",
        }
    )
    config = folder / "server.properties"
    _write_properties(config, props)
    config.chmod(0o600)  # it holds the key store's password
    log_path = folder / "broker.log"
    _format(config, _cluster_id(), log_path)
    broker = SecuredBroker(
        _launch(config, log_path, False),
        port,
        str(log_path),
        str(config),
        str(folder),
        False,
        sasl_port=sasl_port,
        ca_location=str(folder / "ca.pem"),
    )
    try:
        wait_ready(broker.bootstrap, 1, READY_SECONDS, [broker])
    except TransientError:
        broker.stop(grace=0)
        raise
    return broker


STATE_FILE = "broker.json"


def start_background(port: int) -> Broker:
    """Start (or reuse) the demo broker on ``port``, recording it in $TIDEWATER_HOME/broker.json; its log
    directories are kept in $TIDEWATER_HOME/kafka-<port> (topics survive a restart)."""
    current = read_state()
    if current is not None and current.alive() and current.port == port:
        return current
    if current is not None:
        current.stop()
    broker = start(port, detach=True, data_dir=home_dir() / f"kafka-{port}")
    broker.record(STATE_FILE)
    return broker


def read_state() -> Broker | None:
    return Broker.recorded(STATE_FILE)


def stop_background(port: int | None = None) -> bool:
    """Stop the recorded demo broker (only if it listens on ``port``, when given). Raises ConfigError
    when the recorded broker listens on another port."""
    b = read_state()
    if b is None:
        return False
    if port is not None and b.port != port:
        raise ConfigError(f"--port: the recorded embedded broker listens on port {b.port}, not {port}; nothing stopped")
    b.stop()
    Broker.forget(STATE_FILE)
    return True
