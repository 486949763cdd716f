"""Bad input never jams a pipeline and never loses a record: a corpus of values that broke pipelines
(tests/integration/bad_input_corpus.py), each alone in a chunk and mixed with good and bad neighbours,
through the real broker, the write task code (in-process and through spark-submit) and the catalog."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tests.conftest import ingest_inline, produce_to_partition, stage_inline, write_pipeline
from tests.integration.bad_input_corpus import CORPUS, obj
from tidewater.config.parse import load_pipeline
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state

pytestmark = [pytest.mark.integration]
BIG = {"message.max.bytes": 10_000_000}


def _dead_letter_classes(manifest) -> dict[int, str]:
    out = {}
    for f in manifest.dead_letter_files:
        for r in pq.read_table(f.file_path.removeprefix("file://"), columns=["offset", "error_class"]).to_pylist():
            out[r["offset"]] = r["error_class"]
    return out


@pytest.mark.parametrize("chunk_records, through_spark", [(1, False), (1000, True)], ids=["alone", "mixed-spark"])
def test_every_kind_of_bad_input_has_its_outcome_alone_or_mixed(broker, home, topic, chunk_records, through_spark):
    """34 kinds (truncated JSON, wrong types, empty values, tombstones, BOM, lone surrogates, control
    characters, 4 MB values, NaN/Infinity, duplicate keys, case-colliding, empty, dotted and over-long field
    names, 600-deep nesting, 10,000 keys, JSON null/array/number/string, invalid UTF-8, ...), each after a
    good record.
    Expected: each kind gets its listed outcome (a row, or a dead letter of the listed class) whether it
    is alone in its chunk or not; read = rows + dead letters + skipped; the batch commits (rows and dead
    letters counted in the tables) and the next batch still lands."""
    from tidewater.steps.lifecycle import commit_step, plan_step, validate_step
    from tidewater.steps.write import run_write_step

    # no not-null checks: `{}` lands as a row of nulls, and the gate would stop the batch (its own policy)
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        batch={"chunk_records": chunk_records},
        validation={"not_null": []},
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [obj(order_id=f"seed{i}") for i in range(3)])
    ingest_inline(spec)  # the table exists with the good records' types
    values: list[bytes | None] = []
    for name, value, _ in CORPUS:
        values += [obj(order_id="before " + name), value]
    produce_to_partition(broker.bootstrap, topic, 0, values, producer_settings=BIG)
    if through_spark:
        plan, plan_path = plan_step(spec)
        manifest = run_write_step(spec, plan_path, master="local[2]")
    else:
        plan, manifest = stage_inline(spec)

    got = _dead_letter_classes(manifest)
    outcomes = {name: got.get(3 + 2 * i + 1, "row") for i, (name, _, _) in enumerate(CORPUS)}
    assert outcomes == {name: expected for name, _, expected in CORPUS}
    assert len(CORPUS) >= 30 and not any(3 + 2 * i in got for i in range(len(CORPUS))), "good neighbours are rows"
    assert manifest.records == len(values) == manifest.rows_in_files + manifest.dead_letters + manifest.skipped

    validate_step(spec, plan, manifest)
    assert commit_step(spec, plan, manifest).status == "committed"
    catalog = load_catalog(spec)
    table = load_table(catalog, spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 3 + manifest.rows_in_files
    assert len(table.schema().column_names) < 30, "the 10,000-key record added no column"
    assert load_table(catalog, spec.dead_letter_table()).scan().to_arrow().num_rows == manifest.dead_letters
    produce_to_partition(broker.bootstrap, topic, 0, [obj(order_id=f"after{i}") for i in range(4)])
    ingest_inline(spec)
    table = load_table(catalog, spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 3 + manifest.rows_in_files + 4
    assert committed_state(table).offsets == {topic: {0: 3 + len(values) + 4}}
