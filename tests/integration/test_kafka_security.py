"""A secured Apache Kafka broker (``tidewater_dev.broker.start_secured``): a SASL_SSL listener with SCRAM-SHA-512 over
TLS (a self-signed certificate made by the JDK's keytool for the test) and ACLs enforced by Kafka's StandardAuthorizer,
nothing allowed without an ACL. The pipeline's principal gets Describe and Read on its topic and nothing else: no
consumer-group permission. Credentials come from an Airflow connection (``kafka.conn_id``) or from ``${ENV}``; every
test counts rows, checks offsets and the audit, or that nothing was committed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.conftest import ingest_inline, table_of, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError, TerminalError
from tidewater.plan.ingest import plan_batch
from tidewater.table.summary import committed_state
from tidewater_dev import broker as embedded
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]

USER, PASSWORD = "pipeline", "pipeline-secret-1"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[embedded.SecuredBroker]:
    b = embedded.start_secured(tmp_path_factory.mktemp("secured-kafka"))
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    done = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), PASSWORD.encode())]
    )
    for fut in done.values():
        fut.result(30)
    yield b
    b.stop()


def _topic_for_the_pipeline(b: embedded.SecuredBroker, topic: str, records: int) -> None:
    """``topic`` with two partitions and ``records`` pizza events (produced by the administrator), and the ACLs a
    pipeline needs: Describe and Read on the topic for ``User:pipeline``, nothing on any group."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    acls = [
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{USER}", "*", op, AclPermissionType.ALLOW)
        for op in (AclOperation.DESCRIBE, AclOperation.READ)
    ]
    for fut in admin.create_acls(acls).values():
        fut.result(30)
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i, v in enumerate(pizza_events(records, seed=80)):
        p.produce(topic, v, partition=i % 2)
    p.flush(30)


@pytest.mark.parametrize("credentials", ["connection", "environment"])
def test_a_pipeline_with_only_describe_and_read_on_its_topic_ingests_over_sasl_ssl(secured, home, topic, monkeypatch, credentials):
    """SCRAM-SHA-512 over TLS, the password from an Airflow connection or from ``${KAFKA_PASSWORD}``. Expected: the
    plan, the read and ``audit --deep`` (which reads Kafka too) work with Describe and Read on the topic alone (the
    reading consumer joins no group and commits nothing), every record lands once, offsets at the end."""
    _topic_for_the_pipeline(secured, topic, 40)
    tls = {
        k: v for k, v in secured.client_settings(USER, PASSWORD).items() if k not in ("bootstrap.servers", "sasl.username", "sasl.password")
    }
    if credentials == "connection":
        monkeypatch.setenv(
            "AIRFLOW_CONN_KAFKA_SECURED",
            json.dumps({"conn_type": "generic", "host": secured.sasl_bootstrap, "login": USER, "password": PASSWORD, "extra": tls}),
        )
        kafka = {"conn_id": "kafka_secured", "bootstrap_servers": None}
    else:
        monkeypatch.setenv("KAFKA_PASSWORD", PASSWORD)
        kafka = {
            "bootstrap_servers": secured.sasl_bootstrap,
            "settings": {**tls, "sasl.username": USER, "sasl.password": "${KAFKA_PASSWORD}"},
        }
    path = write_pipeline(home, topics=[topic], kafka=kafka)
    spec = load_pipeline(path)
    assert ingest_inline(spec).records == 40
    table = table_of(path)
    coords = table.scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow().to_pylist()
    assert len({(r["_kafka_partition"], r["_kafka_offset"]) for r in coords}) == len(coords) == 40
    assert committed_state(table).offsets == {topic: {0: 20, 1: 20}}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_a_wrong_password_is_a_terminal_error_naming_the_setting_and_nothing_is_committed(secured, home, topic):
    """Expected: the plan fails with a configuration error (terminal: retrying will not help) that names the
    settings to check and does not show the password; no table is created."""
    _topic_for_the_pipeline(secured, topic, 10)
    wrong = "not-the-password"
    settings = {k: v for k, v in secured.client_settings(USER, wrong).items() if k != "bootstrap.servers"}
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": secured.sasl_bootstrap, "settings": settings, "read_timeout_seconds": 10}
    )
    with pytest.raises(ConfigError) as refused:
        plan_batch(load_pipeline(path))
    assert isinstance(refused.value, TerminalError)
    message = str(refused.value)
    assert "refused the credentials" in message and "sasl.password" in message and "kafka.conn_id" in message
    assert wrong not in message
    assert table_of(path) is None


def test_a_topic_without_an_acl_for_the_pipeline_is_refused_naming_it(secured, home, topic):
    """The principal may not describe the topic: the plan fails naming the topic and the authorization failure,
    as a configuration error; nothing is committed."""
    admin = AdminClient({"bootstrap.servers": secured.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    settings = {k: v for k, v in secured.client_settings(USER, PASSWORD).items() if k != "bootstrap.servers"}
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": secured.sasl_bootstrap, "settings": settings})
    with pytest.raises(ConfigError, match=rf"topics: topic '{topic}' is not available on the broker \(.*[Aa]uthoriz"):
        plan_batch(load_pipeline(path))
    assert table_of(path) is None


def _bad_records_topic(b: embedded.SecuredBroker, topic: str, dlq: str, dlq_ops: tuple) -> None:
    """``topic`` (two partitions) with 20 records, every fifth one not JSON, the ACLs a pipeline reads with, and the
    dead-letter topic ``dlq`` with ``dlq_ops`` granted to the pipeline's principal."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for name, parts in ((topic, 2), (dlq, 1)):
        admin.create_topics([NewTopic(name, num_partitions=parts, replication_factor=1)])[name].result(30)
    acls = [
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{USER}", "*", op, AclPermissionType.ALLOW)
        for op in (AclOperation.DESCRIBE, AclOperation.READ)
    ]
    acls += [
        AclBinding(ResourceType.TOPIC, dlq, ResourcePatternType.LITERAL, f"User:{USER}", "*", op, AclPermissionType.ALLOW) for op in dlq_ops
    ]
    for fut in admin.create_acls(acls).values():
        fut.result(30)
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i, v in enumerate(pizza_events(20, seed=81)):
        p.produce(topic, v if i % 5 else b"{not json", partition=i % 2)
    p.flush(30)


def _dead_letter_pipeline(b: embedded.SecuredBroker, home, topic: str, dlq: str):
    settings = {k: v for k, v in b.client_settings(USER, PASSWORD).items() if k != "bootstrap.servers"}
    return load_pipeline(
        write_pipeline(
            home, topics=[topic], dead_letter={"topic": dlq}, kafka={"bootstrap_servers": b.sasl_bootstrap, "settings": settings}
        )
    )


def _messages(b: embedded.SecuredBroker, topic: str) -> list:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "admin-check", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    _, end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)
    out = []
    while len(out) < end:
        out += [m for m in c.consume(100, timeout=5) if m.error() is None]
    c.close()
    return out


def test_the_dead_letter_topic_needs_describe_and_write_and_nothing_more(secured, home, topic):
    """`dead_letter.topic` with Describe and Write granted on it (and Describe and Read on the source topic): the 4
    undecodable records of 20 reach the dead-letter table and the topic, each message naming its source offset; 16
    rows committed once, offsets at the end, the accounting adds up."""
    dlq = f"{topic}-dlq"
    _bad_records_topic(secured, topic, dlq, (AclOperation.DESCRIBE, AclOperation.WRITE))
    spec = _dead_letter_pipeline(secured, home, topic, dlq)
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (20, 4)  # read = rows + dead letters
    table = table_of(spec.source_path)
    assert table.scan().to_arrow().num_rows == 16
    assert committed_state(table).offsets == {topic: {0: 10, 1: 10}}
    sent = _messages(secured, dlq)
    offsets = sorted((int(dict(m.headers())["tidewater.partition"]), int(dict(m.headers())["tidewater.offset"])) for m in sent)
    assert offsets == [(0, 0), (0, 5), (1, 2), (1, 7)]


def test_a_dead_letter_topic_without_write_is_a_terminal_error_naming_the_setting(secured, home, topic):
    """Only Describe on the dead-letter topic: the commit step fails with a configuration error (terminal) naming
    `dead_letter.topic`, the topic and the Write ACL it needs; nothing reaches the topic, and after the ACL is granted
    a retry of the commit step sends the 4 letters and the batch stands committed once."""
    from tests.conftest import commit_as_airflow_would, stage_inline

    dlq = f"{topic}-dlq"
    _bad_records_topic(secured, topic, dlq, (AclOperation.DESCRIBE,))
    spec = _dead_letter_pipeline(secured, home, topic, dlq)
    from tidewater.steps.lifecycle import validate_step

    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    with pytest.raises(ConfigError, match=rf"dead_letter.topic: .*'{dlq}'.*Write") as refused:
        commit_as_airflow_would(spec, plan, manifest)
    assert isinstance(refused.value, TerminalError)
    assert _messages(secured, dlq) == []
    grant = AclBinding(
        ResourceType.TOPIC, dlq, ResourcePatternType.LITERAL, f"User:{USER}", "*", AclOperation.WRITE, AclPermissionType.ALLOW
    )
    admin = AdminClient({"bootstrap.servers": secured.bootstrap})  # held until the future resolves
    for fut in admin.create_acls([grant]).values():
        fut.result(30)
    commit_as_airflow_would(spec, plan, manifest)
    assert len(_messages(secured, dlq)) == 4
    table = table_of(spec.source_path)
    assert table.scan().to_arrow().num_rows == 16
    assert committed_state(table).offsets == {topic: {0: 10, 1: 10}}
