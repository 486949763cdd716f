"""Broker faults on a three-node Apache Kafka cluster (KRaft; each node a controller and a broker; topics with
replication factor 3 and ``min.insync.replicas`` 2): a node killed with SIGKILL during the plan, the write and the
commit, a partition's leader moved gracefully (controlled shutdown, then a preferred-leader election) during the
write, and the whole cluster down past the retries. Each batch commits exactly once: rows, offsets and
``audit --deep`` are checked after every fault, and the killed nodes are started again on their own logs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import commit_as_airflow_would, ingest_inline, stage_inline, table_of, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.commit import dead_letters
from tidewater.config.parse import load_pipeline
from tidewater.errors import TransientError
from tidewater.plan.ingest import plan_batch
from tidewater.source import kafka
from tidewater.steps.lifecycle import validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
from tidewater.write import task
from tidewater_dev import broker as embedded
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[embedded.Cluster]:
    c = embedded.start_cluster(3, log_dir=Path(os.environ.get("TMPDIR", "/tmp")))
    yield c
    c.stop()


def _replicated_topic(cluster: embedded.Cluster, topic: str, records: int, seed: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # held until the future resolves
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=3)])[topic].result(30)
    produce(cluster.bootstrap, topic, pizza_events(records, seed=seed), partitions=PARTITIONS, create=False)


def _leader(cluster: embedded.Cluster, topic: str, partition: int) -> embedded.Broker:
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=15)
    return cluster.node(md.topics[topic].partitions[partition].leader)


def _heal(cluster: embedded.Cluster) -> None:
    """Start every killed node again and wait until the cluster lists all three brokers."""
    for node in cluster.nodes:
        if not node.alive():
            node.restart()
    embedded.wait_ready(cluster.bootstrap, len(cluster.nodes), 120, cluster.nodes)


def _spec(home: Path, cluster: embedded.Cluster, topic: str):
    # a leader's loss is noticed after broker.session.timeout.ms (9 s): the reader waits longer than that
    return load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": cluster.bootstrap, "read_timeout_seconds": 90}))


def _exactly_once(spec, topic: str, per_partition: int) -> None:
    table = table_of(spec.source_path)
    coords = table.scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow().to_pylist()
    assert len(coords) == len({(r["_kafka_partition"], r["_kafka_offset"]) for r in coords}) == PARTITIONS * per_partition
    assert committed_state(table).offsets == {topic: dict.fromkeys(range(PARTITIONS), per_partition)}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def _with_retries(call, attempts: int = 6, pause: float = 5.0):
    """``call`` retried on a transient error, as Airflow retries a task (``airflow.retries``)."""
    for attempt in range(attempts):
        try:
            return call()
        except TransientError:
            if attempt == attempts - 1:
                raise
            time.sleep(pause)
    return None


def test_a_partition_leader_killed_during_the_write_moves_and_the_batch_commits_once(cluster, home, topic, monkeypatch):
    """The leader of partition 0 is killed (SIGKILL) after the write task has read its first chunk of that partition.
    Expected: the reader follows the new leader and the batch commits every record once, offsets at the end."""

    _replicated_topic(cluster, topic, 3000, seed=41)
    spec = _spec(home, cluster, topic)
    victim = _leader(cluster, topic, 0)
    real = task.read_range
    killed: list[int] = []

    def read_then_kill(settings, rng, **kw):
        for i, chunk in enumerate(real(settings, rng, **kw)):
            yield chunk
            if rng.partition == 0 and i == 0 and not killed:
                victim.kill()
                killed.append(victim.node_id)

    monkeypatch.setattr(task, "read_range", read_then_kill)
    result = ingest_inline(spec)
    assert killed == [victim.node_id] and not victim.alive()
    assert result.records == 3000
    assert _leader(cluster, topic, 0).node_id != victim.node_id
    _exactly_once(spec, topic, 1000)
    _heal(cluster)


def test_a_broker_killed_during_the_plan_leaves_a_plan_that_commits_once(cluster, home, topic, monkeypatch):
    """A node is killed right after the plan listed the partitions, before it asks their end offsets. Expected: the
    plan either succeeds on the other two nodes or fails as a transient error that the task's retry gets past; the
    batch then commits every record once. A second batch after the node returns finds nothing twice."""

    _replicated_topic(cluster, topic, 600, seed=42)
    spec = _spec(home, cluster, topic)
    victim = _leader(cluster, topic, 1)
    real = kafka.list_partitions

    def list_then_kill(settings, topics, **kw):
        out = real(settings, topics, **kw)
        if victim.alive():
            victim.kill()
        return out

    monkeypatch.setattr(kafka, "list_partitions", list_then_kill)
    plan, _ = _with_retries(lambda: plan_batch(spec))
    assert not victim.alive() and plan.record_span == 600
    monkeypatch.setattr(kafka, "list_partitions", real)
    assert ingest_inline(spec).records == 600
    _exactly_once(spec, topic, 200)
    _heal(cluster)
    assert plan_batch(spec)[0].is_empty
    _exactly_once(spec, topic, 200)


def test_a_cluster_down_past_the_retries_is_a_transient_error_and_the_next_run_continues(cluster, home, topic):
    """Every node killed after a first batch: the next plan fails as a transient error (worth retrying), nothing is
    committed. Once the nodes are back, the next run ingests what was produced since, every record once."""
    _replicated_topic(cluster, topic, 300, seed=43)
    spec = _spec(home, cluster, topic)
    assert ingest_inline(spec).records == 300
    produce(cluster.bootstrap, topic, pizza_events(300, seed=44), partitions=PARTITIONS, create=False)
    before = table_of(spec.source_path).current_snapshot().snapshot_id
    for node in cluster.nodes:
        node.kill()
    with pytest.raises(TransientError):
        plan_batch(spec)
    assert table_of(spec.source_path).current_snapshot().snapshot_id == before
    _heal(cluster)
    assert _with_retries(lambda: ingest_inline(spec)).records == 300
    _exactly_once(spec, topic, 200)


def test_the_dead_letter_topic_s_leader_killed_during_the_commit_still_commits_once(cluster, home, topic, monkeypatch):
    """``dead_letter.topic`` set: the commit sends the batch's dead letters to Kafka before it commits them. The leader
    of that topic's partition is killed (SIGKILL) just before the send. Expected: the batch commits its rows once,
    the dead-letter table holds each bad record once, and the topic every bad record at least once (the send is
    at least once; a retried commit step, as Airflow's, sends again only if the first send failed); audit --deep
    clean."""
    dlq = f"{topic}-dlq"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(dlq, num_partitions=1, replication_factor=3)])[dlq].result(30)
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=3)])[topic].result(30)
    values = pizza_events(297, seed=45)
    values[10:10] = [b"{not json", b"[1, 2]", b"\xff\xfe"]  # three dead letters, at partition 1, 2 and 0
    produce(cluster.bootstrap, topic, values, partitions=PARTITIONS, create=False)
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": cluster.bootstrap, "read_timeout_seconds": 90}, dead_letter={"topic": dlq}
    )
    spec = load_pipeline(path)
    victim = _leader(cluster, dlq, 0)
    real = dead_letters.produce_to_topic

    def kill_then_send(*args, **kw):
        if victim.alive():
            victim.kill()
        return real(*args, **kw)

    monkeypatch.setattr(dead_letters, "produce_to_topic", kill_then_send)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    result = commit_as_airflow_would(spec, plan, manifest)
    assert result.status == "committed" and not victim.alive()
    table = table_of(path)
    coords = table.scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow().to_pylist()
    assert len(coords) == len({(r["_kafka_partition"], r["_kafka_offset"]) for r in coords}) == 297
    assert committed_state(table).offsets == {topic: dict.fromkeys(range(PARTITIONS), 100)}
    letters = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow()
    assert sorted(zip(letters.column("partition").to_pylist(), letters.column("offset").to_pylist())) == [(0, 4), (1, 3), (2, 3)]
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "dlq-check", "enable.partition.eof": True})
    consumer.assign([KTP(dlq, 0, 0)])
    sent = set()
    while True:
        m = consumer.poll(30)
        assert m is not None, "the dead-letter topic did not answer"
        if m.error():
            break  # the partition's end
        h = dict(m.headers())
        sent.add((int(h["tidewater.partition"]), int(h["tidewater.offset"])))
    consumer.close()
    assert sent == {(0, 4), (1, 3), (2, 3)}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
    _heal(cluster)


def _in_sync(cluster: embedded.Cluster, topic: str, partition: int, node_id: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    while time.monotonic() < deadline:
        if node_id in admin.list_topics(topic, timeout=15).topics[topic].partitions[partition].isrs:
            return
        time.sleep(0.5)
    raise AssertionError(f"node {node_id} did not rejoin the ISR of {topic}-{partition} in {timeout:.0f} s")


def test_a_partition_leader_moved_gracefully_during_the_write_commits_once(cluster, home, topic, monkeypatch):
    """A rolling restart's leader moves, with no node lost: partition 0's preferred leader is shut down (SIGTERM, a
    controlled shutdown hands its leadership to another replica) and started again, back in sync but not leading.
    After the write task has read its first chunk of partition 0, a preferred-leader election (as the controller's
    rebalance or an operator does) moves the leadership back to it, mid-read. Expected: the reader follows the moved
    leader and the batch commits every record once, offsets at the end, the deep audit clean."""
    from confluent_kafka import ElectionType

    _replicated_topic(cluster, topic, 3000, seed=43)
    spec = _spec(home, cluster, topic)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    preferred = cluster.node(admin.list_topics(topic, timeout=15).topics[topic].partitions[0].replicas[0])
    preferred.shutdown()
    assert _leader(cluster, topic, 0).node_id != preferred.node_id  # the controlled shutdown moved it
    preferred.restart()
    _in_sync(cluster, topic, 0, preferred.node_id)
    before = _leader(cluster, topic, 0).node_id
    assert before != preferred.node_id
    real = task.read_range
    moved: list[int] = []

    def read_then_move(settings, rng, **kw):
        for i, chunk in enumerate(real(settings, rng, **kw)):
            yield chunk
            if rng.partition == 0 and i == 0 and not moved:
                result = admin.elect_leaders(ElectionType.PREFERRED, [KTP(topic, 0)]).result(30)
                assert all(err is None for err in result.values()), result
                moved.append(_leader(cluster, topic, 0).node_id)

    monkeypatch.setattr(task, "read_range", read_then_move)
    result = ingest_inline(spec)
    assert moved == [preferred.node_id] and before != preferred.node_id  # the leader moved during the read
    assert result.records == 3000
    _exactly_once(spec, topic, 1000)
    _heal(cluster)
