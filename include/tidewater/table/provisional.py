"""Schema changes that become permanent only with their batch's commit.

A column must exist before files that hold it are written, so evolution happens while the batch is
written (by the plan step's probe or the write job's driver, never by a Spark task: ``write/job.py``).
Each change is tagged in the same metadata transaction as provisional:
``tidewater.provisional.<batch id>.<tag>`` lists the fields it added (tag ``driver``, or the probe's
``t9xxxx``), and a table the batch created
carries ``tidewater.created-by-batch``. The batch's commit removes its tags in its own transaction
(``confirm_keys``), so the changes are confirmed exactly when the batch becomes visible.

A batch that can never commit (its write step failed, the quality gate rejected it, or its run died
and the next ingest run planned anew) is reverted (``revert``): the fields it added are dropped unless
committed data already holds values in them (another batch used them), and a table it created is dropped
while it has no snapshot. A dropped column keeps its field id retired, so files written with it are
never misread.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from pyiceberg.exceptions import NoSuchTableError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

PREFIX = "tidewater.provisional."
CREATED_BY = "tidewater.created-by-batch"

Path = tuple[str, ...]


def marker_key(batch_id: str, tag: str) -> str:
    return f"{PREFIX}{batch_id}.{tag}"


def marked_properties(table: Table, batch_id: str, tag: str, added: list[Path]) -> dict[str, str]:
    """The table property that tags ``added`` as provisional fields of ``batch_id`` (merged with what the
    same tag added before)."""
    key = marker_key(batch_id, tag)
    before = [tuple(p) for p in json.loads(table.properties.get(key, "[]"))] if table is not None else []
    merged = sorted(set(before) | set(added))
    return {key: json.dumps([list(p) for p in merged], separators=(",", ":"))}


def confirm_keys(table: Table, batch_id: str) -> list[str]:
    """The properties a batch's commit removes (in its own transaction) to make its changes permanent."""
    keys = [k for k in table.properties if k.startswith(f"{PREFIX}{batch_id}.")]
    if table.properties.get(CREATED_BY) == batch_id:
        keys.append(CREATED_BY)
    return keys


def _fields_with_data(table: Table, field_ids: set[int]) -> set[int]:
    """Of ``field_ids``, those for which a committed data file holds a non-null value (file metrics)."""
    used: set[int] = set()
    if table.current_snapshot() is None:
        return used
    for task in table.scan().plan_files():
        values, nulls = task.file.value_counts or {}, task.file.null_value_counts or {}
        used |= {f for f in field_ids if values.get(f, 0) - nulls.get(f, 0) > 0}
    return used


def revert(catalog: Catalog, ident: str, batch_id: str) -> list[str]:
    """Undo the provisional changes of a batch that will never commit. Returns what was undone."""
    try:
        table = catalog.load_table(ident)
    except NoSuchTableError:
        return []
    keys = confirm_keys(table, batch_id)
    if not keys:
        return []
    if table.properties.get(CREATED_BY) == batch_id and not table.metadata.snapshots:
        catalog.drop_table(ident)
        log.warning("batch %s will not commit: dropped table %s, which it created and nothing else wrote", batch_id, ident)
        return [f"table {ident}"]
    paths = {tuple(p) for k in keys if k != CREATED_BY for p in json.loads(table.properties[k])}
    schema = table.schema()
    ids = {p: schema.find_field(".".join(p)).field_id for p in paths if _has(schema, p)}
    keep = _fields_with_data(table, set(ids.values()))
    drop = sorted((p for p, fid in ids.items() if fid not in keep), key=len)
    outermost = [p for p in drop if not any(p[:i] in drop for i in range(1, len(p)))]
    with table.transaction() as tx:
        if outermost:
            with tx.update_schema() as upd:
                for p in outermost:
                    upd.delete_column(p)
        tx.remove_properties(*keys)
    undone = [".".join(p) for p in outermost]
    log.warning(
        "batch %s will not commit: removed the columns it added to %s (%s)%s",
        batch_id,
        ident,
        ", ".join(undone) or "none",
        f"; kept {len(ids) - len(drop)} that committed data uses" if keep else "",
    )
    return undone


def _has(schema: Any, path: Path) -> bool:
    try:
        schema.find_field(".".join(path))
        return True
    except ValueError:
        return False
