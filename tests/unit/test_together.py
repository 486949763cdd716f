"""The multi-table commit's staging (``commit/together.py``) on pyiceberg's own SQL catalog (SQLite in the test's
folder): what a table's commit would send is built from a pyiceberg ``Transaction`` that is never committed, the shape
of pyiceberg this module reads (``_updates``, ``_requirements``); and which catalogs offer the REST multi-table commit.
The commit itself, kill tests included, runs against the REST catalog server in
tests/integration/test_rest_transactions.py."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import Endpoint
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import CommitTableRequest
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, AssertTableUUID, SetSnapshotRefUpdate

from tidewater.commit.primitive import Change, OffsetsExpected
from tidewater.commit.together import TRANSACTIONS, Part, offers_transactions, stage
from tidewater.errors import OffsetsMovedError, TerminalError
from tidewater.table.summary import BATCH_ID, summary_properties


@pytest.fixture
def catalog(tmp_path):
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("rpc")
    table = cat.create_table("rpc.a", pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": [1]}))
    return cat


def test_a_staged_part_is_the_table_s_commit_request_and_commits_nothing(catalog):
    table = catalog.load_table("rpc.a")
    head = table.current_snapshot().snapshot_id
    rows = pa.table({"id": pa.array([2, 3], pa.int64())})
    request = stage(catalog, Part("rpc.a", lambda t: Change({BATCH_ID: "b1"}, rows=rows)), "b1")
    assert isinstance(request, CommitTableRequest)
    assert (request.identifier.namespace.root, request.identifier.name) == (["rpc"], "a")
    kinds = {type(r) for r in request.requirements}
    assert {AssertTableUUID, AssertRefSnapshotId} <= kinds
    assert next(r for r in request.requirements if isinstance(r, AssertRefSnapshotId)).snapshot_id == head
    assert {type(u) for u in request.updates} >= {AddSnapshotUpdate, SetSnapshotRefUpdate}
    added = next(u for u in request.updates if isinstance(u, AddSnapshotUpdate)).snapshot
    assert added.summary["tidewater.batch-id"] == "b1"
    again = catalog.load_table("rpc.a")
    assert again.current_snapshot().snapshot_id == head and again.scan().to_arrow().num_rows == 1


def test_a_table_that_carries_the_marker_is_left_out_and_nothing_to_commit_is_none(catalog):
    table = catalog.load_table("rpc.a")
    table.append(pa.table({"id": pa.array([9], pa.int64())}), snapshot_properties={BATCH_ID: "b0"})
    assert stage(catalog, Part("rpc.a", lambda t: Change({BATCH_ID: "b0"})), "b0") is True
    assert stage(catalog, Part("rpc.a", lambda t: None), "b1") is None


def test_the_offsets_requirement_is_checked_on_the_table_as_loaded_and_a_missing_table_is_terminal(catalog):
    catalog.load_table("rpc.a").append(
        pa.table({"id": pa.array([4], pa.int64())}),
        snapshot_properties=summary_properties(
            offsets={"t": {0: 7}}, batch_id="b0", pipeline="p", records=1, valid_through_ms=None, dag_run_id=None
        ),
    )
    moved = OffsetsExpected({"t": {0: (5,)}}, batch_id="b1")
    with pytest.raises(OffsetsMovedError, match=r"t\[0\] written against 5, now at 7"):
        stage(catalog, Part("rpc.a", lambda t: Change({BATCH_ID: "b1"}, expect=moved)), "b1")
    with pytest.raises(TerminalError, match="does not exist"):
        stage(catalog, Part("rpc.gone", lambda t: Change({})), "b1")


def test_only_a_catalog_that_lists_the_transactions_endpoint_offers_it(catalog):
    class Rest:
        def __init__(self, *endpoints: str) -> None:
            self._supported_endpoints = {Endpoint.from_string(e) for e in endpoints}

    assert not offers_transactions(catalog)
    assert not offers_transactions(Rest("POST /v1/{prefix}/namespaces/{namespace}/tables/{table}"))
    assert offers_transactions(Rest(TRANSACTIONS, "GET /v1/{prefix}/namespaces"))
