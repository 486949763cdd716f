"""`tidewater run`'s progress lines (runtime/progress.py) from the facts each step reports, without a batch: what
the commit line says for a plain table, a change table and a routed pipeline, and the steps' lines in order. The gate's
report and the commit result are stand-ins (SimpleNamespace) with the fields the lines read; the batch's own run is
tests/integration/test_cli.py's and test_object_storage.py's."""

from __future__ import annotations

from types import SimpleNamespace

from tidewater.batch import BatchManifest, StagedFile, TableOutput
from tidewater.config.parse import parse_pipeline
from tidewater.runtime.progress import BatchProgress, committing_what

KAFKA = {"bootstrap_servers": "h:1"}


def _manifest(*tables: tuple[str, int]) -> BatchManifest:
    outputs = tuple(
        TableOutput(t, tuple(StagedFile(f"/w/{t}-{i}.parquet", 1, 10, 0) for i in range(files)), files, 0, {}) for t, files in tables
    )
    return BatchManifest("b1", tables[0][0] if tables else "", (), (), 0, "2026-11-27T00:00:00Z", outputs=outputs)


def test_the_commit_line_says_how_each_table_is_committed_and_where_the_offsets_land():
    plain = parse_pipeline({"name": "p", "topics": ["t"], "kafka": KAFKA, "table": {"identifier": "db.p"}})
    assert committing_what(plain, _manifest(("db.p", 2))) == "db.p: rows appended, the offsets in the same snapshot"
    assert committing_what(plain, _manifest(("db.p", 0))) == "db.p: no rows, the offsets in the same snapshot"
    changes = parse_pipeline(
        {"name": "c", "topics": ["t"], "kafka": KAFKA, "table": {"identifier": "db.c", "upsert": True, "id_columns": ["id"]}}
    )
    assert committing_what(changes, _manifest(("db.c", 1))) == ("db.c: changes by key (one row delta), the offsets in the same snapshot")
    routed = parse_pipeline(
        {
            "name": "r",
            "topics": ["t"],
            "kafka": KAFKA,
            "table": {"identifier": ""},
            "routing": {"namespace": "ev", "field": "k", "dynamic": True, "table_template": "ev_{value}"},
        }
    )
    holder = routed.targets.holder
    assert committing_what(routed, _manifest(("ev.ev_a", 1), ("ev.ev_b", 0), ("ev.ev_c", 2))) == (
        f"2 table(s) once each: ev.ev_a (rows appended), ev.ev_c (rows appended); then the offsets in {holder}"
    )
    assert committing_what(routed, _manifest()) == f"no rows for any table; the offsets in {holder}"


def test_each_step_prints_what_it_did_and_the_spark_job_ticks_every_ten_seconds():
    lines: list[str] = []
    say = BatchProgress(lines.append)
    spec = parse_pipeline({"name": "p", "topics": ["t"], "kafka": KAFKA, "table": {"identifier": "db.p"}})
    say("planning", spec=spec)
    say("writing", spec=spec)
    for s in (3.0, 10.5, 12.0, 21.0):
        say("running", seconds=s)
    manifest = _manifest(("db.p", 2))
    say("written", manifest=manifest, seconds=1.0)
    say("validated", report=SimpleNamespace(checks=[SimpleNamespace(success=True), SimpleNamespace(success=False)]), seconds=0.5)
    say("committing", spec=spec, manifest=manifest)
    table = SimpleNamespace(table="db.p", status="committed", snapshot_id=7, rows=2, holds_rows=True)
    say("committed", result=SimpleNamespace(tables=[table], status="committed", records=2), seconds=0.2, total=4.0)
    assert [ln.split()[0] for ln in lines if ln.startswith("[")] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert [ln.strip() for ln in lines if "spark job running" in ln] == ["... spark job running, 10s", "... spark job running, 21s"]
    assert "      1/2 expectations passed (0.5s)" in lines
    assert "[4/4] commit   db.p: rows appended, the offsets in the same snapshot" in lines
    assert "      db.p: committed, snapshot 7, 2 row(s)" in lines
