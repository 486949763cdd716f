"""What one target table's commit knows across its attempts, typed.

The Iceberg Kafka Connect sink's ``Coordinator`` keeps a ``CommitState`` for the commit under way; a
``TargetAttempt`` is its per-table part, owned by the batch's target (``commit/batch.py: Target``) and filled by the
change the target's kind chooses (``commit/changes.py`` for a change table's row delta):

- once per batch: the staged changes reduced to one per key (``net``, after the batch's truncates cut them:
  ``truncated``), a retry's staged rows in that order (``rows``), and an ingest's new row images (``upserts``:
  they do not depend on the table, so every attempt commits the same files);
- per attempt: its number, the files it wrote for the table as it then was (``written``: removed when the next
  attempt starts, since that attempt did not commit), the data files and counts of its change;
- the outcome: the offsets the change's snapshot carries (``stamped``) and the commit primitive's answer (``done``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidewater.batch import Offsets, StagedFile, offsets_from_json
from tidewater.commit.primitive import Committed
from tidewater.table.summary import OFFSETS
from tidewater.transform.changes import NetChanges, Truncated

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


@dataclass
class TargetAttempt:
    """One target's commit state; see the module docstring."""

    staged: bool = False  # the batch's staged changes were read (once)
    net: NetChanges | None = None
    truncated: Truncated | None = None
    rows: Any = None  # a retry's staged rows (pyarrow Table), sorted as net_changes sorts them
    upserts: tuple[StagedFile, ...] = ()  # an ingest's new row images, written once for every attempt
    attempt: int = 0
    written: tuple[Any, ...] = ()  # the files the current attempt wrote for the table as it then was
    files: tuple[Any, ...] = ()  # the data files of the current attempt's change
    counts: dict[str, Any] = field(default_factory=dict)
    stamped: Offsets | None = None
    done: Committed | None = None

    def begin(self, table: Any) -> int:
        """Start an attempt: number it, and remove the files the previous attempt wrote for the table as it was then
        (its position deletes, and the row images a replay or retry chose). That attempt did not commit: the commit
        primitive asks again only after a conflict, or after an unknown outcome once the table's snapshots showed
        the batch's marker missing. The last attempt's files, when every attempt failed, are left to orphan removal
        (its outcome may be unknown)."""
        remove_staged(table, self.written)
        self.written = ()
        self.attempt += 1
        return self.attempt

    def stamp(self, properties: Mapping[str, str]) -> None:
        """Keep the offsets the change's snapshot carries (its properties, as the change was prepared)."""
        if OFFSETS in properties:
            self.stamped = offsets_from_json(json.loads(properties[OFFSETS]))


def remove_staged(table: Table | None, files: Iterable[Any]) -> None:
    """Files no snapshot references: staged change files once the batch is committed, an attempt's own files."""
    if table is None:
        return
    for f in files:
        try:
            table.io.delete(f.file_path)
        except FileNotFoundError:
            pass
        except OSError as e:  # left for remove_orphan_files
            log.warning("could not remove staged change file %s: %s", f.file_path, e)
