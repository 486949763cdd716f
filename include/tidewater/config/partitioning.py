"""The grammar of ``table.partition_by`` and ``table.sort_by``: parsed and checked when a pipeline is loaded
(pure: no Arrow or Iceberg here; ``table/partitioning.py`` builds the Iceberg spec and splits data by it).

Partition fields are written the way Spark SQL and the Kafka Connect Iceberg sink write them:
``col`` or ``identity(col)``, ``year(col)``, ``month(col)``, ``day(col)``, ``hour(col)`` (plural forms
accepted), ``bucket(N, col)`` and ``truncate(W, col)`` (the argument order ``bucket(col, N)`` is accepted
too). Columns may be nested (``a.b``). Sort fields are ``col [asc|desc] [nulls first|nulls last]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidewater.errors import ConfigError

CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\(\s*(.+?)\s*\)\s*$")


COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


TIME_TRANSFORMS = {
    "year": "year",
    "years": "year",
    "month": "month",
    "months": "month",
    "day": "day",
    "days": "day",
    "hour": "hour",
    "hours": "hour",
}


SORT = re.compile(r"^\s*(?P<col>\S+)(\s+(?P<dir>asc|desc))?(\s+nulls\s+(?P<nulls>first|last))?\s*$", re.I)


@dataclass(frozen=True)
class PartitionField:
    """One parsed ``table.partition_by`` entry."""

    column: str
    transform: str  # identity, year, month, day, hour, bucket, truncate
    width: int | None = None

    @property
    def name(self) -> str:
        """The partition field's name, as Iceberg's Java builder names it."""
        suffix = {"identity": "", "bucket": "_bucket", "truncate": "_trunc"}.get(self.transform, f"_{self.transform}")
        return self.column + suffix


def parse_partition_field(text: str, key: str) -> PartitionField:
    """Parse one entry; ``key`` names the setting in errors."""
    m = CALL.match(text)
    if m is None:
        if not COLUMN.match(text.strip()):
            raise ConfigError(f"{key}: {text!r} is neither a column name nor a transform like day(ts) or bucket(16, id)")
        return PartitionField(text.strip(), "identity")
    name, args = m.group(1).lower(), [a.strip() for a in m.group(2).split(",")]
    if name == "identity" and len(args) == 1 and COLUMN.match(args[0]):
        return PartitionField(args[0], "identity")
    if name in TIME_TRANSFORMS and len(args) == 1 and COLUMN.match(args[0]):
        return PartitionField(args[0], TIME_TRANSFORMS[name])
    if name in ("bucket", "truncate") and len(args) == 2:
        numbers = [a for a in args if a.isdigit()]
        columns = [a for a in args if COLUMN.match(a)]
        if len(numbers) == 1 and len(columns) == 1 and int(numbers[0]) > 0:
            return PartitionField(columns[0], name, int(numbers[0]))
        raise ConfigError(f"{key}: {text!r}: {name} takes a positive whole number and a column, e.g. {name}(16, id)")
    raise ConfigError(
        f"{key}: {text!r} is not a supported partition transform (identity, year, month, day, hour, bucket(N, col), truncate(W, col))"
    )


@dataclass(frozen=True)
class SortField:
    column: str
    descending: bool = False
    nulls_first: bool | None = None  # None: Iceberg's default (first for asc, last for desc)


def parse_sort_field(text: str, key: str) -> SortField:
    m = SORT.match(text)
    if m is None or not COLUMN.match(m.group("col")):
        raise ConfigError(f"{key}: {text!r} is not `column [asc|desc] [nulls first|nulls last]`")
    nulls = m.group("nulls")
    return SortField(m.group("col"), (m.group("dir") or "asc").lower() == "desc", None if nulls is None else nulls.lower() == "first")


def check_config(partition_by: list[str], sort_by: list[str], prefix: str) -> None:
    """Syntax checks at load time (columns are checked against the data when the table is created)."""
    fields = [parse_partition_field(p, f"{prefix}.partition_by[{i}]") for i, p in enumerate(partition_by)]
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise ConfigError(f"{prefix}.partition_by: two entries make the same partition field")
    for i, s in enumerate(sort_by):
        parse_sort_field(s, f"{prefix}.sort_by[{i}]")
