"""The pipeline's own tables, beside the tables it writes for its users: their schemas, in one place, and their
creation. Their names come from the pipeline's settings (``config/spec.py``: ``dead_letter_table()``,
``checkpoint_table()``, ``ledger_table()``).

- the dead letters: raw records that could not be decoded or were refused, with their coordinates and error
  (written by ``write/dead_letters.py``);
- the resolutions (``<dead letters>_resolutions``): what became of each letter, appended, never rewritten
  (``ops/dead_letters.py``, read by ``table/letters.py``);
- the checkpoint: a routed pipeline's offsets holder, a row per batch (``commit/holders.py: checkpoint_row``);
- the ledger: every committed batch's ranges and counts, kept as long as the table (``audit/ledger.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tidewater.config.spec import PipelineSpec
from tidewater.table.catalog import create_table, load_table

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))),
        pa.field("error_class", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("batch_id", pa.string()),
        pa.field("pipeline", pa.string()),
    ]
)


def ensure_dead_letter_table(catalog: Catalog, spec: PipelineSpec) -> Any:
    """The pipeline's dead-letter table (raw records that could not be decoded), created when missing."""
    ident = spec.dead_letter_table()
    return load_table(catalog, ident) or create_table(catalog, ident, DEAD_LETTER_SCHEMA, {"format-version": "2"})


# What became of dead letters (``ops/dead_letters.py``): one row per letter and step, appended, never rewritten. A letter
# is (topic, partition, offset, letter_batch_id): the record and the batch that dead-lettered it.
RESOLUTION_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("letter_batch_id", pa.string()),
        pa.field("pipeline", pa.string()),
        # retrying (claimed by a retry under way), resolved (its record committed), failed-again (a new letter with the
        # new error), refused (a change table holds a later change of its key), released (the retry failed before any
        # commit), dropped (given up, with a reason)
        pa.field("state", pa.string()),
        pa.field("action_id", pa.string()),  # the retry's batch id, or the drop's id
        pa.field("snapshots", pa.string()),  # resolved: {table: snapshot id} of the retry's commit (JSON)
        pa.field("reason", pa.string()),  # dropped: the operator's reason; failed-again, refused: why
        pa.field("by", pa.string()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ]
)


def resolution_table_name(spec: PipelineSpec) -> str:
    """The dead-letter table's companion that records what became of each letter (retried, dropped)."""
    return spec.dead_letter_table() + "_resolutions"


def ensure_resolution_table(catalog: Catalog, spec: PipelineSpec) -> Any:
    ident = resolution_table_name(spec)
    return load_table(catalog, ident) or create_table(catalog, ident, RESOLUTION_SCHEMA, {"format-version": "2"})


# A routed pipeline's checkpoint table: one row per batch, its snapshot carrying the batch's offsets.
CHECKPOINT_SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.string()),
        pa.field("pipeline", pa.string()),
        pa.field("committed_at", pa.timestamp("us", tz="UTC")),
        pa.field("records", pa.int64()),
        pa.field("dead_letters", pa.int64()),
        pa.field("skipped", pa.int64()),
        pa.field("tables", pa.string()),  # JSON: the target tables the batch wrote rows to
        pa.field("offsets", pa.string()),  # JSON: the batch's end offsets
    ]
)


# The pipeline's ledger (``audit/ledger.py``): a row per committed batch, table and partition range.
LEDGER_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string()),
        pa.field("batch_id", pa.string()),
        pa.field("kind", pa.string()),  # ingest, change, replay, skip, quarantine
        pa.field("snapshot_id", pa.int64()),
        pa.field("committed_at", pa.timestamp("us", tz="UTC")),
        pa.field("dag_run_id", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("start_offset", pa.int64()),
        pa.field("end_offset", pa.int64()),
        pa.field("records", pa.int64()),  # the batch's: records read
        pa.field("rows", pa.int64()),  # rows the batch's snapshot added
        pa.field("dead_letters", pa.int64()),
        pa.field("skipped", pa.int64()),
        pa.field("detail", pa.string()),  # JSON: the skip request, the replay, the change counts
    ]
)
