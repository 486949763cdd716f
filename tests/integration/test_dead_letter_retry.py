"""Dead letters retried and dropped (``tidewater dead-letters``, ``ops/dead_letters.py``) through the real broker and
catalog: the letters that now pass land once, as a batch of their own, with the offsets unchanged; those that fail
again stay letters with their new error; the audit (and ``--deep``) counts resolved and dropped letters; a retry
killed between its commits lands once on the next run; change tables apply retried changes in source order or
refuse them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml

from tests.conftest import (
    REPO,
    ingest_inline,
    null_order_ids,
    produce_to_partition,
    race,
    stage_inline,
    table_of,
    write_pipeline,
)
from tidewater.audit.pipeline import audit
from tidewater.config.parse import load_pipeline
from tidewater.ops import dead_letters
from tidewater.ops.overview import lag_history, run_detail
from tidewater.runtime.cli import main
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table import letters as state
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state, find_batch_snapshot
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]


def _relax(path: Path) -> None:
    """The operator's fix: the pipeline no longer requires order_id."""
    doc = yaml.safe_load(path.read_text())
    doc["validation"] = {"not_null": []}
    path.write_text(yaml.safe_dump(doc))


def _counts(spec) -> dict[str, int]:
    """The counts the view and the audit read: kept by the commits (both properties current) and equal to the
    letters counted from the tables."""
    catalog = load_catalog(spec)
    dlq = load_table(catalog, spec.dead_letter_table())
    assert state.kept(dlq, state.KEPT_TOTALS) is not None
    resolutions = load_table(catalog, spec.dead_letter_table() + "_resolutions")
    if resolutions is not None and resolutions.current_snapshot() is not None:
        assert state.kept(resolutions, state.KEPT_STATES) is not None
    kept = state.counts(spec, catalog)
    assert kept == state.scanned(spec, catalog)
    return kept


def _plain(home: Path, broker, topic: str) -> Path:
    """A plain pipeline whose batch dead-letters 3 records without an order_id and 2 that are not JSON."""
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"not_null": ["order_id"], "not_null_policy": "dead_letter"},
    )
    good = pizza_events(10, seed=301)
    produce_to_partition(broker.bootstrap, topic, 0, good[:4] + null_order_ids(3, 302) + [b"{nope", b"[1"] + good[4:])
    result = ingest_inline(load_pipeline(path))
    assert (result.records, result.dead_letters) == (15, 5)
    return path


def test_retry_commits_the_letters_that_now_pass_once_and_keeps_those_that_fail_again(broker, home, topic, capsys):
    """After the fix, a retry commits the 3 records once as its own batch (a snapshot with its id, the offsets
    unchanged), marks them resolved pointing to that snapshot; the 2 broken ones stay open with their new error. A
    second retry commits nothing more; the audit and --deep are clean; the dead-letter table still holds 5 rows."""
    path = _plain(home, broker, topic)
    spec = load_pipeline(path)
    assert _counts(spec)["open"] == 5
    assert main(["dead-letters", "retry", "--pipeline", str(path), "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert (dry["status"], dry["letters"], dry["by_class"]) == ("dry-run", 5, {"NullInRequiredColumn": 3, "InvalidJson": 2}), dry
    assert table_of(path).scan().to_arrow().num_rows == 10  # the dry run changed nothing

    _relax(path)
    spec = load_pipeline(path)
    before = committed_state(table_of(path)).offsets
    assert main(["dead-letters", "retry", "--pipeline", str(path), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["letters"], done["resolved"], done["failed_again"], done["rows"]) == (5, 3, 2, 3), done
    table = table_of(path)
    rows = table.scan().to_arrow()
    assert rows.num_rows == 13 and sorted(rows.column("_kafka_offset").to_pylist()) == list(range(15))[:4] + [4, 5, 6] + list(range(9, 15))
    assert committed_state(table).offsets == before == {topic: {0: 15}}
    snap = find_batch_snapshot(table, done["batch_id"])
    assert snap is not None and done["snapshots"] == {spec.table.identifier: str(snap.snapshot_id)}

    resolved = state.letters(spec, state="resolved")
    assert sorted(resolved.column("offset").to_pylist()) == [4, 5, 6]
    assert {json.loads(s)[spec.table.identifier] for s in resolved.column("snapshots").to_pylist()} == {str(snap.snapshot_id)}
    still = state.letters(spec, state="open")
    assert sorted(still.column("offset").to_pylist()) == [7, 8]
    assert all(r.startswith("InvalidJson: JSON parse error") for r in still.column("reason").to_pylist()), still.column("reason")
    dlq = load_table(load_catalog(spec), spec.dead_letter_table())
    assert dlq.scan().to_arrow().num_rows == 5  # nothing new in the dead-letter table

    again = dead_letters.retry(spec)  # the two broken ones fail again; nothing is committed for them
    assert (again["resolved"], again["failed_again"], again["status"]) == (0, 2, "nothing-to-commit"), again
    assert table_of(path).scan().to_arrow().num_rows == 13 and len(table_of(path).snapshots()) == len(table.snapshots())
    assert _counts(spec) == {"open": 2, "retrying": 0, "resolved": 3, "skipped": 0, "dropped": 0, "total": 5}

    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
    assert any("3 resolved" in f.text() for f in report.findings), [f.text() for f in report.findings]


def test_drop_gives_letters_up_with_a_reason_and_the_audit_counts_them(broker, home, topic):
    """`dead-letters drop` needs a reason; the dropped letters are no longer open, a retry leaves them alone, and the
    deep audit counts them as dead letters given up (no offset unaccounted for)."""
    path = _plain(home, broker, topic)
    spec = load_pipeline(path)
    assert main(["dead-letters", "drop", "--pipeline", str(path), "--class", "InvalidJson"]) == 2  # no reason
    assert (
        main(["dead-letters", "drop", "--pipeline", str(path), "--class", "InvalidJson", "--reason", "garbage from a test producer"]) == 0
    )
    dropped = state.letters(spec, state="dropped")
    assert sorted(dropped.column("offset").to_pylist()) == [7, 8]
    assert set(dropped.column("reason").to_pylist()) == {"garbage from a test producer"}
    _relax(path)
    spec = load_pipeline(path)
    assert dead_letters.retry(spec)["resolved"] == 3
    assert dead_letters.retry(spec)["status"] == "nothing-to-retry"
    assert _counts(spec) == {"open": 0, "retrying": 0, "resolved": 3, "skipped": 0, "dropped": 2, "total": 5}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
    assert any("2 dropped" in f.text() for f in report.findings)


# Where a retry's process is killed: code run in it just before that step (the step never starts).
KILL_POINTS = {
    # claimed, nothing written or committed yet
    "before-the-records-commit": ("commit_step", "tidewater.ops.dead_letters", 13 - 3),
    # the records committed, their letters not yet marked
    "before-the-outcome": ("_outcome", "tidewater.ops.dead_letters", 13),
}


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_retry_killed_between_its_commits_lands_once_on_the_next_run(broker, home, topic, point):
    """The retry's process is killed (SIGKILL) after it claimed the letters, before the records' commit or before their
    outcome is recorded: the letters stay claimed; the next retry finishes that retry with its batch id (the rows are
    committed once: by it, or found committed), records the outcome, and a third run is a no-op. Rows counted,
    offsets checked, deep audit clean."""
    path = _plain(home, broker, topic)
    _relax(path)
    spec = load_pipeline(path)
    name, module, rows_at_kill = KILL_POINTS[point]
    code = f"""
import importlib, os, signal, sys
sys.path.insert(0, {str(REPO / "include")!r})
from tidewater.config.parse import load_pipeline
from tidewater.ops import dead_letters as d
target = importlib.import_module({module!r})
def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
setattr(target, {name!r}, killed)
d.retry(load_pipeline({str(path)!r}))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=os.environ.copy(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == rows_at_kill
    claimed = state.letters(spec, state="retrying")
    assert claimed.num_rows == 5 and len(set(claimed.column("action_id").to_pylist())) == 1
    rid = claimed.column("action_id")[0].as_py()

    result = dead_letters.retry(spec)
    assert [f["batch_id"] for f in result["finished"]] == [rid]
    assert result["finished"][0]["status"] == ("committed" if point == "before-the-records-commit" else "already-committed")
    assert result["finished"][0]["resolved"] == 3
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 13
    assert sum(1 for s in table.snapshots() if (s.summary.additional_properties or {}).get("tidewater.batch-id") == rid) == 1
    assert committed_state(table).offsets == {topic: {0: 15}}
    assert dead_letters.retry(spec)["resolved"] == 0
    assert _counts(spec)["resolved"] == 3 and _counts(spec)["retrying"] == 0
    if point == "before-the-outcome":  # the rerun's own files for rows already committed were removed (a kill before
        # the commit leaves the killed write's files to orphan removal, as any killed write step does)
        on_disk = {str(f) for f in Path(table.location().removeprefix("file://"), "data").rglob("*.parquet")}
        referenced = {f.removeprefix("file://") for f in table.inspect.files().column("file_path").to_pylist()}
        assert on_disk == referenced, on_disk - referenced
    offsets = table.scan().to_arrow().column("_kafka_offset")
    assert pc.count_distinct(offsets).as_py() == 13
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_retry_reads_the_stored_records_when_kafka_no_longer_holds_them(broker, home, topic):
    """The letters' records are decoded from the dead-letter table: with the pipeline pointed at a broker that is not
    there (as when retention removed the records), the retry still lands them."""
    path = _plain(home, broker, topic)
    doc = yaml.safe_load(path.read_text())
    doc["validation"] = {"not_null": []}
    doc["kafka"]["bootstrap_servers"] = "127.0.0.1:9"  # nothing listens there
    path.write_text(yaml.safe_dump(doc))
    result = dead_letters.retry(load_pipeline(path))
    assert (result["resolved"], result["failed_again"], result["rows"]) == (3, 2, 3), result
    assert table_of(path).scan().to_arrow().num_rows == 13


def _change(i: int, op: str, item: str | None, price: float = 1.0) -> bytes:
    return json.dumps({"id": i, "item": item, "price": price, "op": op}).encode()


def test_change_table_retry_applies_in_source_order_or_refuses(broker, home, topic):
    """A change table (op field, one partition) whose changes with a null `item` were dead-lettered. After the fix the
    retry applies a key's change when no later change of the key is applied (id 1: an update after its insert; id 3:
    an insert with no later change) and refuses it when one is (id 2: a later update is the row; id 4: deleted later,
    no row left). The table equals the reference model of the source with the refused changes still missing, the
    refused letters stay open with their reason, offsets unchanged, the audit clean."""
    path = write_pipeline(
        home,
        name="prices",
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": "rpc.prices", "id_columns": ["id"], "op_field": "op"},
        validation={"not_null": ["id", "item"], "not_null_policy": "dead_letter"},
    )
    spec = load_pipeline(path)
    produce_to_partition(
        broker.bootstrap, topic, 0, [_change(1, "I", "a"), _change(2, "I", "b"), _change(3, "I", None), _change(4, "I", "d")]
    )
    assert ingest_inline(spec).dead_letters == 1
    produce_to_partition(
        broker.bootstrap,
        topic,
        0,
        [
            _change(1, "U", None, 2.0),
            _change(2, "U", None, 2.0),
            _change(2, "U", "b3", 3.0),
            _change(4, "U", None, 2.0),
            _change(4, "D", "d", 2.0),
        ],
    )
    assert ingest_inline(spec).dead_letters == 3
    table = load_table(load_catalog(spec), "rpc.prices")
    assert {r["id"]: r["item"] for r in table.scan().to_arrow().to_pylist()} == {1: "a", 2: "b3"}

    doc = yaml.safe_load(path.read_text())
    doc["validation"] = {"not_null": ["id"]}
    path.write_text(yaml.safe_dump(doc))
    spec = load_pipeline(path)
    result = dead_letters.retry(spec)
    assert (result["letters"], result["resolved"], result["refused"], result["failed_again"]) == (4, 2, 2, 0), result
    table = load_table(load_catalog(spec), "rpc.prices")
    got = {r["id"]: (r["item"], r["price"]) for r in table.scan().to_arrow().to_pylist()}
    # the source's table with the two refused changes missing: id 1 updated (item null), id 3 inserted
    assert got == {1: (None, 2.0), 2: ("b3", 3.0), 3: (None, 1.0)}, got
    assert committed_state(table).offsets == {topic: {0: 9}}
    refused = state.letters(spec, state="open")
    assert sorted(refused.column("offset").to_pylist()) == [5, 7]
    reasons = dict(zip(refused.column("offset").to_pylist(), refused.column("reason").to_pylist()))
    assert "later change of the key is applied (its row comes from partition 0 offset 6)" in reasons[5], reasons
    assert "removed by snapshot" in reasons[7], reasons
    assert sorted(state.letters(spec, state="resolved").column("offset").to_pylist()) == [2, 4]
    again = dead_letters.retry(spec)  # the refused ones are refused again; nothing changes
    assert (again["refused"], again["resolved"]) == (2, 0), again
    assert {r["id"]: (r["item"], r["price"]) for r in load_table(load_catalog(spec), "rpc.prices").scan().to_arrow().to_pylist()} == got
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_routed_retry_commits_each_table_once_and_keeps_the_checkpoint(broker, home, topic):
    """A routed pipeline (two topics, two tables) whose records without a `name` were dead-lettered: one retry lands
    them in both tables as one batch (each table's snapshot carries its id, the checkpoint does not move), the
    letters point to both snapshots; a second retry is a no-op; the deep audit is clean."""
    a, b = topic + "-a", topic + "-b"
    path = write_pipeline(
        home,
        name="routed",
        topics=[a, b],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": ""},
        routing={"namespace": "rpc"},
        tables=[{"identifier": "rpc.ra", "topics": [a]}, {"identifier": "rpc.rb", "topics": [b]}],
        validation={"not_null": ["name"], "not_null_policy": "dead_letter"},
    )
    spec = load_pipeline(path)
    ev = [json.dumps({"id": i, "name": None if i % 3 == 0 else f"n{i}"}).encode() for i in range(9)]
    produce_to_partition(broker.bootstrap, a, 0, ev)
    produce_to_partition(broker.bootstrap, b, 0, ev[:6])
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    assert commit_step(spec, plan, manifest, dag_run_id="manual__r1").dead_letters == 5
    run = run_detail(spec, "manual__r1")  # the DAG run tab's data: the batch per table and partition
    assert (run["found"], run["batch_id"], run["records"], run["dead_letters"], run["rows"]) == (True, plan.batch_id, 15, 5, 10)
    assert {t["table"] for t in run["tables"]} == {spec.checkpoint_table(), "rpc.ra", "rpc.rb"}
    assert sorted((r["topic"], r["start_offset"], r["end_offset"]) for r in run["ranges"]) == [(a, 0, 9), (b, 0, 6)]
    assert {t["table"]: t["rows"] for t in run["tables"] if t["table"] != spec.checkpoint_table()} == {"rpc.ra": 6, "rpc.rb": 4}
    assert run["offsets"] == {a: {"0": 9}, b: {"0": 6}}
    assert run_detail(spec, "manual__none")["found"] is False
    assert [p["lag"] for p in lag_history(spec)] == [15]
    catalog = load_catalog(spec)
    before = committed_state(load_table(catalog, spec.checkpoint_table())).offsets
    doc = yaml.safe_load(path.read_text())
    doc["validation"] = {"not_null": []}
    path.write_text(yaml.safe_dump(doc))
    spec = load_pipeline(path)
    result = dead_letters.retry(spec)
    assert (result["letters"], result["resolved"], result["rows"]) == (5, 5, 5), result
    assert sorted(result["snapshots"]) == ["rpc.ra", "rpc.rb"]
    catalog = load_catalog(spec)
    assert load_table(catalog, "rpc.ra").scan().to_arrow().num_rows == 9
    assert load_table(catalog, "rpc.rb").scan().to_arrow().num_rows == 6
    assert committed_state(load_table(catalog, spec.checkpoint_table())).offsets == before == {a: {0: 9}, b: {0: 6}}
    for ident in ("rpc.ra", "rpc.rb"):
        assert find_batch_snapshot(load_table(catalog, ident), result["batch_id"]) is not None
    assert dead_letters.retry(spec)["status"] == "nothing-to-retry"
    assert load_table(catalog, "rpc.ra").scan().to_arrow().num_rows == 9
    assert _counts(spec) == {"open": 0, "retrying": 0, "resolved": 5, "skipped": 0, "dropped": 0, "total": 5}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_two_retries_at_once_commit_each_letter_once(broker, home, topic):
    """Two retries of the same letters start together (threads, one catalog): each letter is claimed by one of them
    (the claim is checked on the resolution table as each commit attempt loads it), so every record lands once. The
    two undecodable letters are dropped first: one that failed again is open again, and a later retry may take it."""
    import threading

    path = _plain(home, broker, topic)
    _relax(path)
    spec = load_pipeline(path)
    assert dead_letters.drop(spec, reason="not JSON", error_class="InvalidJson")["letters"] == 2
    results: list[dict] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run() -> None:
        start.wait()
        try:
            results.append(dead_letters.retry(spec))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == [] and len(results) == 2, (errors, results)
    assert sum(r.get("letters", 0) for r in results) == 3, results  # every letter claimed by exactly one retry
    assert sum(r.get("resolved", 0) for r in results) == 3, results
    rows = table_of(path).scan().to_arrow()
    assert rows.num_rows == 13 and pc.count_distinct(rows.column("_kafka_offset")).as_py() == 13
    assert committed_state(table_of(path)).offsets == {topic: {0: 15}}
    assert _counts(spec)["resolved"] == 3


def test_an_abandoned_ingest_batch_after_a_retry_still_has_its_columns_undone(broker, home, topic):
    """A retry's snapshot on the table is not an ingest batch: an ingest batch written after it (adding a column) and
    never committed is still found abandoned by the next plan step and its column undone (a retry's batch id sorts
    after every ingest batch id, and must not hide them)."""
    from tidewater.steps.lifecycle import revert_abandoned

    path = _plain(home, broker, topic)
    _relax(path)
    spec = load_pipeline(path)
    assert dead_letters.retry(spec)["resolved"] == 3
    doc = json.loads(pizza_events(1, seed=310)[0])
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({**doc, "tip": 2.5}).encode()])
    plan, _manifest = stage_inline(spec)  # written, its new column provisional, never committed
    assert "tip" in table_of(path).schema().column_names
    assert revert_abandoned(spec) == [plan.batch_id]
    assert "tip" not in table_of(path).schema().column_names
    assert table_of(path).scan().to_arrow().num_rows == 13


def test_letters_the_new_settings_skip_are_marked_skipped_not_resolved(broker, home, topic):
    """A routed pipeline dead-letters the records no route takes (`unmatched: dead_letter`); the operator decides they
    are to be skipped (`unmatched: skip`) and retries: the letters are marked skipped (no table holds them), not
    resolved; nothing is committed; the deep audit is clean."""

    def routed(unmatched: str) -> Path:
        return write_pipeline(
            home,
            name="typed",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            table={"identifier": ""},
            routing={"namespace": "rpc", "field": "kind", "unmatched": unmatched},
            tables=[{"identifier": "rpc.pay", "route_regex": "pay"}],
            validation={"not_null": []},
        )

    spec = load_pipeline(routed("dead_letter"))
    values = [json.dumps({"id": i, "kind": "pay" if i < 3 else "other"}).encode() for i in range(5)]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    assert ingest_inline(spec).dead_letters == 2
    spec = load_pipeline(routed("skip"))
    result = dead_letters.retry(spec)
    assert (result["letters"], result["resolved"], result["status"]) == (2, 0, "nothing-to-commit"), result
    assert _counts(spec) == {"open": 0, "retrying": 0, "resolved": 0, "skipped": 2, "dropped": 0, "total": 2}
    assert load_table(load_catalog(spec), "rpc.pay").scan().to_arrow().num_rows == 3
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_a_retry_the_quality_gate_rejects_commits_nothing_and_releases_its_letters(broker, home, topic):
    """The operator switches `not_null_policy` to `fail` and retries the letters without an order_id: they decode, the
    quality gate fails on them, nothing is committed and the claimed letters are open again with the gate's error as
    their reason (a later retry may take them)."""
    from tidewater.errors import ValidationFailedError

    path = _plain(home, broker, topic)
    doc = yaml.safe_load(path.read_text())
    doc["validation"] = {"not_null": ["order_id"], "not_null_policy": "fail"}
    path.write_text(yaml.safe_dump(doc))
    spec = load_pipeline(path)
    snapshots = len(table_of(path).snapshots())
    with pytest.raises(ValidationFailedError):
        dead_letters.retry(spec, error_class="NullInRequiredColumn")
    assert table_of(path).scan().to_arrow().num_rows == 10 and len(table_of(path).snapshots()) == snapshots
    released = state.letters(spec, state="open", error_class="NullInRequiredColumn")
    assert released.num_rows == 3 and set(released.column("state").to_pylist()) == {"released"}
    assert all("order_id" in r for r in released.column("reason").to_pylist()), released.column("reason")
    assert _counts(spec)["retrying"] == 0
    _relax(path)
    assert dead_letters.retry(load_pipeline(path), error_class="NullInRequiredColumn")["resolved"] == 3


def test_a_refusal_lands_on_its_own_topics_letter_when_two_topics_share_an_offset(broker, home, topic):
    """A routed retry over two topics whose letters sit at the same partition and offset: topic a's letter (an update
    of id 2 to a null item, followed by a later update that is the row) is refused by the change table rpc.ca; topic
    b's letter (a row with a null item) is appended to rpc.hb. Expected: a's letter stays open with the refusal's
    reason, b's is resolved, rpc.hb holds all 4 rows and rpc.ca the source's rows (before the fix the refusal, keyed
    by partition and offset only, also fell on b's letter, which stayed open though its row had landed)."""
    a, b = topic + "-a", topic + "-b"
    path = write_pipeline(
        home,
        name="two",
        topics=[a, b],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": ""},
        routing={"namespace": "rpc"},
        format={"metadata": "prefixed"},
        tables=[{"identifier": "rpc.ca", "topics": [a], "id_columns": ["id"], "op_field": "op"}, {"identifier": "rpc.hb", "topics": [b]}],
        validation={"not_null": ["id", "item"], "not_null_policy": "dead_letter"},
    )
    spec = load_pipeline(path)
    produce_to_partition(
        broker.bootstrap, a, 0, [_change(1, "I", "a"), _change(2, "I", "b"), _change(2, "U", None, 2.0), _change(2, "U", "b3", 3.0)]
    )
    produce_to_partition(broker.bootstrap, b, 0, [json.dumps({"id": i, "item": None if i == 2 else f"i{i}"}).encode() for i in range(4)])
    assert ingest_inline(spec).dead_letters == 2
    assert sorted((r["topic"], r["offset"]) for r in state.letters(spec).to_pylist()) == [(a, 2), (b, 2)]
    doc = yaml.safe_load(path.read_text())
    doc["validation"] = {"not_null": ["id"]}
    path.write_text(yaml.safe_dump(doc))
    spec = load_pipeline(path)

    result = dead_letters.retry(spec)
    assert (result["letters"], result["resolved"], result["refused"]) == (2, 1, 1), result
    opened = state.letters(spec, state="open").to_pylist()
    assert [(r["topic"], r["offset"]) for r in opened] == [(a, 2)]
    assert "later change of the key is applied" in opened[0]["reason"]
    assert [(r["topic"], r["offset"]) for r in state.letters(spec, state="resolved").to_pylist()] == [(b, 2)]
    catalog = load_catalog(spec)
    assert sorted(load_table(catalog, "rpc.hb").scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 3]
    assert {r["id"]: r["item"] for r in load_table(catalog, "rpc.ca").scan().to_arrow().to_pylist()} == {1: "a", 2: "b3"}


def test_letter_counts_written_by_another_writer_are_counted_then_kept_again(broker, home, topic):
    """A dead letter appended by another writer (a hand-made append) makes the kept count stale: the counts are taken
    from the tables meanwhile (the extra letter counted), and the next batch's dead-letter commit keeps them again."""
    spec = load_pipeline(_plain(home, broker, topic))
    assert _counts(spec) == {"open": 5, "retrying": 0, "resolved": 0, "skipped": 0, "dropped": 0, "total": 5}
    catalog = load_catalog(spec)
    dlq = load_table(catalog, spec.dead_letter_table())
    one = dlq.scan(limit=1).to_arrow()
    dlq.append(one.set_column(one.schema.get_field_index("offset"), "offset", pc.add(one.column("offset"), 1000)))
    dlq = load_table(catalog, spec.dead_letter_table())
    assert state.kept(dlq, state.KEPT_TOTALS) is None
    assert state.counts(spec, catalog) == state.scanned(spec, catalog)
    assert state.counts(spec, catalog)["total"] == 6
    produce_to_partition(broker.bootstrap, topic, 0, [b"{bad"])
    assert ingest_inline(spec).dead_letters == 1
    assert _counts(spec)["total"] == 7


def test_two_pipelines_sharing_a_dead_letter_table_keep_each_ones_count_when_they_commit_at_once(broker, home, topic):
    """Two pipelines write their dead letters to one table and commit three batches each at the same time (threads,
    one catalog): each commit of letters keeps both pipelines' counts (a conflict refreshes the table and counts
    again), so the kept counts are each pipeline's letters and the table's rows."""
    specs = []
    for name in ("north", "south"):
        path = write_pipeline(
            home,
            name=name,
            topics=[f"{topic}-{name}"],
            kafka={"bootstrap_servers": broker.bootstrap},
            table={"identifier": f"rpc.{name}"},
            dead_letter={"table": "rpc.shared_dead_letters"},
        )
        specs.append(load_pipeline(path))

    def batches(spec) -> None:
        for i in range(3):
            produce_to_partition(broker.bootstrap, spec.topics[0], 0, pizza_events(2, seed=400 + i) + [b"{bad"] * (i + 1))
            assert ingest_inline(spec).dead_letters == i + 1

    assert race(*(lambda s=s: batches(s) for s in specs)) == [None, None]
    dlq = load_table(load_catalog(specs[0]), "rpc.shared_dead_letters")
    assert state.kept(dlq, state.KEPT_TOTALS) == {"rows": 12, "pipelines": {"north": 6, "south": 6}}
    for spec in specs:
        assert _counts(spec) == {"open": 6, "retrying": 0, "resolved": 0, "skipped": 0, "dropped": 0, "total": 6}
