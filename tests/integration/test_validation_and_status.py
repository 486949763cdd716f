"""The data-quality gate and the status command, on the real broker and catalog.

Files are staged in-process (``write.job.run_inline``, the same task code Spark runs); validation and
commit are exactly what the DAG and `tidewater run` call."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import produce_to_partition, stage_inline, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError, ValidationFailedError
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration]


def test_failing_suite_blocks_the_commit_with_a_readable_report(broker, home, topic):
    """A suite expecting store_id <= 5 fails on pizza data: ValidationFailedError listing the failed
    expectation with its unexpected count; no snapshot, offsets unchanged."""
    (home / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 1, "max_value": 5}}
                ]
            }
        )
    )
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["order_id"], "suite": "strict.json"}
    )
    spec = load_pipeline(path)
    produce(broker.bootstrap, topic, pizza_events(200, seed=41), partitions=2)
    plan, manifest = stage_inline(spec)
    with pytest.raises(ValidationFailedError) as e:
        validate_step(spec, plan, manifest)
    report = str(e.value)
    assert "FAIL expect_column_values_to_be_between(column='store_id'" in report
    assert "unexpected_count=" in report
    assert "ok   expect_table_row_count_to_equal(value=200)" in report
    assert "Nothing was committed" in report
    assert table_of(path) is None, "the table the rejected first batch created is dropped again"


def test_row_wise_expectations_run_in_chunks_with_exact_counts(broker, home, topic):
    """validation.chunk_rows=30 over 200 rows in several files: the row-wise expectation runs chunk by
    chunk (no chunk above 30 rows) and the report's counts are the exact totals over the batch; a
    whole-column expectation (uniqueness) sees the whole batch."""
    from tidewater.quality.gate import chunks
    from tidewater.table.catalog import load_catalog, load_table

    (home / "mixed.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 1, "max_value": 20}},
                    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "order_id"}},
                ]
            }
        )
    )
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        batch={"records_per_task": 45},
        validation={"not_null": ["order_id"], "suite": "mixed.json", "chunk_rows": 30},
    )
    spec = load_pipeline(path)
    events = pizza_events(200, seed=45)
    produce(broker.bootstrap, topic, events, partitions=2)
    expected_bad = sum(1 for e in events if not 1 <= json.loads(e)["store_id"] <= 20)
    assert 0 < expected_bad < 200
    plan, manifest = stage_inline(spec)
    assert len(manifest.data_files) > 1
    table = load_table(load_catalog(spec), spec.table.identifier)
    sizes = [t.num_rows for t in chunks(table, manifest, ["store_id"], 30)]
    assert sum(sizes) == 200 and max(sizes) <= 30 and len(sizes) >= 7
    with pytest.raises(ValidationFailedError) as e:
        validate_step(spec, plan, manifest)
    report = str(e.value)
    assert f"unexpected_count={expected_bad}" in report
    assert "element_count=200" in report
    assert "ok   expect_column_values_to_be_unique(column='order_id')" in report
    assert "ok   expect_column_values_to_not_be_null(column='order_id')" in report


def test_null_in_required_column_fails_the_gate(broker, home, topic):
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["order_id", "store_id"]}
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [b'{"order_id": "a", "store_id": 1}', b'{"order_id": "b"}'])
    plan, manifest = stage_inline(spec)
    with pytest.raises(ValidationFailedError, match=r"FAIL expect_column_values_to_not_be_null\(column='store_id'\)"):
        validate_step(spec, plan, manifest)


def test_status_reports_committed_end_and_lag(broker, pipeline_file, topic):
    spec = load_pipeline(pipeline_file)
    produce(broker.bootstrap, topic, pizza_events(90, seed=43), partitions=3)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    result = commit_step(spec, plan, manifest)
    produce(broker.bootstrap, topic, pizza_events(30, seed=44), partitions=3)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "tidewater"), "status", "--pipeline", str(pipeline_file), "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    st = json.loads(out)
    assert st["last_snapshot_id"] == result.snapshot_id
    assert st["last_batch_id"] == plan.batch_id
    assert st["valid_through"] is not None
    assert st["total_lag"] == 30
    assert [(p["partition"], p["committed"], p["end"], p["lag"]) for p in st["partitions"]] == [
        (0, 30, 40, 10),
        (1, 30, 40, 10),
        (2, 30, 40, 10),
    ]


def test_validate_command_exit_codes(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntopics: [a]\ntable: ns.t\nkafka: {bootstrap_servers: h}\nbatch: {max_record: 5}\n")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "tidewater"), "validate", "--pipeline", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "batch.max_record: unknown key (did you mean 'max_records'?)" in proc.stderr


def test_warn_policy_commits_a_failing_batch_and_records_the_verdict(broker, home, topic):
    """validation.on_failure warn: the failing suite is logged, the batch is committed, and the snapshot
    summary records the verdict (suite, success false, one failed check). A passing batch records success."""
    from tidewater.table.summary import VALIDATION

    (home / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 1, "max_value": 5}}
                ]
            }
        )
    )
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"not_null": ["order_id"], "suite": "strict.json", "on_failure": "warn"},
    )
    spec = load_pipeline(path)
    produce(broker.bootstrap, topic, pizza_events(100, seed=91), partitions=2)
    plan, manifest = stage_inline(spec)
    report = validate_step(spec, plan, manifest)
    assert not report.success
    commit_step(spec, plan, manifest)
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 100
    assert committed_state(table).offsets == {topic: {0: 50, 1: 50}}
    verdict = json.loads(table.current_snapshot().summary.additional_properties[VALIDATION])
    assert verdict == {"suite": "orders.strict.json", "success": False, "rows": 100, "checks": 4, "failed": 1}


def test_warn_policy_never_lets_the_accounting_check_pass(broker, home, topic):
    """The row-count/accounting checks guard exactly-once: with warn they still stop the batch."""
    from dataclasses import replace

    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["order_id"], "on_failure": "warn"}
    )
    spec = load_pipeline(path)
    produce(broker.bootstrap, topic, pizza_events(20, seed=92), partitions=1)
    plan, manifest = stage_inline(spec)
    short = replace(manifest, data_files=manifest.data_files[:0])  # as if a file went missing from the manifest
    with pytest.raises(ValidationFailedError, match="expect_table_row_count_to_equal"):
        validate_step(spec, plan, short)
    assert table_of(path) is None, "nothing of the rejected first batch remains"


def test_quarantine_policy_then_publish_and_drop(broker, home, topic):
    """validation.on_failure quarantine with a failing suite: the batch lands on branch
    quarantine-<batch id>, main gets no rows but the offsets advance, the commit step fails with the
    report and fails again (adding nothing) when retried. The decision's body (what Airflow's Required actions shows)
    names the failed expectation and what it observed, the rows, the ranges and the Data Docs page. Publishing, as a
    person's decision in Airflow applies it, appends the rows to main once and records who decided; a second
    quarantined batch is dropped with a reason and never reaches main: the drop, its reason and who decided are
    recorded on main (an empty snapshot the ledger keeps); a retry of either decision finds it done. Row counts and
    offsets checked; the deep audit finds no error, while the batches wait and
    after the decisions, and explains each (the quarantine branches, the publication and the drop are Tidewater's
    own commits, not outside writes; the offsets of a waiting or dropped batch have no row on main)."""
    from tidewater.ops import quarantine
    from tidewater.runtime.decisions import apply_decision, body_for
    from tidewater.table.summary import DECIDED_BY, DROPPED, QUARANTINED, VALIDATION

    (home / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 1, "max_value": 5}}
                ]
            }
        )
    )
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"not_null": ["order_id"], "suite": "strict.json", "on_failure": "quarantine"},
    )
    spec = load_pipeline(path)
    produce(broker.bootstrap, topic, pizza_events(100, seed=93), partitions=2)
    plan, manifest = stage_inline(spec)
    assert not validate_step(spec, plan, manifest).success
    for _ in range(2):  # the run fails; a retry fails the same way and adds nothing
        with pytest.raises(ValidationFailedError, match=f"quarantined on branch quarantine-{plan.batch_id}"):
            commit_step(spec, plan, manifest)
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 0
    assert committed_state(table).offsets == {topic: {0: 50, 1: 50}}
    marker = table.current_snapshot().summary.additional_properties
    assert marker[QUARANTINED] == f"quarantine-{plan.batch_id}" and json.loads(marker[VALIDATION])["failed"] == 1
    waiting = quarantine.list_quarantined(spec, table)
    assert [(q["batch_id"], q["rows"]) for q in waiting] == [(plan.batch_id, 100)]
    from tidewater.runtime.airflow import quarantine_task  # what the quarantine_<name> DAG runs

    assert [q["batch_id"] for q in quarantine_task(str(path), {"action": "list"})["quarantined"]] == [plan.batch_id]
    with pytest.raises(Exception, match="batch_id: required for publish"):
        quarantine_task(str(path), {"action": "publish", "batch_id": " "})
    assert table.scan(snapshot_id=table.snapshot_by_name(f"quarantine-{plan.batch_id}").snapshot_id).to_arrow().num_rows == 100

    # the next batch is planned after the quarantined one: nothing is read twice
    produce(broker.bootstrap, topic, pizza_events(40, seed=94), partitions=2)
    plan2, manifest2 = stage_inline(spec)
    assert [(r.start, r.end) for r in plan2.ranges] == [(50, 70), (50, 70)]
    validate_step(spec, plan2, manifest2)
    with pytest.raises(ValidationFailedError):
        commit_step(spec, plan2, manifest2)

    from tidewater.audit.pipeline import audit  # the quarantine branches and the publication are Tidewater's own commits

    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
    assert sorted((f.batch_id, f.message) for f in report.findings if f.check == "deep" and f.severity == "explained") == sorted(
        [
            (plan.batch_id, f"50 offsets without a row: a quarantined batch waiting on its branch quarantine-{plan.batch_id}"),
            (plan.batch_id, f"50 offsets without a row: a quarantined batch waiting on its branch quarantine-{plan.batch_id}"),
            (plan2.batch_id, f"20 offsets without a row: a quarantined batch waiting on its branch quarantine-{plan2.batch_id}"),
            (plan2.batch_id, f"20 offsets without a row: a quarantined batch waiting on its branch quarantine-{plan2.batch_id}"),
        ]
    )
    body = body_for(spec, plan, (spec.table.identifier,))
    failed = [line for line in body.splitlines() if line.startswith("- `expect")]
    assert len(failed) == 1 and "expect_column_values_to_be_between(column='store_id'" in failed[0], body
    assert "`: observed element_count=100, " in failed[0] and "unexpected_count=" in failed[0], body
    assert "**Rows:** 100." in body and f"- `{topic}` [0] 0-50" in body and f"- `{topic}` [1] 0-50" in body
    assert f"/tidewater/data-docs/{spec.name}/{plan.batch_id}.html" in body

    def decide(batch_id: str, option: str, reason: str, name: str) -> dict:  # as the decide task's answer arrives
        return apply_decision(
            str(path),
            {"decision": True, "batch_id": batch_id, "tables": [spec.table.identifier]},
            {"chosen_options": [option], "params_input": {"reason": reason}, "responded_by_user": {"id": "7", "name": name}},
        )

    assert decide(plan.batch_id, "Publish", "", "ada")["tables"] == [
        {"table": spec.table.identifier, "batch_id": plan.batch_id, "status": "published", "rows": 100}
    ]
    assert table_of(path).current_snapshot().summary.additional_properties[DECIDED_BY] == "ada"
    snapshots = len(table_of(path).metadata.snapshots)
    assert decide(plan.batch_id, "Publish", "", "ada")["tables"][0]["status"] == "published"  # again: nothing more
    assert decide(plan2.batch_id, "Drop", "store ids out of range", "grace")["tables"][0]["rows"] == 40
    assert len(table_of(path).metadata.snapshots) == snapshots + 1
    with pytest.raises(ConfigError, match="expected Publish or Drop"):
        decide(plan2.batch_id, "Maybe", "", "grace")
    table = table_of(path)
    ids = table.scan().to_arrow().column("order_id")
    assert ids.length() == len(set(ids.to_pylist())) == 100
    assert quarantine.list_quarantined(spec, table) == []
    assert committed_state(table).offsets == {topic: {0: 70, 1: 70}}
    dropped = json.loads(table.current_snapshot().summary.additional_properties[DROPPED])
    assert dropped == {
        "batch": plan2.batch_id,
        "rows": 40,
        "ranges": [[topic, 0, 50, 70], [topic, 1, 50, 70]],
        "reason": "store ids out of range",
        "by": "grace",
    }
    assert quarantine.drop(spec, plan2.batch_id)["status"] == "dropped"  # decided once: a retry finds the drop
    assert len(table_of(path).metadata.snapshots) == snapshots + 1
    with pytest.raises(ConfigError, match="no quarantined batch nope"):
        quarantine.drop(spec, "nope")
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
    explained = {(f.check, f.batch_id, f.message) for f in report.findings if f.severity == "explained"}
    assert ("quarantine", plan2.batch_id, "quarantined batch dropped by an operator: its 40 rows never reached the table") in explained
    assert {m for c, b, m in explained if c == "deep"} == {"20 offsets without a row: a quarantined batch an operator dropped (40 rows)"}


def test_id_uniqueness_in_the_batch_and_against_the_table_with_data_docs(broker, home, topic):
    """validation.unique_ids table: a batch repeating an id fails (batch check); a batch whose id is
    already in the table fails (table check); each validation writes a great-expectations Data Docs
    page (and the index) naming the checks. Nothing is committed by a failing batch."""
    from tidewater.quality.data_docs import docs_dir, page_of, render_pending, site_dir

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": "rpc.orders", "id_columns": ["id"]},
        validation={"not_null": ["id"], "unique_ids": "table"},
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": i}).encode() for i in range(10)])
    plan, manifest = stage_inline(spec)
    report = validate_step(spec, plan, manifest)
    assert report.success and [c.success for c in report.checks if "unique" in c.expectation] == [True, True]
    commit_step(spec, plan, manifest)
    # the report is kept for the page, or the page is there already (great-expectations was loaded in this
    # process, so the validate step rendered it and removed the report)
    assert (docs_dir(spec) / f"{plan.batch_id}.json").is_file() or page_of(spec, plan.batch_id) is not None
    render_pending(spec)  # the DAG's data_docs task (a no-op if great-expectations was loaded and rendered it)
    assert not (docs_dir(spec) / f"{plan.batch_id}.json").exists()
    page = page_of(spec, plan.batch_id)
    assert page is not None and plan.batch_id in (site_dir(spec) / "index.html").read_text()
    assert "Data documentation compiled by Great Expectations" in page.read_text()
    assert "great_expectations.yml" in {p.name for p in (docs_dir(spec) / "gx").iterdir()}  # a file data context
    text = page.read_text()
    import great_expectations

    assert f">{great_expectations.__version__}<" in text  # the page names the version that built it
    home_link = re.search(r'href="((?:\.\./)+)index\.html"', text)
    assert home_link is not None
    assert (page.parent / home_link.group(1) / "index.html").resolve() == (site_dir(spec) / "index.html").resolve()
    suite_link = re.search(r'href="((?:\.\./)+expectations/[^"]+\.html)"', text)
    assert suite_link is not None and (page.parent / suite_link.group(1)).resolve().is_file()  # the suite's page exists
    assert "values must be unique" in page.read_text()

    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": i}).encode() for i in (20, 21, 21, 3)])
    plan, manifest = stage_inline(spec)
    with pytest.raises(ValidationFailedError) as e:
        validate_step(spec, plan, manifest)
    text = str(e.value)
    assert "FAIL expect_column_values_to_be_unique(column='id')  -> element_count=4, unexpected_count=1" in text
    assert "FAIL expect_column_values_to_be_unique(column='id', scope='table')" in text and "unexpected_count=1" in text
    assert page_of(spec, plan.batch_id) is not None  # the failing report has its page too
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 10 and committed_state(table).offsets == {topic: {0: 10}}
