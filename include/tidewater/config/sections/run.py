"""How a batch runs: ``catalog``, ``batch``, ``validation`` (the quality gate) and ``spark``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tidewater.config.sections import doc

if TYPE_CHECKING:
    pass

# The choices of this section's mode settings, one place each: the parser refuses any other value naming the
# setting and its choices (config/parse.py), the JSON Schema and the reference list them
MultiTableCommit = Literal["auto", "never"]
NotNullPolicy = Literal["fail", "dead_letter"]
UniqueIds = Literal["none", "batch", "table"]
GateFailure = Literal["fail", "warn", "quarantine"]


def catalog_type(props: dict[str, str]) -> str:
    """The type of the catalog these pyiceberg properties open: ``type``, else ``rest`` for an http(s) ``uri`` (as
    pyiceberg infers it), else ``sql``."""
    return props.get("type") or ("rest" if str(props.get("uri", "")).startswith("http") else "sql")


@dataclass(frozen=True)
class CatalogSpec:
    """The Iceberg catalog (pyiceberg properties). Spark uses the same catalog under the same name."""

    name: str = doc("Catalog name. Spark's catalog gets the same name (it is stored in the catalog tables).", default="tidewater")
    properties: dict[str, str] = doc(
        "pyiceberg catalog properties (`type: sql|rest|glue|hive`, `uri`, `warehouse`, ...). Default: a SQLite "
        "SqlCatalog at `$TIDEWATER_HOME/catalog.db` with the warehouse at `$TIDEWATER_HOME/warehouse`.",
        default_factory=dict,
    )
    conn_id: str | None = doc(
        "Airflow connection id holding the catalog, so that Airflow's secrets backends serve its credentials: a "
        "`postgres`/`mysql`/`sqlite` connection is a SQL catalog, an `http`/`https` one a REST catalog (login and "
        "password as its OAuth2 `credential`, a password alone as its `token`), an `aws` one a Glue catalog; the "
        "connection's extra JSON adds properties (`warehouse`, `s3.*`, ...). `properties` set here win.",
        default=None,
    )
    case_sensitive: bool = doc(
        "Whether the catalog tells table names apart by case. Off (default, the strictest common rule: Hive, Glue "
        "and Spark fold names to lower case, a SQL catalog on MySQL compares them without case): a dynamic route "
        "value is folded to lower case before it names a table, and a name that differs from the pipeline's "
        "checkpoint or dead-letter table only by case is refused, so no record can reach a protected or another "
        "pipeline's table by its spelling. On: route values keep their case (`VT` and `vt` name two tables).",
        default=False,
    )
    multi_table_commit: MultiTableCommit = doc(
        "How a routed batch commits its tables. `auto`: in one catalog transaction where the catalog offers the "
        "Iceberg REST spec's multi-table commit (`POST /v1/{prefix}/transactions/commit` among the endpoints its "
        "`/v1/config` lists): every table's change and the checkpoint land together or not at all; elsewhere one "
        "table after another with the checkpoint last (a batch cut short is finished by the retried commit step or "
        "re-planned from the checkpoint). `never`: one after another on every catalog.",
        default="auto",
    )


@dataclass(frozen=True)
class BatchSpec:
    """Limits of one micro-batch."""

    max_records: int = doc(
        "Cap on records per batch over all partitions; shared fairly between partitions with a backlog.",
        default=1_000_000,
    )
    records_per_task: int = doc(
        "A partition range longer than this is split into sub-ranges read by separate Spark tasks.",
        default=250_000,
    )
    chunk_records: int = doc("Records decoded and written at a time inside one Spark task (bounds memory per task).", default=50_000)
    pack_ranges: bool = doc(
        "Short partition ranges are read by one Spark task together, which writes their rows into the same data "
        "files: a batch's files grow with its data, not with the topic's partitions. A task reads at most "
        "`records_per_task` records, and no more than the batch's records shared over `write_parallelism` tasks. "
        "Ingest batches only (replays read one range a task); which rows and offsets a batch commits is the same "
        "either way.",
        default=True,
    )
    write_parallelism: int = doc(
        "How many tasks packing spreads a batch over at least (when it has as many ranges). 0: Spark's default "
        "parallelism (the cores Spark has); through Spark Connect the server's `spark.default.parallelism`, or this "
        "machine's cores when it is unset; the inline write (no Spark), this machine's cores.",
        default=0,
    )
    staging_dir: str | None = doc(
        "Where each batch's steps leave what the next step reads (plan, manifest, error, quality verdict, "
        "replay and skip records), under `<dir>/<pipeline>/<batch id>/`: a local path (or `file://`) that every "
        "host running a step shares, or object storage (`s3://bucket/prefix`, `gs://`, `abfs://`) when they "
        "share no disk, read and written with the catalog's file settings (`s3.*`, `gcs.*`, `adls.*`, overridden "
        "by `staging_properties`). Default: `$TIDEWATER_HOME/staging`.",
        default=None,
    )
    staging_properties: dict[str, str] = doc(
        "File-layer settings for an object-storage `staging_dir` that differ from the catalog's (pyiceberg FileIO "
        "keys such as `s3.endpoint`, `s3.access-key-id`, `s3.secret-access-key`, `s3.region`). Secret values "
        "through `${ENV_VAR}`.",
        default_factory=dict,
    )
    staging_conn_id: str | None = doc(
        "Airflow connection id holding the object storage credentials of `staging_dir` and `validation."
        "data_docs_dir` (served by Airflow's secrets backends): an `aws` connection's login and password as the "
        "access key, its extra's `endpoint_url`, `region_name` and `aws_session_token` as `s3.endpoint`, `s3.region` "
        "and `s3.session-token`, and any extra key with a dot (`s3.*`, `gcs.*`, `adls.*`) as it is. Over the "
        "catalog's file settings; `staging_properties` win.",
        default=None,
    )


@dataclass(frozen=True)
class ValidationSpec:
    """The data-quality gate that runs on a staged batch before it is committed."""

    not_null: list[str] = doc("Columns that must be non-null in every row of the batch.", default_factory=list)
    not_null_policy: NotNullPolicy = doc(
        "What a null (or missing) value in a `not_null` column does: `fail` fails the quality gate (nothing is "
        "committed, and every retry fails the same way until the data is dealt with); `dead_letter` sets the "
        "record apart as a dead letter (`NullInRequiredColumn`, naming the column) while the write step runs, "
        "and the rest of the batch lands.",
        default="fail",
    )
    suite: str | None = doc(
        'A great-expectations suite file (JSON, `{"expectations": [{"type": ..., "kwargs": {...}}]}`), '
        "relative to the pipeline file, whose expectations are added to the built-in ones. Row-wise "
        "expectations (`expect_column_values_to_*`, column pairs) run chunk by chunk; whole-column ones "
        "(uniqueness, means, ...) read their columns for the whole batch.",
        default=None,
    )
    chunk_rows: int = doc(
        "Rows of the checked columns held in memory at a time while validating (bounds the gate's memory).",
        default=500_000,
    )
    unique_ids: UniqueIds = doc(
        "Uniqueness of the table's `id_columns`: `none`, `batch` (no two rows of the batch share an id) or "
        "`table` (also none of the batch's ids is already in the table; reads the table's id columns for "
        "the batch's ids).",
        default="none",
    )
    data_docs_dir: str | None = doc(
        "Where each pipeline's great-expectations file data context lives (`<dir>/<pipeline>/gx/`: the batches' "
        "validation results and their Data Docs site, `gx/uncommitted/data_docs/local_site/`; the Tidewater view "
        "serves it). A path the Airflow workers and the api-server share, or object storage (`s3://bucket/prefix`, "
        "`gs://`, `abfs://`, with the staging file settings) when they share no disk: each page is rendered in a "
        "private copy of the project and copied back. Default: `$TIDEWATER_HOME/data-docs`.",
        default=None,
    )
    on_failure: GateFailure = doc(
        "`fail`: a failing expectation stops the batch (nothing committed, offsets unchanged); `warn`: the batch "
        "is committed and the failure is logged and recorded in the snapshot summary (`tidewater.validation`); "
        "`quarantine`: the batch's files are committed to a branch `quarantine-<batch id>` of the table, main gets "
        "an empty snapshot that advances the offsets (main stays clean), the run fails with the report, and a "
        "person publishes or drops it (`tidewater quarantine publish|drop`); a change table's next batch waits for "
        "that decision (changes apply in order). In a routed pipeline each target table is judged on its own: only "
        "those that fail are quarantined (`--table T` names one), the others commit. The accounting checks (row "
        "count, read = rows + dead letters + skipped) always fail the batch.",
        default="fail",
    )


@dataclass(frozen=True)
class SparkSpec:
    """How the write step's Spark job is submitted."""

    master: str = doc("Spark master for `tidewater run` (the DAG uses the Airflow connection).", default="local[*]")
    conn_id: str = doc("Airflow Spark connection used by the ingest DAG's SparkSubmitOperator.", default="tidewater_spark")
    conf: dict[str, str] = doc("Extra Spark configuration passed to spark-submit.", default_factory=dict)
    python_env: str | None = doc(
        "A packed Python environment for executors whose machines lack the project's packages (`make executor-env` "
        "builds `.data/executor-env.tar.gz`; a path or a URI the cluster can read: hdfs://, s3a://, https://). "
        "Shipped with `spark.archives` and used as the executors' Python; the driver keeps its own. Unset: "
        "executors use the Python of their machine (`spark.pyspark.python`), which then needs the packages.",
        default=None,
    )
    iceberg_packages: str | None = doc(
        "Maven coordinates for the Iceberg Spark runtime (production). Unset: the bundled offline jar is repaired and used.",
        default=None,
    )
    kubernetes_secret: str | None = doc(
        "Cluster deploy mode on Kubernetes (`k8s://` master, `deploy-mode: cluster` in the Spark connection's extra): "
        "the name of a Kubernetes secret, in the driver's namespace, from which the driver pod takes the settings "
        "resolved from Airflow connections (`kafka.conn_id`, `catalog.conn_id`, `format.registry_conn_id`, "
        "`batch.staging_conn_id`). One key per setting, named as its variable (`TIDEWATER_KAFKA_CONFIG`, "
        "`TIDEWATER_CATALOG_CONFIG`, `TIDEWATER_REGISTRY_CONFIG`, `TIDEWATER_STORAGE_CONFIG`); "
        "`tidewater connections --pipeline FILE --output DIR` writes them for `kubectl create secret generic NAME "
        "--from-file=DIR`. The generated Spark configuration holds only references "
        "(`spark.kubernetes.driver.secretKeyRef.*`), never the values. Unset: such a pipeline is refused in cluster "
        "mode on Kubernetes (in client mode the driver gets them in spark-submit's environment).",
        default=None,
    )
    connect_url: str | None = doc(
        "A long-running Spark Connect server (`sc://host:15002`) for the write step: the batch's tasks run "
        "there through the DataFrame API (`mapInArrow`), submitted from `tidewater run` or the DAG's write "
        "task, with no spark-submit and no JVM start per batch. The server's Python workers need the "
        "project's packages, like executors. Unset (default): one spark-submit per batch.",
        default=None,
    )
