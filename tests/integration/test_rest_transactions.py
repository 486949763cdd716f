"""A routed batch in one REST catalog transaction (``commit/together.py``): the session's REST catalog server offers
the Iceberg REST spec's multi-table commit, so a routed ingest commits its change tables and its checkpoint in one
request. A batch whose committing process is SIGKILLed while the server holds that request lands whole, and once; a
batch whose transaction the catalog keeps refusing lands nothing, in no table, and its retried commit step lands it
once. Each table equals its source's reference model; offsets and the deep audit are checked."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, commit_as_airflow_would, rest_catalog_properties, stage_inline, unreferenced_metadata
from tests.integration.test_routed_changes import Source, assert_equals_source, database_pipeline
from tidewater.audit.pipeline import audit
from tidewater.batch import PLAN_NAME, BatchManifest, BatchPlan, batch_dir, manifest_path
from tidewater.commit.primitive import DEFAULT_ATTEMPTS
from tidewater.config.parse import load_pipeline
from tidewater.errors import TransientError
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state, find_batch_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.rest]

TRANSACTION = "POST /v1/{prefix}/transactions/commit"
TABLE_COMMIT = "POST /v1/{prefix}/namespaces/{ns}/tables/{t}"

COMMIT_STAGED = """
import sys
from tidewater.batch import PLAN_NAME, BatchManifest, BatchPlan, batch_dir, manifest_path
from tidewater.commit.primitive import DEFAULT_ATTEMPTS
from tidewater.config.parse import load_pipeline
from tidewater.batch import read_json
from tidewater.steps.lifecycle import commit_step
spec = load_pipeline(sys.argv[1])
plan = BatchPlan.from_json(read_json(sys.argv[2]))
manifest = BatchManifest.from_json(read_json(sys.argv[3]))
commit_step(spec, plan, manifest)
"""


def _batch(broker, spec, sources: list[Source], batch: int) -> tuple[BatchPlan, BatchManifest]:
    for i, s in enumerate(sources):
        s.produce(broker, batch, 30, seed=10 * batch + i)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    return plan, manifest


def _carrying(spec, sources: list[Source], batch_id: str) -> list[str]:
    """The tables (the data tables and the checkpoint) that carry ``batch_id``."""
    catalog = load_catalog(spec)
    idents = [f"rpc.src{i}" for i in range(len(sources))] + [spec.checkpoint_table()]
    return [i for i in idents if (t := load_table(catalog, i)) is not None and find_batch_snapshot(t, batch_id)]


def _all_equal_sources(spec, sources: list[Source]) -> None:
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)
    offsets = committed_state(load_table(load_catalog(spec), spec.checkpoint_table())).offsets
    assert {t: sum(ps.values()) for t, ps in offsets.items()} == {s.topic: s.records for s in sources}


def _wait(what: str, done, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_routed_batch_is_one_rest_transaction_whole_when_its_committer_is_killed_and_nothing_when_refused(
    broker, rest_catalog, home, topic
):
    sources = [Source(f"{topic}-s{i}") for i in range(3)]
    spec = database_pipeline(
        home, broker, [s.topic for s in sources], catalog={"name": "lake", "properties": rest_catalog_properties(rest_catalog, home)}
    )

    # 1. a batch commits its three change tables and its checkpoint in one request; the one table commit of its own
    #    is the pipeline's ledger, synced after the batch (audit/ledger.py: a record of batches, not the batch)
    plan, manifest = _batch(broker, spec, sources, 0)
    before = rest_catalog.stats()
    assert commit_step(spec, plan, manifest).status == "committed"
    after = rest_catalog.stats()
    assert after.get(TRANSACTION, 0) == before.get(TRANSACTION, 0) + 1
    assert after.get(TABLE_COMMIT, 0) == before.get(TABLE_COMMIT, 0) + 1
    assert _carrying(spec, sources, plan.batch_id) == ["rpc.src0", "rpc.src1", "rpc.src2", spec.checkpoint_table()]
    _all_equal_sources(spec, sources)

    # 2. the committing process is SIGKILLed while the server holds its transaction: the batch lands whole, once
    plan, manifest = _batch(broker, spec, sources, 1)
    plan_path = batch_dir(spec.staging_dir(), spec.name, plan.batch_id) / PLAN_NAME
    sent, landed = rest_catalog.stats().get(TRANSACTION, 0), rest_catalog.stats().get("transactions committed", 0)
    rest_catalog.hold_transactions(4000)
    proc = subprocess.Popen(
        [sys.executable, "-c", COMMIT_STAGED, str(spec.source_path), str(plan_path), str(manifest_path(plan_path))],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait("the transaction to reach the server", lambda: rest_catalog.stats().get(TRANSACTION, 0) > sent)
        assert _carrying(spec, sources, plan.batch_id) == []  # held: nothing applied yet
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -9
    _wait("the held transaction to apply", lambda: rest_catalog.stats().get("transactions committed", 0) > landed)
    assert _carrying(spec, sources, plan.batch_id) == ["rpc.src0", "rpc.src1", "rpc.src2", spec.checkpoint_table()]
    again = commit_step(spec, plan, manifest)  # Airflow's retry of the killed commit step
    assert again.status == "already-committed"
    _all_equal_sources(spec, sources)

    # 3. the catalog refuses the transaction on every attempt: nothing of the batch in any table; the retried step
    #    lands it once
    plan, manifest = _batch(broker, spec, sources, 2)
    idents = [f"rpc.src{i}" for i in range(len(sources))] + [spec.checkpoint_table()]
    leftovers = unreferenced_metadata(spec, idents)
    rest_catalog.fail_commits(DEFAULT_ATTEMPTS)  # every attempt of the commit step
    with pytest.raises(TransientError, match="nothing of it is committed"):
        commit_step(spec, plan, manifest)
    assert _carrying(spec, sources, plan.batch_id) == []
    # each refused attempt's manifests and manifest lists were deleted, not left for orphan removal
    assert unreferenced_metadata(spec, idents) == leftovers
    assert commit_as_airflow_would(spec, plan, manifest).status == "committed"
    _all_equal_sources(spec, sources)
    report = audit(load_pipeline(spec.source_path), deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_never_commits_a_routed_batch_table_by_table_on_the_same_catalog(broker, rest_catalog, home, topic):
    """``catalog.multi_table_commit: never``: the same routed batch on the same server commits each table and then the
    checkpoint on its own (no transaction)."""
    sources = [Source(f"{topic}-s{i}") for i in range(2)]
    spec = database_pipeline(
        home,
        broker,
        [s.topic for s in sources],
        catalog={"name": "lake", "properties": rest_catalog_properties(rest_catalog, home), "multi_table_commit": "never"},
    )
    plan, manifest = _batch(broker, spec, sources, 0)
    before = rest_catalog.stats()
    assert commit_step(spec, plan, manifest).status == "committed"
    after = rest_catalog.stats()
    assert after.get(TRANSACTION, 0) == before.get(TRANSACTION, 0)
    assert after.get(TABLE_COMMIT, 0) == before.get(TABLE_COMMIT, 0) + 4  # two tables, the checkpoint, the ledger
    _all_equal_sources(spec, sources)


def test_a_one_by_one_commit_cut_short_is_finished_by_the_transaction_leaving_the_committed_table_alone(
    broker, rest_catalog, home, topic, monkeypatch
):
    """The commit step dies after the first of three tables committed one by one (``never``, as before the catalog
    offered transactions); the retried step, on ``auto``, commits the other two and the checkpoint in one transaction
    and leaves the first as it was (``already-committed``): each table equals its source, each change applied once."""
    from tidewater.commit import batch as committing

    sources = [Source(f"{topic}-s{i}") for i in range(3)]
    catalog = {"name": "lake", "properties": rest_catalog_properties(rest_catalog, home)}
    one_by_one = database_pipeline(home, broker, [s.topic for s in sources], catalog={**catalog, "multi_table_commit": "never"})
    plan, manifest = _batch(broker, one_by_one, sources, 0)
    real, calls = committing.commit_table_output, []

    def die_after_first(*a, **kw):
        if calls:
            raise TransientError("simulated crash between table commits")
        calls.append(a[2].table)
        return real(*a, **kw)

    monkeypatch.setattr(committing, "commit_table_output", die_after_first)
    with pytest.raises(TransientError):
        commit_step(one_by_one, plan, manifest)
    monkeypatch.setattr(committing, "commit_table_output", real)
    assert _carrying(one_by_one, sources, plan.batch_id) == calls == ["rpc.src0"]

    together = database_pipeline(home, broker, [s.topic for s in sources], catalog=catalog)
    sent = rest_catalog.stats().get(TRANSACTION, 0)
    result = commit_step(together, plan, manifest)
    assert rest_catalog.stats().get(TRANSACTION, 0) == sent + 1
    assert {t.table: t.status for t in result.tables} == {
        "rpc.src0": "already-committed",
        "rpc.src1": "committed",
        "rpc.src2": "committed",
        together.checkpoint_table(): "checkpoint",
    }
    _all_equal_sources(together, sources)
