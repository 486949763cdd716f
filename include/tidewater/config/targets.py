"""Which tables a pipeline's batches commit, and where its offsets live: the target set.

The Iceberg Kafka Connect sink's coordinator commits N tables, then the source offsets once. Ours is the same
with one deliberate difference, kept as a property of the type rather than a branch: a plain pipeline is a set
of ONE table that is its own offsets holder (``fused``): its data and its offsets land in one snapshot. A
routed pipeline's holder is its checkpoint table (``<routing.namespace>.<name>_checkpoints``); its targets are
the tables its configuration lists plus those the holder's history names (dynamic routing,
``table.targets.target_tables``). Pure: names only, nothing is loaded here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, overload

from tidewater.errors import ConfigError


@dataclass(frozen=True)
class TargetSet:
    holder: str  # the table whose snapshots carry the pipeline's offsets
    fused: bool  # the holder is the one target table itself (data and offsets in one snapshot)
    static: tuple[str, ...]  # the target tables known from the configuration (a fused set: the holder)
    branch: str | None = None  # the holder's branch that carries the offsets (None: main)
    ledger: str = ""  # every committed batch's ranges and counts (``audit/ledger.py``)
    dead_letters: str = ""  # the dead-letter table
    holder_rows: str = "rows"  # what the holder's ledger rows count (a checkpoint's: the records routed to a table)

    @property
    def own_table(self) -> str | None:
        """The one table a plain pipeline writes (its holder too), where its batches, maintenance and errors are
        read and named; None for a routed pipeline, whose tables are many and whose holder takes no rows."""
        return self.holder if self.fused else None

    def takes_rows(self, ident: str) -> bool:
        """``ident`` receives the batches' rows: any table but a separate holder (a checkpoint counts records)."""
        return self.fused or ident != self.holder

    def holds(self, ident: str) -> bool:
        """``ident`` is the offsets holder (for a fused set: the target table too)."""
        return ident == self.holder

    @overload
    def named(self, table: str | None, pipeline: str, required: Literal[True]) -> str: ...

    @overload
    def named(self, table: str | None, pipeline: str, required: bool = False) -> str | None: ...

    def named(self, table: str | None, pipeline: str, required: bool = False) -> str | None:
        """The target table a person names (``--table``): a plain pipeline's one table, named or not (naming another
        is refused); a routed pipeline's as given, which ``required`` refuses to be empty. Whether a routed
        pipeline's table exists is the catalog's question (``table/targets.py: target_tables``)."""
        if self.fused:
            if table and table != self.holder:
                raise ConfigError(f"--table: pipeline {pipeline} writes {self.holder}, not {table}")
            return self.holder
        if required and not table:
            raise ConfigError(f"--table: required for a routed pipeline (which of its target tables; pipeline {pipeline})")
        return table or None
