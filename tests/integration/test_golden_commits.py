"""What every kind of commit leaves on disk, held to golden files written against the code before the one-commit
redesign (issue 32): the snapshots of every table a pipeline touches, in order, with their operation, Tidewater's
summary properties and Iceberg's record and file counts, and the references at the end.

One scenario per combination of holder (fused: the table is its own offsets holder; checkpoint: a routed
pipeline) and table kind (append, change), each going through every mode: ingest (with a dead letter), the replay
modes (replace, append-missing, reapply), quarantine (published or dropped) and an operator's skip. Values that
differ from run to run (batch ids, topic names, timestamps, file sizes, snapshot ids) are replaced by stable
names before comparing. A plain batch makes exactly one snapshot carrying both its data and its offsets.

Beside them, two failure tests of the redesigned commit: manifests staged by the previous version commit once,
and target tables committing on a pool (PostgreSQL) survive a crash among them.

Regenerate the golden files only on purpose: ``TIDEWATER_UPDATE_GOLDEN=1 pytest tests/integration/test_golden_commits.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import ingest_inline, produce_to_partition, stage_inline, write_pipeline
from tests.integration.test_routed_changes import Source, assert_equals_source, database_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import ValidationFailedError
from tidewater.ops import quarantine
from tidewater.ops.replay import run_replay
from tidewater.ops.skip import SkipRequest, skip
from tidewater.plan.replay import ReplayRequest
from tidewater.runtime.airflow import quarantine_task
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import BATCH_ID, OFFSETS, committed_state, summary_dict

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GOLDEN = Path(__file__).parent / "golden"
# Iceberg's own summary keys that say what a snapshot did (sizes are left out: they differ with the timestamps
# the records carry)
ICEBERG_KEYS = (
    "added-records",
    "deleted-records",
    "added-data-files",
    "deleted-data-files",
    "added-delete-files",
    "removed-delete-files",
    "added-position-deletes",
    "removed-position-deletes",
    "total-records",
    "total-data-files",
    "total-delete-files",
    "total-position-deletes",
)
BATCH_IDS = re.compile(r"(?:skip-|replay-)?\d{8}T\d{6,9}Z-[0-9a-f]{8}")
VOLATILE = ("tidewater.valid-through-ms", "tidewater.valid-through")


def normalized(catalog, namespace: str, topics: dict[str, str]) -> dict:
    """Every table of ``namespace``: its snapshots in commit order and its references, with batch ids named by
    first appearance (b1, b2, ...), topic names by role, and volatile values replaced."""
    names: dict[str, str] = {}

    def stable(text: str) -> str:
        for real, role in sorted(topics.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(real, role)
        return BATCH_IDS.sub(lambda m: names.setdefault(m.group(0), f"<b{len(names) + 1}>"), text)

    tables = {name: load_table(catalog, f"{namespace}.{name}") for _, name in sorted(catalog.list_tables(namespace))}
    ordered = {name: sorted(t.metadata.snapshots, key=lambda s: (s.sequence_number, s.timestamp_ms)) for name, t in tables.items()}
    everywhere = {str(s.snapshot_id): f"<{name}:s{i}>" for name, snaps in ordered.items() for i, s in enumerate(snaps)}

    def value(key: str, text: str) -> str:  # snapshot ids in values (the ledger's position) by their stable names
        return "<volatile>" if key in VOLATILE else re.sub(r"-?\d{12,}", lambda m: everywhere.get(m.group(0), "<id>"), stable(text))

    out = {}
    for name, table in tables.items():
        snaps = ordered[name]
        ids = {s.snapshot_id: f"s{i}" for i, s in enumerate(snaps)}
        rows = []
        for s in snaps:
            props = summary_dict(s)
            kept = {k: value(k, v) for k, v in sorted(props.items()) if k.startswith("tidewater.")}
            kept.update({k: props[k] for k in ICEBERG_KEYS if k in props})
            rows.append(
                {"id": ids[s.snapshot_id], "parent": ids.get(s.parent_snapshot_id), "operation": s.summary.operation.value, "summary": kept}
            )
        refs = {stable(r): ids.get(ref.snapshot_id) for r, ref in sorted(table.metadata.refs.items())}
        out[name] = {"snapshots": rows, "refs": refs}
    return out


# How Iceberg's snapshots reached their content (which files were added, removed or rewritten): all that packing short
# ranges into one write task (write/packing.py) may change. With files that hold several partitions' rows, a replace
# replay of one partition rewrites them (an overwrite of the rows kept) where it removed whole files (a delete). What
# every snapshot holds (total-records), Tidewater's summaries, offsets and references may not change with it.
LAYOUT_KEYS = ("added-data-files", "deleted-data-files", "total-data-files", "added-records", "deleted-records")


def without_layout(doc: dict) -> dict:
    return {
        t: {
            **d,
            "snapshots": [
                {**s, "operation": None, "summary": {k: v for k, v in s["summary"].items() if k not in LAYOUT_KEYS}} for s in d["snapshots"]
            ],
        }
        for t, d in doc.items()
    }


def check_golden(name: str, doc: dict, layout: bool = True) -> None:
    """``doc`` equals the golden file ``name``; without ``layout``, but for how each snapshot reached its content
    (``LAYOUT_KEYS``, the operation)."""
    path = GOLDEN / f"{name}.json"
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if layout and os.environ.get("TIDEWATER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    want = json.loads(path.read_text())
    if not layout:
        doc, want = without_layout(doc), without_layout(want)
    for table in sorted(set(want) | set(doc)):
        assert doc.get(table) == want.get(table), f"{name}: table {table} differs from {path.name}"


def ev(i: int, v: str | None = None) -> bytes:
    return json.dumps({"id": i, "v": v or f"v{i}"}).encode()


def strict_suite(home: Path, column: str, regex: str) -> str:
    (home / "strict.json").write_text(
        json.dumps({"expectations": [{"type": "expect_column_values_to_not_match_regex", "kwargs": {"column": column, "regex": regex}}]})
    )
    return "strict.json"


def one_batch_snapshots(spec, batch_id: str) -> list:
    table = load_table(load_catalog(spec), spec.table.identifier)
    return [s for s in table.metadata.snapshots if summary_dict(s).get(BATCH_ID) == batch_id]


def test_an_append_tables_commits_in_every_mode_match_the_golden_file(broker, catalog, home, topic):
    """A plain append pipeline (fused holder): an ingest batch with a dead letter (one snapshot with data and offsets),
    replays (replace, append-missing), a quarantined batch published, an operator's skip with the records before it
    ingested first, and a last ingest batch. Expected: the snapshots equal golden/append_fused.json."""
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"metadata": "prefixed"},
        batch={"write_parallelism": 2},
        validation={"not_null": ["id"], "suite": strict_suite(home, "v", "^bad"), "on_failure": "quarantine"},
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(20)] + [b"{not json"] + [ev(20)], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, [ev(100 + i) for i in range(15)])
    first = ingest_inline(spec)
    assert (first.status, first.records, first.dead_letters) == ("committed", 37, 1)
    only = one_batch_snapshots(spec, first.batch_id)
    assert len(only) == 1 and OFFSETS in summary_dict(only[0]) and int(summary_dict(only[0])["added-records"]) == 36
    for req in (
        ReplayRequest(topic=topic, partitions=(0,), start_offset=5, end_offset=15),
        ReplayRequest(topic=topic, partitions=(1,), start_offset=0, end_offset=15, mode="append-missing"),
    ):
        assert run_replay(spec, req, out=None, inline=True)["status"] == "committed"
    produce_to_partition(broker.bootstrap, topic, 0, [ev(200 + i, "bad") for i in range(4)])
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    with pytest.raises(ValidationFailedError):
        commit_step(spec, plan, manifest)
    assert quarantine.publish(spec, plan.batch_id)["status"] == "published"
    produce_to_partition(broker.bootstrap, topic, 0, [ev(300 + i) for i in range(8)])
    at = committed_state(load_table(load_catalog(spec), spec.table.identifier)).offsets[topic][0]
    done = skip(spec, SkipRequest(topic=topic, partition=0, start_offset=at + 2, end_offset=at + 4, reason="golden", by="test"))
    assert (done["status"], done["dead_letters"], done["ingested_first"]) == ("committed", 2, 2)
    assert ingest_inline(spec).records == 4
    check_golden("append_fused", normalized(load_catalog(spec), "rpc", {topic: "T"}))


def _change_pipeline(home: Path, broker, topics: list[str], **more) -> Path:
    more.setdefault("batch", {"write_parallelism": 2})  # packing as on two cores, whatever this machine has
    return write_pipeline(
        home,
        name="prices",
        topics=topics,
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True},
        format={"value": "debezium"},
        **more,
    )


def test_a_change_tables_commits_in_every_mode_match_the_golden_file(broker, catalog, home, topic):
    """A plain change table (fused holder): two change batches (one snapshot each: the row delta with the offsets),
    a reapply replay of one partition, a quarantined batch dropped, an operator's skip and a last batch. The table
    equals its source's reference model where it should; the snapshots equal golden/change_fused.json."""
    path = _change_pipeline(
        home,
        broker,
        [topic],
        validation={"not_null": ["id"], "suite": strict_suite(home, "item", "^item-[0-9]+-31-"), "on_failure": "quarantine"},
    )
    spec = load_pipeline(path)
    source = Source(topic)
    for b in range(2):
        source.produce(broker, b, 30, seed=b + 1)
        result = ingest_inline(spec)
        assert len(one_batch_snapshots(spec, result.batch_id)) == 1
    assert_equals_source(spec, "rpc.prices", source)
    end = committed_state(load_table(load_catalog(spec), "rpc.prices")).offsets[topic][0]
    req = ReplayRequest(topic=topic, partitions=(0,), start_offset=0, end_offset=end, mode="reapply")
    assert run_replay(spec, req, out=None, inline=True)["status"] == "committed"
    assert_equals_source(spec, "rpc.prices", source)
    kept = dict(source.model)
    source.produce(broker, 2, 20, seed=31)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    with pytest.raises(ValidationFailedError):
        commit_step(spec, plan, manifest)
    assert quarantine.drop(spec, plan.batch_id)["status"] == "dropped"
    source.model = kept
    produce_to_partition(broker.bootstrap, topic, 1, [b"{not json", b"{nor this", b"{and this"], partitions=2)
    at = committed_state(load_table(load_catalog(spec), "rpc.prices")).offsets[topic][1]
    done = skip(spec, SkipRequest(topic=topic, partition=1, start_offset=at + 1, end_offset=at + 3, reason="golden", by="test"))
    assert (done["status"], done["dead_letters"]) == ("committed", 2)
    check_golden("change_fused", normalized(load_catalog(spec), "rpc", {topic: "T"}))


@pytest.mark.parametrize("packed", [False, True], ids=["a-task-per-range", "packed"])
def test_a_routed_pipelines_commits_in_every_mode_match_the_golden_file(broker, catalog, home, topic, packed):
    """A routed pipeline (checkpoint holder) over two Debezium topics: topic 0 feeds a change table (cur0) and an
    append table with metadata columns (hist0), topic 1 the change table cur1. Two batches, a replay of topic 0
    (cur0 reapplies, hist0 replaces) and one in append-missing mode, a batch whose topic-1 tables are quarantined
    and published, an operator's skip, a last batch of topic 0. Expected: the snapshots of every table (targets, checkpoint,
    ledger, dead letters) equal golden/routed_checkpoint.json (written one task per range). Packed (its batches'
    four short ranges read by two tasks): the same snapshots with the same records, summaries and offsets, but fewer
    data files, and the replace replay of topic 0 rewrites the append table's files (they also hold the other
    partition's rows) where it removed whole files."""
    sources = [Source(f"{topic}-s{i}") for i in range(2)]
    tables = [
        {"identifier": "rpc.cur0", "topics": [sources[0].topic], "id_columns": ["id"], "upsert": True},
        {"identifier": "rpc.hist0", "topics": [sources[0].topic]},
        {"identifier": "rpc.cur1", "topics": [sources[1].topic], "id_columns": ["id"], "upsert": True},
        {"identifier": "rpc.hist1", "topics": [sources[1].topic]},
    ]
    path = write_pipeline(
        home,
        name="routed",
        topics=[s.topic for s in sources],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": ""},
        tables=tables,
        routing={"namespace": "rpc"},
        format={"value": "debezium", "metadata": "prefixed"},
        validation={"not_null": ["id"], "suite": strict_suite(home, "item", "^item-[0-9]+-31-"), "on_failure": "quarantine"},
        batch={"pack_ranges": packed, "write_parallelism": 2},
    )
    spec = load_pipeline(path)
    for b in range(2):
        for i, s in enumerate(sources):
            s.produce(broker, b, 20, seed=10 * b + i + 1)
        assert ingest_inline(spec).status == "committed"
    end = committed_state(load_table(load_catalog(spec), spec.checkpoint_table())).offsets[sources[0].topic]
    for mode in ("replace", "append-missing"):
        for p, e in sorted(end.items()):
            req = ReplayRequest(topic=sources[0].topic, partitions=(p,), start_offset=0, end_offset=e, mode=mode)
            assert run_replay(spec, req, out=None, inline=True)["status"] == "committed"
    for i in range(2):
        assert_equals_source(spec, f"rpc.cur{i}", sources[i])
    sources[1].produce(broker, 2, 20, seed=31)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    with pytest.raises(ValidationFailedError):
        commit_step(spec, plan, manifest)
    for ident in ("rpc.cur1", "rpc.hist1"):
        assert quarantine_task(str(path), {"action": "publish", "batch_id": plan.batch_id, "table": ident})["status"] == "published"
    produce_to_partition(broker.bootstrap, sources[0].topic, 0, [b"{not json", b"{nor this"], partitions=2)
    at = committed_state(load_table(load_catalog(spec), spec.checkpoint_table())).offsets[sources[0].topic][0]
    done = skip(spec, SkipRequest(topic=sources[0].topic, partition=0, start_offset=at, end_offset=at + 2, reason="golden", by="test"))
    assert (done["status"], done["dead_letters"]) == ("committed", 2)
    sources[0].produce(broker, 3, 10, seed=40)  # source 1's deletes would carry images of the refused items
    assert ingest_inline(spec).status == "committed"
    for i in range(2):
        assert_equals_source(spec, f"rpc.cur{i}", sources[i])
    doc = normalized(load_catalog(spec), "rpc", {sources[0].topic: "T0", sources[1].topic: "T1"})
    check_golden("routed_checkpoint", doc, layout=not packed)
    if packed:  # fewer files in all, none more in any table
        want = json.loads((GOLDEN / "routed_checkpoint.json").read_text())

        def files(d: dict) -> int:
            return int(d["snapshots"][-1]["summary"].get("total-data-files", 0))

        assert all(files(doc[t]) <= files(want[t]) for t in want)
        assert sum(files(d) for d in doc.values()) < sum(files(d) for d in want.values())


def test_manifests_staged_by_the_previous_version_commit_once(broker, home, topic):
    """A batch staged before an upgrade commits after it: its manifest is the previous version's (version 1: a plain
    batch's files at the top and no per-table outputs). Expected: the batch commits once (a retry finds it), the
    offsets advance exactly over its ranges and the table holds each record once; the same for a routed batch's
    version-1 manifest (outputs for its tables, as before)."""
    from tidewater.batch import BatchManifest, manifest_path, read_json, write_json_atomic
    from tidewater.plan.ingest import plan_batch
    from tidewater.source.kafka import kafka_settings
    from tidewater.write.job import run_inline

    def staged_as_version_1(spec):
        plan, path = plan_batch(spec)
        doc = run_inline(plan, spec, kafka_settings(spec)).to_json()
        own = [o for o in doc["outputs"] if o["table"] == doc["table"]]
        doc.update(
            version=1,
            data_files=own[0]["data_files"] if own else doc["data_files"],
            outputs=[o for o in doc["outputs"] if o["table"] != doc["table"]],
        )
        write_json_atomic(manifest_path(path), doc)
        manifest = BatchManifest.from_json(read_json(manifest_path(path)))
        assert manifest.version == 1 and (manifest.data_files or manifest.outputs)
        validate_step(spec, plan, manifest)
        return plan, manifest

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["id"]})
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(25)], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, [ev(100 + i) for i in range(7)])
    plan, manifest = staged_as_version_1(spec)
    assert not manifest.outputs and len(manifest.data_files) >= 1
    assert [commit_step(spec, plan, manifest).status for _ in range(2)] == ["committed", "already-committed"]
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert committed_state(table).offsets == {topic: {0: 25, 1: 7}}
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    assert sorted(ids) == sorted([*range(25), *range(100, 107)])
    assert len(one_batch_snapshots(spec, plan.batch_id)) == 1

    sources = [Source(f"{topic}-r{i}") for i in range(2)]
    tables = [{"identifier": f"rpc.r{i}", "topics": [s.topic], "id_columns": ["id"], "upsert": True} for i, s in enumerate(sources)]
    routed = load_pipeline(
        write_pipeline(
            home,
            name="upgraded",
            topics=[s.topic for s in sources],
            table={"identifier": ""},
            kafka={"bootstrap_servers": broker.bootstrap},
            tables=tables,
            routing={"namespace": "rpc"},
            format={"value": "debezium"},
        )
    )
    for i, s in enumerate(sources):
        s.produce(broker, 0, 15, seed=70 + i)
    plan, manifest = staged_as_version_1(routed)
    assert len(manifest.outputs) == 2
    assert [commit_step(routed, plan, manifest).status for _ in range(2)] == ["committed", "already-committed"]
    for i, s in enumerate(sources):
        assert_equals_source(routed, f"rpc.r{i}", s)
    checkpoint = load_table(load_catalog(routed), routed.checkpoint_table())
    assert committed_state(checkpoint).offsets == plan.end_offsets()


def test_target_tables_commit_concurrently_on_postgresql_and_a_failure_among_them_commits_once(broker, home, topic, postgres, monkeypatch):
    """A routed batch of six change tables on a PostgreSQL catalog, whose tables commit on a pool of several slots
    (SQLite's would be one). One table's commit fails (a crash in the middle of the pool): the step fails, the
    checkpoint does not move, the tables that committed keep the batch once. Retrying the step commits the rest
    and the checkpoint: every table equals its source, each holds exactly one snapshot of the batch, and the
    checkpoint's offsets are the batch's ends."""
    from tidewater.commit import batch as committing
    from tidewater.errors import TransientError
    from tidewater.table.catalog import commit_slots

    sources = [Source(f"{topic}-p{i}") for i in range(6)]
    spec = database_pipeline(
        home,
        broker,
        [s.topic for s in sources],
        name="pooled",
        catalog={
            "properties": {"type": "sql", "uri": postgres.create_database("pooled_catalog"), "warehouse": f"file://{home / 'warehouse'}"}
        },
    )
    assert commit_slots(load_catalog(spec)) > 1
    for i, s in enumerate(sources):
        s.produce(broker, 0, 25, seed=90 + i)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    real = committing.commit_table_output
    threads = set()

    def crash_on_src3(catalog, plan, out, *a):
        import threading

        threads.add(threading.current_thread().name)
        if out.table == "rpc.src3":
            raise TransientError("simulated crash during one table's commit")
        return real(catalog, plan, out, *a)

    monkeypatch.setattr(committing, "commit_table_output", crash_on_src3)
    with pytest.raises(TransientError):
        commit_step(spec, plan, manifest)
    assert len(threads) > 1 and all(t.startswith("tidewater-commit") for t in threads), threads  # on the pool
    catalog = load_catalog(spec)
    assert load_table(catalog, spec.checkpoint_table()).snapshots() == []
    assert load_table(catalog, "rpc.src3").snapshots() == []
    monkeypatch.setattr(committing, "commit_table_output", real)
    result = commit_step(spec, plan, manifest)
    assert result.status == "committed" and {t.table: t.status for t in result.tables}["rpc.src3"] == "committed"
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)
        assert len([x for x in load_table(catalog, f"rpc.src{i}").snapshots() if summary_dict(x).get(BATCH_ID) == plan.batch_id]) == 1
    assert committed_state(load_table(catalog, spec.checkpoint_table())).offsets == plan.end_offsets()
