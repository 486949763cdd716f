"""``maintenance``: the table upkeep of the ``maintain_<name>`` DAG (compaction, manifests, snapshot expiry,
orphan files)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tidewater.config.sections import doc

if TYPE_CHECKING:
    pass

# The choices of this section's mode settings, one place each: the parser refuses any other value naming the
# setting and its choices (config/parse.py), the JSON Schema and the reference list them
CompactionStrategy = Literal["auto", "binpack", "sort", "zorder"]


@dataclass(frozen=True)
class CompactionSpec:
    """Rewrite data files (Spark `rewrite_data_files`): small files into files near the target size."""

    enabled: bool = doc("Run this task.", default=True)
    strategy: CompactionStrategy = doc(
        "`auto` (sort when the table has a sort order, else bin-pack), `binpack`, `sort`, or `zorder`.",
        default="auto",
    )
    zorder_columns: list[str] = doc("Columns for `strategy: zorder`.", default_factory=list)
    target_file_size_bytes: int | None = doc(
        "Target size of rewritten files. Default: the table's `write.target-file-size-bytes`.", default=None
    )
    min_input_files: int = doc("A file group is rewritten only when it has at least this many files.", default=5)
    partial_progress: bool = doc("Commit file groups as they finish (big tables make progress even if the task dies).", default=True)
    partial_progress_max_commits: int = doc("Most commits one run makes with partial progress.", default=10)
    delete_ratio_threshold: float = doc(
        "Change tables: a data file whose deleted rows reach this share of its rows is rewritten without them, "
        "whatever its size (Iceberg's `delete-ratio-threshold`).",
        default=0.3,
    )
    delete_file_threshold: int = doc(
        "Change tables: a data file with at least this many position delete files is rewritten without the "
        "deleted rows (Iceberg's `delete-file-threshold`).",
        default=3,
    )


@dataclass(frozen=True)
class ExpirySpec:
    """Expire old snapshots (Spark `expire_snapshots`). The newest snapshot carrying the committed
    offsets, and every snapshot after it, are always kept."""

    enabled: bool = doc("Run this task.", default=True)
    older_than_hours: float = doc("Expire snapshots older than this.", default=120.0)
    retain_last: int = doc("Always keep at least this many of the newest snapshots.", default=10)


@dataclass(frozen=True)
class OrphanSpec:
    """Delete files in the table's location that no snapshot references (Spark `remove_orphan_files`)."""

    enabled: bool = doc("Run this task.", default=True)
    older_than_hours: float = doc(
        "Only files older than this are removed. Must exceed the longest possible batch (see "
        "`airflow.task_timeout_minutes`); files of a batch still in flight are never removed.",
        default=72.0,
    )


@dataclass(frozen=True)
class MaintenanceSpec:
    """The `maintain_<name>` DAG and `tidewater maintain`."""

    schedule: str | None = doc("Airflow schedule of the maintenance DAG. `null`: triggered only.", default="@daily")
    rewrite_data_files: CompactionSpec = doc("Compaction.", default_factory=CompactionSpec)
    rewrite_position_deletes: bool = doc(
        "Change tables: merge small position delete files and drop those whose rows are gone (Spark "
        "`rewrite_position_delete_files`). Skipped on tables without delete files.",
        default=True,
    )
    rewrite_manifests: bool = doc("Rewrite manifests (Spark `rewrite_manifests`).", default=True)
    expire_snapshots: ExpirySpec = doc("Snapshot expiry.", default_factory=ExpirySpec)
    remove_orphan_files: OrphanSpec = doc("Orphan file removal.", default_factory=OrphanSpec)

    def enabled_actions(self, applies_changes: bool) -> list[str]:
        """The actions the maintenance DAG and `tidewater maintain` run, in order (position delete files are
        rewritten on change tables only)."""
        on = {
            "rewrite_data_files": self.rewrite_data_files.enabled,
            "rewrite_position_delete_files": self.rewrite_position_deletes and applies_changes,
            "rewrite_manifests": self.rewrite_manifests,
            "expire_snapshots": self.expire_snapshots.enabled,
            "remove_orphan_files": self.remove_orphan_files.enabled,
        }
        return [a for a in MAINTENANCE_ACTIONS if on[a]]


MAINTENANCE_ACTIONS = (
    "rewrite_data_files",
    "rewrite_position_delete_files",
    "rewrite_manifests",
    "expire_snapshots",
    "remove_orphan_files",
)
