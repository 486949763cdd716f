"""The Iceberg catalog: loading it from a pipeline, creating and evolving tables.

Creation and evolution are metadata-only operations, safe to race: creating an existing table loads
it, and adding columns that already exist is a no-op (``union_by_name``). Conflicting catalog updates
are retried after a refresh.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tidewater.config.locations import READ_ONLY_ENV
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, TerminalError, TransientError
from tidewater.table.backoff import tries

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)


def catalog_failure(e: BaseException) -> str | None:
    """Whether a catalog call that raised ``e`` may succeed when tried again, and why.

    ``"conflict"``: the catalog refused a commit because the table changed (another writer was first).
    ``"unavailable"``: the catalog could not be reached, timed out or was locked; a commit call that
    failed this way has an unknown outcome. ``None``: anything else (a bad setting, a bug): retrying
    unchanged will fail again.
    """
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ServerError, ServiceUnavailableError

    if isinstance(e, CommitFailedException):
        return "conflict"
    if isinstance(e, (CommitStateUnknownException, ServerError, ServiceUnavailableError, OSError, TransientError)):
        return "unavailable"  # OSError covers refused/reset connections, timeouts and HTTP client errors
    try:
        from sqlalchemy.exc import DBAPIError, OperationalError
        from sqlalchemy.exc import TimeoutError as PoolTimeout
    except ImportError:  # SQL catalogs not installed
        return None
    if isinstance(e, (OperationalError, PoolTimeout)):
        return "unavailable"  # "database is locked", "could not connect to server", pool exhausted
    if isinstance(e, DBAPIError) and e.connection_invalidated:
        return "unavailable"
    return None


_LOADED: dict[tuple, Any] = {}  # catalogs this process loaded, by process, name and properties (see load_catalog)


def load_catalog(spec: PipelineSpec) -> Any:
    """The pipeline's pyiceberg catalog, loaded once per process and set of properties: a step asks for it several
    times (the holder, the tables, the ledger), and a SQL catalog opens a connection pool and checks its own tables
    at every load. A forked process (Airflow's task runner) loads its own, never its parent's connections.

    Raises ``TransientError`` when the catalog is unreachable or locked (retrying may succeed) and
    ``ConfigError`` naming ``catalog.properties`` when its settings are wrong.
    """
    from pyiceberg.catalog import load_catalog as _load

    props = spec.catalog_properties()
    if props.get("type") == "sql" and str(props.get("uri", "")).startswith("sqlite:///"):
        from pathlib import Path

        database = Path(props["uri"][len("sqlite:///") :])
        if os.environ.get(READ_ONLY_ENV) and not database.exists():
            # a read-only command creates nothing: a catalog that does not exist yet holds no table, which an empty
            # in-memory catalog of the same name answers
            props = {**props, "uri": "sqlite:///:memory:"}
        else:
            database.parent.mkdir(parents=True, exist_ok=True)
            warehouse = str(props.get("warehouse", ""))
            if warehouse.startswith("file://"):
                Path(warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)
    key = (os.getpid(), spec.catalog.name, tuple(sorted((k, str(v)) for k, v in props.items())))
    if key in _LOADED:
        return _LOADED[key]
    try:
        # A new SQL catalog creates its own tables on first load; concurrent first loads collide ("already
        # exists"), and the next attempt finds the tables in place.
        for attempt in tries(lambda e: "already exists" in str(e), attempts=5, wait=0.1):
            with attempt:
                _LOADED[key] = _load(spec.catalog.name, **props)
    except Exception as e:  # noqa: BLE001 - any catalog implementation's errors: classified here
        if catalog_failure(e) is not None:
            raise TransientError(f"catalog {spec.catalog.name!r} is unreachable or busy: {e}") from None
        raise ConfigError(f"catalog.properties: cannot load catalog {spec.catalog.name!r}: {e}") from None
    return _LOADED[key]


MAX_COMMIT_SLOTS = 8


def commit_slots(catalog: Catalog) -> int:
    """How many tables may commit at once through ``catalog``: one on SQLite (one writer at a time: concurrent
    commits only take turns on its lock, each retrying); else as many as there are cores, up to
    ``MAX_COMMIT_SLOTS`` (PostgreSQL, REST, Glue and Hive commit different tables independently, but a change
    table's commit is mostly Python work on Arrow data, which more threads than cores only slow down: measured in
    BENCHMARKS.md, 100 change tables)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None and engine.dialect.name == "sqlite":
        return 1
    return max(1, min(MAX_COMMIT_SLOTS, os.cpu_count() or 1))


def retry_busy(fn: Any, what: str, table: str, attempts: int = 8) -> Any:
    """``fn()``, retried with backoff while the catalog is busy or unreachable (SQLite answers "database is
    locked" at once when two writers each hold a read lock and want to write); then a ``TransientError``."""
    try:
        for attempt in tries(lambda e: catalog_failure(e) is not None, attempts=attempts, wait=0.2, jitter=0.2):
            with attempt:
                return fn()
    except Exception as e:
        if catalog_failure(e) is None:
            raise
        raise TransientError(f"catalog unreachable or busy while {what}: {e}", table=table) from None
    raise AssertionError("unreachable: the last try returns or raises")


def load_table(catalog: Catalog, identifier: str) -> Any | None:
    """The table, or None when it does not exist. An unreachable or locked catalog raises ``TransientError``."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None
    except Exception as e:
        if catalog_failure(e) is not None:
            raise TransientError(f"catalog unreachable or busy while loading the table: {e}", table=identifier) from None
        raise


def create_table(
    catalog: Catalog,
    ident: str,
    schema: pa.Schema,
    properties: dict[str, str],
    partition_by: list[str] | None = None,
    sort_by: list[str] | None = None,
    id_columns: list[str] | None = None,
) -> Any:
    """Create the namespace and table if missing; safe when several writers do it at once.

    The partition spec, sort order and identifier fields are part of the creation (never a second
    commit), so no writer can see the table without them.
    """
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow
    from pyiceberg.schema import Schema, assign_fresh_schema_ids

    from tidewater.table import partitioning

    if id_columns:
        missing = [c for c in id_columns if schema.get_field_index(c) < 0]
        if missing:
            raise TerminalError(f"id_columns: {', '.join(missing)} not in the records' fields ({', '.join(schema.names)})", table=ident)
        schema = pa.schema([f.with_nullable(False) if f.name in id_columns else f for f in schema])
    iceberg_schema = assign_fresh_schema_ids(visit_pyarrow(schema, _ConvertToIcebergWithoutIDs()))
    if id_columns:
        ids = [iceberg_schema.find_field(c).field_id for c in id_columns]
        iceberg_schema = Schema(*iceberg_schema.fields, schema_id=iceberg_schema.schema_id, identifier_field_ids=ids)
    spec, order = partitioning.build(iceberg_schema, partition_by or [], sort_by or [])
    namespace = tuple(ident.split(".")[:-1])
    # Several Spark tasks may create the same namespace and table at once; a catalog's check-then-insert
    # lets the loser fail with a raw database error, so a failure counts only if the object is still missing.
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:
        if not catalog.namespace_exists(namespace):
            raise
    try:
        table = catalog.create_table_if_not_exists(
            ident, schema=iceberg_schema, partition_spec=spec, sort_order=order, properties=properties
        )
    except Exception:
        loaded = load_table(catalog, ident)
        if loaded is None:
            raise
        table = loaded
    log.info("table %s ready (schema id %s)", ident, table.schema().schema_id)
    return table
