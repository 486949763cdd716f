"""Manual replay of offset ranges through the real broker, writer, gate and committer: replace twice
leaves the table identical, append-missing restores only what is absent, dry runs change nothing,
parameters are checked before anything runs, a replay beside a scheduled batch loses and duplicates
nothing, and time ranges map to offsets (through a stand-in for Kafka's timestamp lookup, which the
embedded broker answers wrongly). Rows, offsets and accounting are checked in every test."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.conftest import ingest_inline, produce_to_partition, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError
from tidewater.ops.replay import run_replay
from tidewater.plan.replay import ReplayRequest
from tidewater.source.timestamps import interval_offsets
from tidewater.table.summary import REPLAY, committed_state

pytestmark = [pytest.mark.integration]


def ev(i: int, **kw) -> bytes:
    return json.dumps({"id": i, "v": f"v{i}", **kw}).encode()


def setup_table(broker, home, topic, n0: int = 40, n1: int = 30, **overrides):
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"metadata": "prefixed"},
        validation={"not_null": ["id"]},
        **overrides,
    )
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(n0)], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, [ev(1000 + i) for i in range(n1)])
    spec = load_pipeline(path)
    assert ingest_inline(spec).records == n0 + n1
    return spec, path


def content(path):
    t = table_of(path).scan().to_arrow()
    return sorted(zip(t.column("_kafka_partition").to_pylist(), t.column("_kafka_offset").to_pylist(), t.column("id").to_pylist()))


def test_replace_twice_leaves_the_table_identical(broker, home, topic):
    spec, path = setup_table(broker, home, topic)
    before, offsets = content(path), committed_state(table_of(path)).offsets
    req = ReplayRequest(topic=topic, partitions=(0,), start_offset=10, end_offset=30)
    for _ in range(2):
        result = run_replay(spec, req, out=None, inline=True)
        assert (result["status"], result["rows"]) == ("committed", 20)
        assert content(path) == before
        table = table_of(path)
        assert committed_state(table).offsets == offsets  # never moved
        summary = table.current_snapshot().summary.additional_properties
        assert json.loads(summary[REPLAY]) == {"mode": "replace", "ranges": [[topic, 0, 10, 30]]}
    # each replay: a delete (rewriting the file that held the range) and an append, committed together
    import pyarrow.parquet as pq

    table = table_of(path)
    ops = [s.summary.operation.value for s in table.snapshots()]
    # first replay rewrites the ingest file (overwrite); the second drops the first replay's file whole (delete)
    assert ops == ["append", "overwrite", "append", "delete", "append"], ops
    for task in table.scan(row_filter="_kafka_partition = 0").plan_files():
        offs = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["_kafka_offset"]).column(0).to_pylist()
        in_range = [o for o in offs if 10 <= o < 30]
        assert not in_range or "replay-" in task.file.file_path  # only a replay's files hold the range


def test_append_missing_restores_only_absent_offsets(broker, home, topic):
    spec, path = setup_table(broker, home, topic)
    before = content(path)
    table = table_of(path)
    table.delete("_kafka_partition = 1 and _kafka_offset >= 5 and _kafka_offset < 12")  # rows lost by some accident
    assert len(content(path)) == len(before) - 7
    req = ReplayRequest(topic=topic, partitions=(1,), start_offset=0, end_offset=30, mode="append-missing")
    dry = run_replay(spec, ReplayRequest(**{**req.__dict__, "dry_run": True}), out=None, inline=True)
    assert dry["status"] == "dry-run" and dry["preview"][0]["rows_to_add_at_most"] == 7 and len(content(path)) == len(before) - 7
    result = run_replay(spec, req, out=None, inline=True)
    assert (result["rows"], result["already_present"]) == (7, 23)
    assert content(path) == before
    again = run_replay(spec, req, out=None, inline=True)
    assert (again["rows"], again["already_present"]) == (0, 30) and content(path) == before
    assert committed_state(table_of(path)).offsets == {topic: {0: 40, 1: 30}}


def test_an_append_missing_replay_killed_before_its_commit_lands_once_when_the_commit_is_retried(broker, home, topic, monkeypatch):
    """Kill between steps: the replay's write step has asked the table what it holds and staged the missing rows, and
    the commit dies before it starts. Nothing is visible. The commit step retried on the staged plan and manifest (as
    Airflow retries the commit task) lands the missing rows once, and a retry after that success changes nothing."""
    import tidewater.ops.replay as replay_ops
    from tidewater.steps.lifecycle import commit_step
    from tidewater.steps.write import load_manifest, load_plan

    spec, path = setup_table(broker, home, topic)
    before = content(path)
    table_of(path).delete("_kafka_partition = 0 and _kafka_offset >= 30")  # ten rows lost
    lost = content(path)
    staged: list = []

    def killed(spec_, plan, manifest):
        staged.append((plan, manifest))
        raise KeyboardInterrupt("killed before the commit")

    monkeypatch.setattr(replay_ops, "commit_step", killed)
    req = ReplayRequest(topic=topic, partitions=(0,), start_offset=0, end_offset=40, mode="append-missing")
    with pytest.raises(KeyboardInterrupt):
        run_replay(spec, req, out=None, inline=True)
    ((plan, manifest),) = staged
    assert (manifest.rows_in_files, manifest.present) == (10, 30)  # the write step asked the table
    assert content(path) == lost, "nothing of the killed replay is visible"
    plan_path = next(p for p in spec.staging_dir().rglob("plan.json") if p.parent.name == plan.batch_id)
    assert commit_step(spec, load_plan(plan_path), load_manifest(plan_path)).status == "committed"
    assert content(path) == before
    assert commit_step(spec, load_plan(plan_path), load_manifest(plan_path)).status == "already-committed"
    assert content(path) == before
    assert committed_state(table_of(path)).offsets == {topic: {0: 40, 1: 30}}


def test_an_append_missing_replay_whose_rows_another_replay_restored_first_is_refused_at_its_commit(broker, home, topic, monkeypatch):
    """Concurrent committers: replay A's write step stages the ten lost rows and A dies before its commit; replay B of
    the same range runs whole and restores them. A's commit (the commit task retried on its staged plan and manifest)
    would append them a second time: it is refused, terminal, naming the first such record, and nothing is committed.
    Rows are the source's once and the offsets unchanged; A run again finds nothing missing."""
    import tidewater.ops.replay as replay_ops
    from tidewater.errors import TerminalError
    from tidewater.steps.lifecycle import commit_step
    from tidewater.steps.write import load_manifest, load_plan

    spec, path = setup_table(broker, home, topic)
    before = content(path)
    table_of(path).delete("_kafka_partition = 0 and _kafka_offset >= 30")  # ten rows lost
    staged: list = []
    real_commit = replay_ops.commit_step

    def killed(spec_, plan, manifest):
        staged.append((plan, manifest))
        raise KeyboardInterrupt("killed before the commit")

    req = ReplayRequest(topic=topic, partitions=(0,), start_offset=0, end_offset=40, mode="append-missing")
    monkeypatch.setattr(replay_ops, "commit_step", killed)
    with pytest.raises(KeyboardInterrupt):
        run_replay(spec, req, out=None, inline=True)  # A: written, not committed
    monkeypatch.setattr(replay_ops, "commit_step", real_commit)
    run_replay(spec, req, out=None, inline=True)  # B: the same rows, committed
    assert content(path) == before
    snapshots = len(table_of(path).snapshots())
    ((plan, manifest),) = staged
    assert manifest.rows_in_files == 10
    plan_path = next(p for p in spec.staging_dir().rglob("plan.json") if p.parent.name == plan.batch_id)
    with pytest.raises(TerminalError, match="10 of the rows this replay would append are in the table already") as e:
        commit_step(spec, load_plan(plan_path), load_manifest(plan_path))
    assert (e.value.topic, e.value.partition, e.value.offset) == (topic, 0, 30)
    assert content(path) == before, "no row twice"
    assert len(table_of(path).snapshots()) == snapshots, "nothing committed"
    assert committed_state(table_of(path)).offsets == {topic: {0: 40, 1: 30}}
    result = run_replay(spec, req, out=None, inline=True)  # A again: the table holds every offset
    assert content(path) == before
    assert result["status"] in ("committed", "empty"), result


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"end_offset": 45}, "end_offset: 45 is beyond the committed offset 40"),
        ({"start_time": "2024-01-01T00:00:00"}, "give one pair, not both or neither"),
        ({"mode": "upsert"}, "mode: 'upsert' is not one of replace, append-missing"),
        ({"topic": "elsewhere"}, "topic: 'elsewhere' is not one of the pipeline's topics"),
        ({"partitions": (7,)}, "partitions: [7] do not exist"),
        ({"end_offset": 5}, "end_offset: 5 must be greater than start_offset 10"),
    ],
)
def test_parameters_are_checked_before_anything_runs(broker, home, topic, change, message):
    spec, path = setup_table(broker, home, topic)
    snapshots = len(table_of(path).snapshots())
    with pytest.raises(ConfigError) as e:  # an unknown mode already when the request is made
        req = ReplayRequest(**{**ReplayRequest(topic=topic, start_offset=10, end_offset=20).__dict__, **change})
        run_replay(spec, req, out=None, inline=True)
    assert message in str(e.value)
    assert len(table_of(path).snapshots()) == snapshots


def test_replay_needs_metadata_columns(broker, home, topic):
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["id"]}, format={"metadata": "none"}
    )
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(5)])
    spec = load_pipeline(path)
    ingest_inline(spec)
    with pytest.raises(ConfigError, match="format.metadata: replay needs the source of every row"):
        run_replay(spec, ReplayRequest(topic=topic, start_offset=0, end_offset=5), out=None, inline=True)


def test_replay_beside_a_scheduled_batch(broker, home, topic):
    """A replace replay and a scheduled batch of new records commit at the same time: both land, the
    replayed range is not duplicated, the new records are there once and the offsets are the batch's."""
    spec, path = setup_table(broker, home, topic)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(500 + i) for i in range(25)])
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def scheduled() -> None:
        try:
            barrier.wait()
            assert ingest_inline(spec).records == 25
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=scheduled)
    t.start()
    barrier.wait()
    result = run_replay(spec, ReplayRequest(topic=topic, start_offset=0, end_offset=40, partitions=(0,)), out=None, inline=True)
    t.join()
    assert errors == [] and result["status"] == "committed"
    rows = content(path)
    assert len(rows) == 95 and len({(p, o) for p, o, _ in rows}) == 95
    assert committed_state(table_of(path)).offsets == {topic: {0: 65, 1: 30}}


class TimestampLookupStandIn:
    """Stand-in for Kafka's ListOffsets by time (the embedded broker answers 0 to every lookup, see
    STACK.md): the earliest offset whose timestamp is at or after the time, from timestamps we chose."""

    def __init__(self, stamps: dict[int, list[int]]) -> None:
        self.stamps = stamps

    def offsets_for_times(self, topic: str, partitions: list[int], ms: int) -> dict[int, int]:
        return {p: next((o for o, t in enumerate(self.stamps[p]) if t >= ms), len(self.stamps[p])) for p in partitions}


def test_time_range_maps_to_offsets_with_the_timestamp_lookup(broker, home, topic):
    base = 1_704_067_200_000  # 2024-01-01T00:00:00Z; one record a minute
    stamps = {0: [base + i * 60_000 for i in range(40)], 1: [base + i * 60_000 for i in range(30)]}
    lookup = TimestampLookupStandIn(stamps)
    assert interval_offsets(lookup, topic, [0, 1], base + 5 * 60_000, base + 10 * 60_000 + 1) == {0: (5, 11), 1: (5, 11)}
    spec, path = setup_table(broker, home, topic)
    before = content(path)
    req = ReplayRequest(topic=topic, start_time="2024-01-01T00:05:00Z", end_time="2024-01-01T01:00:00+00:00")
    result = run_replay(spec, req, out=None, inline=True, lookup=lookup)
    # partition 0: [5, 40) (clipped to the committed 40); partition 1: [5, 30)
    assert [(r["partition"], r["start"], r["end"]) for r in result["preview"]] == [(0, 5, 40), (1, 5, 30)]
    assert result["rows"] == 35 + 25 and content(path) == before


@pytest.mark.slow
def test_replay_command_through_spark(broker, home, topic):
    """`tidewater replay` (spark-submit): dry run prints the preview and changes nothing; the replay
    replaces the range."""
    spec, path = setup_table(broker, home, topic)
    before, snaps = content(path), len(table_of(path).snapshots())
    cmd = [
        str(Path(sys.executable).parent / "tidewater"),
        "replay",
        "--pipeline",
        str(path),
        "--topic",
        topic,
        "--partitions",
        "0,1",
        "--start-offset",
        "0",
        "--end-offset",
        "20",
    ]
    dry = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert f"{topic}[0] [0, 20): 20 offsets; rows now 20, to delete 20, to add at most 20" in dry.stdout
    assert len(table_of(path).snapshots()) == snaps
    run = subprocess.run(cmd + ["--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout[run.stdout.index("{") :])
    assert (doc["status"], doc["rows"]) == ("committed", 40)
    assert content(path) == before
    ids = table_of(path).scan().to_arrow().column("id")
    assert len(pc.unique(ids)) == ids.length() == 70


def _run_planned(spec, planned):
    """The write, validate and commit tasks for what the plan task staged (write inline, not spark-submit)."""
    from tidewater.batch import manifest_path, write_json_atomic
    from tidewater.runtime.airflow import commit_task, validate_task
    from tidewater.source.kafka import kafka_settings
    from tidewater.steps.write import load_plan
    from tidewater.write.job import run_inline

    plan = load_plan(planned["plan_path"])
    write_json_atomic(manifest_path(planned["plan_path"]), run_inline(plan, spec, kafka_settings(spec)).to_json())
    validate_task(str(spec.source_path), planned)
    return commit_task(str(spec.source_path), planned, dag_run_id="backfill__test")


def test_backfill_of_committed_and_uncommitted_intervals(broker, home, topic):
    """The ingest DAG's plan task for backfill runs: an interval a batch committed is a no-op, or with
    reprocess (the run parameter, or a run cleared for a re-run) a replace of exactly that batch's ranges
    (table identical); an interval never ingested is
    mapped to offsets (timestamp-lookup stand-in) and only absent offsets are added."""
    from tidewater.plan.backfill import plan_backfill
    from tidewater.runtime.airflow import plan_task
    from tidewater.table.summary import DATA_INTERVAL, RANGES

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"metadata": "prefixed"},
        validation={"not_null": ["id"]},
    )
    spec = load_pipeline(path)
    i1 = ("2024-01-01T00:05:00+00:00", "2024-01-01T00:10:00+00:00")
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(20)], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, [ev(100 + i) for i in range(10)])
    planned = plan_task(str(path), run_type="scheduled", data_interval=i1)
    assert _run_planned(spec, planned)["status"] == "committed"
    props = table_of(path).current_snapshot().summary.additional_properties
    assert props[DATA_INTERVAL] == "/".join(i1) and json.loads(props[RANGES]) == [[topic, 0, 0, 20], [topic, 1, 0, 10]]
    before, snaps = content(path), len(table_of(path).snapshots())

    assert plan_task(str(path), run_type="backfill", data_interval=i1) is None  # committed: nothing to do
    assert len(table_of(path).snapshots()) == snaps

    planned = plan_task(str(path), run_type="backfill", data_interval=i1, reprocess=True)
    assert planned["mode"] == "replace"
    assert _run_planned(spec, planned)["status"] == "committed"
    assert content(path) == before
    replayed = json.loads(table_of(path).current_snapshot().summary.additional_properties[REPLAY])
    assert replayed == {"mode": "replace", "ranges": [[topic, 0, 0, 20], [topic, 1, 0, 10]], "data_interval": list(i1)}
    assert committed_state(table_of(path)).offsets == {topic: {0: 20, 1: 10}}
    # a backfill run that re-runs an earlier run (Airflow's Reprocess Behavior "All Runs" clears it) re-ingests
    # without the run parameter, which Airflow's backfill form does not send by default
    planned = plan_task(str(path), run_type="backfill", data_interval=i1, cleared=1)
    assert planned is not None and planned["mode"] == "replace"
    assert _run_planned(spec, planned)["status"] == "committed" and content(path) == before
    assert committed_state(table_of(path)).offsets == {topic: {0: 20, 1: 10}}

    # an earlier interval no batch recorded: the records of 00:00-00:05 are offsets [0, 5) of each partition
    table_of(path).delete("_kafka_partition = 0 and _kafka_offset < 3")  # three rows lost
    base = 1_704_067_200_000
    lookup = TimestampLookupStandIn({0: [base + i * 60_000 for i in range(20)], 1: [base + i * 60_000 for i in range(10)]})
    plan, plan_path = plan_backfill(spec, ("2024-01-01T00:00:00+00:00", "2024-01-01T00:05:00+00:00"), lookup=lookup)
    assert plan.mode == "append-missing" and [(r.partition, r.start, r.end) for r in plan.ranges] == [(0, 0, 5), (1, 0, 5)]
    result = _run_planned(spec, {"batch_id": plan.batch_id, "plan_path": str(plan_path), "table": plan.table})
    assert result["status"] == "committed" and content(path) == before
    assert committed_state(table_of(path)).offsets == {topic: {0: 20, 1: 10}}


def test_rows_written_before_metadata_was_enabled_block_a_replay(broker, home, topic):
    """A table filled without metadata columns, then switched to format.metadata prefixed: its old rows
    cannot be matched to offsets, so a replay is refused (it would add their records again)."""
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["id"]}, format={"metadata": "none"}
    )
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(5)])
    ingest_inline(load_pipeline(path))
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"not_null": ["id"]},
        format={"metadata": "prefixed"},
    )
    produce_to_partition(broker.bootstrap, topic, 0, [ev(10 + i) for i in range(5)])
    spec = load_pipeline(path)
    ingest_inline(spec)
    snaps = len(table_of(path).snapshots())
    with pytest.raises(ConfigError, match="5 rows of rpc.orders have no _kafka_offset"):
        run_replay(spec, ReplayRequest(topic=topic, start_offset=5, end_offset=10), out=None, inline=True)
    assert len(table_of(path).snapshots()) == snaps and table_of(path).scan().to_arrow().num_rows == 10
