"""What the gate holds each target table's files to (quality/gate.TableFiles), without a catalog: a plain
pipeline's one table answers for every record of the batch, a routed table for the rows routed to it."""

from __future__ import annotations

from tidewater.batch import BatchManifest, PartitionStats, StagedFile, TableOutput
from tidewater.config.parse import parse_pipeline
from tidewater.quality.gate import ROUTED_ACCOUNTING, TableFiles, builtin_checks, routed_accounting

SPEC = parse_pipeline({"name": "p", "topics": ["a"], "kafka": {"bootstrap_servers": "h:9092"}, "table": "ns.t"})


def _file(rows: int) -> StagedFile:
    return StagedFile(f"/staged/{rows}.parquet", rows, 100, 0)


def _manifest(
    files: list[int], letters: int, skipped: int, routed: int | None = None, outputs: tuple[TableOutput, ...] = ()
) -> BatchManifest:
    part = PartitionStats("a", 0, 0, 10, 10, 0, 9, None, None, dead_letters=letters, skipped=skipped, routed=routed)
    return BatchManifest(
        "b",
        "ns.t",
        tuple(_file(n) for n in files),
        (part,),
        0,
        "now",
        dead_letter_files=(_file(letters),) if letters else (),
        outputs=outputs,
    )


def test_a_plain_tables_checks_add_up_the_whole_batch_and_fail_when_a_row_is_missing():
    good = builtin_checks(SPEC, None, TableFiles.of_batch(_manifest([4, 3], letters=2, skipped=1)))
    assert [c.success for c in good] == [True, True]
    assert good[1].kwargs == {"read": 10, "dead_letters": 2, "skipped": 1}
    short = builtin_checks(SPEC, None, TableFiles.of_batch(_manifest([4, 2], letters=2, skipped=1)))
    assert [c.success for c in short] == [False, False]
    assert short[0].observed == {"observed_value": 6} and short[0].kwargs == {"value": 7}


def test_a_routed_table_is_held_to_its_own_rows_and_the_batch_to_records_routed():
    out = TableOutput("ns.x", (_file(5),), 5, 0, {})
    files = TableFiles.of_output(out)
    assert (files.table, files.records, files.rows_expected, files.rows_in_files) == ("ns.x", 5, 5, 5)
    assert all(c.success for c in builtin_checks(SPEC, None, files))
    lost = TableFiles.of_output(TableOutput("ns.x", (_file(4),), 5, 0, {}))
    assert not builtin_checks(SPEC, None, lost)[0].success
    # 10 read: 7 routed (to one or more tables), 2 dead letters, 1 skipped
    assert routed_accounting(_manifest([], letters=2, skipped=1, routed=7, outputs=(out,))).success
    check = routed_accounting(_manifest([], letters=2, skipped=1, routed=6, outputs=(out,)))
    assert (check.expectation, check.success) == (ROUTED_ACCOUNTING, False)
