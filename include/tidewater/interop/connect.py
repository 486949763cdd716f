"""`tidewater connect-import`: a Kafka Connect Iceberg sink configuration into a pipeline specification.

Accepts the JSON posted to the Connect REST API, with or without the ``name``/``config`` wrapper, in
the Apache Iceberg spelling (``iceberg.tables.route-field``) or the original one
(``iceberg.tables.routeField``). Every key is either mapped or reported with the reason it was not.
Secrets are never copied into the file: they become ``${ENV_VAR}`` references, reported as such.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from tidewater.config.secrets import embeds_secret, is_secret
from tidewater.errors import ConfigError

# original (tabular) spellings -> Apache Iceberg spellings
_RENAMES = {
    "iceberg.tables.dynamic.enabled": "iceberg.tables.dynamic-enabled",
    "iceberg.control.commitintervalms": "iceberg.control.commit.interval-ms",
    "iceberg.control.commit-interval-ms": "iceberg.control.commit.interval-ms",
}


_CATALOG_CLASSES = {"RESTCatalog": "rest", "GlueCatalog": "glue", "HiveCatalog": "hive", "JdbcCatalog": "sql"}


_IGNORED = {
    "connector.class": "Tidewater is not a connector; this file is the pipeline",
    "iceberg.control.topic": "no control topic: offsets live in the Iceberg tables",
    "iceberg.control.group-id-prefix": "no consumer group: offsets live in the Iceberg tables",
    "iceberg.control.group.id": "no consumer group: offsets live in the Iceberg tables",
    "iceberg.control.commit.timeout-ms": "commits are one Airflow task with its own timeout (airflow.task_timeout_minutes)",
    "iceberg.control.commit.threads": "commits are one Airflow task",
    "iceberg.hadoop-conf-dir": "Hadoop configuration is not read; set catalog.properties",
    "key.converter.schemas.enable": "message keys become a column as string or bytes",
}


def _kebab(key: str) -> str:
    k = re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "-" + m.group(1).lower(), key)
    return _RENAMES.get(k.lower(), _RENAMES.get(key.lower(), k))


@dataclass
class ImportResult:
    pipeline: dict[str, Any]
    mapped: list[tuple[str, str]] = field(default_factory=list)  # (connector key, pipeline key)
    unmapped: list[tuple[str, str]] = field(default_factory=list)  # (connector key, reason)
    env: list[tuple[str, str]] = field(default_factory=list)  # (connector key, environment variable)
    notes: list[str] = field(default_factory=list)  # what the import options changed

    def report(self) -> str:
        lines = [*self.notes, f"mapped {len(self.mapped)} key(s):"]
        lines += [f"  {k} -> {v}" for k, v in self.mapped]
        if self.env:
            lines.append("secrets (set these environment variables; the values were not copied):")
            lines += [f"  {k} -> ${{{v}}}" for k, v in self.env]
        lines.append(f"not mapped: {len(self.unmapped)} key(s)" + (":" if self.unmapped else ""))
        lines += [f"  {k}: {why}" for k, why in self.unmapped]
        return "\n".join(lines)


def _bool(v: Any) -> bool:
    return str(v).strip().lower() == "true"


def _list(v: Any) -> list[str]:
    return [x.strip() for x in str(v).split(",") if x.strip()]


def _name(raw: str) -> str:
    n = re.sub(r"[^a-z0-9_]+", "_", raw.lower()).strip("_")
    if not n or not n[0].isalpha():
        n = "connector_" + n
    return n[:63]


def _partition_fields(v: Any) -> list[str]:
    """Connect's comma-separated partition-by, where a transform's own comma stays inside its parentheses."""
    out, depth, cur = [], 0, ""
    for ch in str(v):
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _schedule(ms: int) -> tuple[str, str | None]:
    minutes = max(1, round(ms / 60000))
    note = None if ms % 60000 == 0 and ms >= 60000 else f"{ms} ms rounded to {minutes} minute(s) (Airflow cron)"
    if minutes >= 60 and minutes % 60 == 0:
        hours = minutes // 60
        return ("@hourly" if hours == 1 else f"0 */{hours} * * *"), note
    return ("* * * * *" if minutes == 1 else f"*/{minutes} * * * *"), note


def _jdbc_uri(uri: str) -> str:
    if uri.startswith("jdbc:sqlite:"):
        return "sqlite:///" + uri[len("jdbc:sqlite:") :]  # an absolute path gives sqlite:////path
    if uri.startswith("jdbc:postgresql:"):
        return "postgresql+psycopg2:" + uri[len("jdbc:postgresql:") :]
    return uri


@dataclass
class _Draft:
    """The pipeline document being built from one connector configuration."""

    res: ImportResult
    config: dict[str, Any]
    env_prefix: str
    bootstrap: str | None = None
    table: dict[str, Any] = field(default_factory=dict)
    per_table: dict[str, dict[str, Any]] = field(default_factory=dict)
    catalog: dict[str, str] = field(default_factory=dict)
    catalog_name: str | None = None
    kafka_settings: dict[str, str] = field(default_factory=dict)
    fmt: dict[str, Any] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)
    tables: list[str] = field(default_factory=list)
    dead_letter: dict[str, Any] = field(default_factory=dict)

    def mapped(self, raw_key: str, target: str) -> None:
        self.res.mapped.append((raw_key, target))

    def unmapped(self, raw_key: str, why: str) -> None:
        self.res.unmapped.append((raw_key, why))

    def secret(self, key: str, target: str) -> str:
        var = self.env_prefix + re.sub(r"[^A-Z0-9]+", "_", target.upper()).strip("_")
        self.res.env.append((key, var))
        return "${" + var + "}"

    def value_or_secret(self, raw_key: str, prop: str, value: Any, target: str) -> str:
        """The value, or an environment reference when the key names a secret or the value embeds one
        (``https://user:password@host``, ``...?password=...``)."""
        return self.secret(raw_key, target) if is_secret(prop, str(value)) else str(value)


# A handler maps one connector key: (draft, the key as written, its value).
Handler = Callable[[_Draft, str, Any], None]


def _set(section: str, name: str, convert: Callable[[Any], Any], target: str) -> Handler:
    """A handler that stores the converted value at draft.<section>[name] (section "" = the pipeline)."""

    def handle(d: _Draft, raw_key: str, value: Any) -> None:
        (d.res.pipeline if not section else getattr(d, section))[name] = convert(value)
        d.mapped(raw_key, target)

    return handle


def _tables(d: _Draft, raw_key: str, value: Any) -> None:
    d.tables = _list(value)
    d.mapped(raw_key, "table.identifier / tables[].identifier")


def _force_optional(d: _Draft, raw_key: str, value: Any) -> None:
    if _bool(value):
        d.mapped(raw_key, "(default: auto-created columns are optional)")
    else:
        d.unmapped(raw_key, "auto-created columns are always optional (except id_columns)")


def _commit_interval(d: _Draft, raw_key: str, value: Any) -> None:
    d.res.pipeline["schedule"], note = _schedule(int(value))
    d.mapped(raw_key, "schedule" + (f" ({note})" if note else ""))


def _tasks_max(d: _Draft, raw_key: str, value: Any) -> None:
    d.res.pipeline["spark"] = {"master": f"local[{int(value)}]"}
    d.mapped(raw_key, "spark.master local[N] (on a cluster: spark.conf executor cores/instances)")


def _catalog_name(d: _Draft, raw_key: str, value: Any) -> None:
    """``iceberg.catalog``: the catalog's name in the Connect sink (default ``iceberg``)."""
    d.catalog_name = str(value)
    d.mapped(raw_key, "catalog.name")


def _catalog_class(d: _Draft, raw_key: str, value: Any) -> None:
    cls = str(value).rsplit(".", 1)[-1]
    if cls in _CATALOG_CLASSES:
        d.catalog["type"] = _CATALOG_CLASSES[cls]
        d.mapped(raw_key, "catalog.properties.type")
    else:
        d.unmapped(raw_key, f"catalog class {value} has no pyiceberg equivalent")


_VALUE_CONVERTERS = {
    "AvroConverter": "avro",
    "JsonSchemaConverter": "json_schema",
    "ProtobufConverter": "protobuf",
    "StringConverter": "string",
    "ByteArrayConverter": "bytes",
}
_KEY_CONVERTERS = {"StringConverter": "string", "ByteArrayConverter": "bytes"}


def _value_converter(d: _Draft, raw_key: str, value: Any) -> None:
    cls = str(value).rsplit(".", 1)[-1]
    if cls == "JsonConverter":
        kind: str | None = "connect_json" if _bool(d.config.get("value.converter.schemas.enable", "true")) else "json"
    else:
        kind = _VALUE_CONVERTERS.get(cls)
    if kind is None:
        d.unmapped(raw_key, f"converter {value} is not supported (json, connect_json, avro, json_schema, protobuf, string, bytes)")
        return
    d.fmt["value"] = kind
    d.mapped(raw_key, f"format.value {kind}")


def _key_converter(d: _Draft, raw_key: str, value: Any) -> None:
    cls = str(value).rsplit(".", 1)[-1]
    kind = _KEY_CONVERTERS.get(cls)
    if kind:
        d.fmt["key"] = kind
        d.mapped(raw_key, f"format.key {kind}")
    else:
        d.unmapped(raw_key, f"keys are kept as a column only as string or bytes; {cls} keys are not read")


def _registry_auth(d: _Draft, raw_key: str, value: Any) -> None:
    d.fmt["registry_basic_auth"] = d.secret(raw_key, "registry_basic_auth")
    d.mapped(raw_key, "format.registry_basic_auth")


def _errors_tolerance(d: _Draft, raw_key: str, value: Any) -> None:
    d.dead_letter["policy"] = "dead_letter" if str(value) == "all" else "fail"
    d.mapped(raw_key, f"dead_letter.policy {d.dead_letter['policy']}")


def _not_mapped(why: str) -> Handler:
    return lambda d, raw_key, _value: d.unmapped(raw_key, why)


def _only_reported(target: str) -> Handler:
    return lambda d, raw_key, _value: d.mapped(raw_key, target)


DEBEZIUM_TRANSFORM = "org.apache.iceberg.connect.transforms.DebeziumTransform"


def _transform(d: _Draft, raw_key: str, value: Any) -> None:
    """The Iceberg sink's Debezium transform becomes the debezium value format with upserts by the id
    columns (its other keys come with it); other single message transforms are not run."""
    if not _has_debezium_transform(d.config):
        d.unmapped(raw_key, "single message transforms are not run; use format.* settings (flatten, map_columns, timestamps) or a view")
        return
    d.table["upsert"] = True  # the value format (debezium, debezium_avro, debezium_protobuf) is chosen with the converter
    d.mapped(
        raw_key, "format.value: debezium (debezium_avro with the Avro converter) + table.upsert (the envelope's op is the `_op` column)"
    )


def _has_debezium_transform(config: dict[str, Any]) -> bool:
    return any(str(k).startswith("transforms.") and str(k).endswith(".type") and str(v) == DEBEZIUM_TRANSFORM for k, v in config.items())


def _cdc_field(d: _Draft, raw_key: str, value: Any) -> None:
    if str(value) in ("_cdc.op", "_op") and _has_debezium_transform(d.config):
        d.mapped(raw_key, "(the debezium format's `_op` column)")
        return
    d.table["op_field"] = str(value)
    d.mapped(raw_key, "table.op_field (values I/U/D, and Debezium's c/r/u/d: table.op_values)")


# Keys matched exactly (after _kebab), then prefixes in order, then _IGNORED.
_EXACT: dict[str, Handler] = {
    "topics": _set("", "topics", _list, "topics"),
    "topics.regex": _set("", "topic_pattern", str, "topic_pattern"),
    "iceberg.tables": _tables,
    "iceberg.tables.dynamic-enabled": _set("routing", "dynamic", _bool, "routing.dynamic"),
    "iceberg.tables.route-field": _set("routing", "field", str, "routing.field"),
    "iceberg.tables.default-id-columns": _set("table", "id_columns", _list, "table.id_columns"),
    "iceberg.tables.default-partition-by": _set("table", "partition_by", _partition_fields, "table.partition_by"),
    "iceberg.tables.auto-create-enabled": _set("table", "auto_create", _bool, "table.auto_create"),
    "iceberg.tables.evolve-schema-enabled": _set("table", "evolve_schema", _bool, "table.evolve_schema"),
    "iceberg.tables.schema-force-optional": _force_optional,
    "iceberg.tables.schema-case-insensitive": _set("table", "case_insensitive", _bool, "table.case_insensitive"),
    "iceberg.tables.default-commit-branch": _set("table", "branch", str, "table.branch"),
    "iceberg.control.commit.interval-ms": _commit_interval,
    "tasks.max": _tasks_max,
    "iceberg.catalog": _catalog_name,
    "iceberg.catalog.catalog-impl": _catalog_class,
    "iceberg.catalog-name": _catalog_name,
    "value.converter": _value_converter,
    "value.converter.schemas.enable": _only_reported("format.value (json or connect_json)"),
    "value.converter.schema.registry.url": _set("fmt", "registry_url", lambda v: str(v).split(",")[0], "format.registry_url"),
    "value.converter.basic.auth.user.info": _registry_auth,
    "key.converter": _key_converter,
    "errors.tolerance": _errors_tolerance,
    "errors.deadletterqueue.topic.name": _set("dead_letter", "topic", str, "dead_letter.topic"),
    "iceberg.tables.cdc-field": _cdc_field,
    "iceberg.tables.upsert-mode-enabled": _set("table", "upsert", _bool, "table.upsert"),
    "name": _only_reported("name"),
}


def _table_property(prefix: str, target: str) -> Handler:
    def handle(d: _Draft, raw_key: str, value: Any) -> None:
        d.table.setdefault("properties", {})[raw_key[len(prefix) :]] = str(value)
        d.mapped(raw_key, target)

    return handle


_PER_TABLE = re.compile(r"^iceberg\.table\.(.+)\.(route-regex|id-columns|partition-by|commit-branch)$")
_PER_TABLE_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "route-regex": ("route_regex", str),
    "id-columns": ("id_columns", _list),
    "partition-by": ("partition_by", _partition_fields),
    "commit-branch": ("branch", str),
}


def _per_table(d: _Draft, raw_key: str, value: Any) -> None:
    mt = _PER_TABLE.match(_kebab(raw_key))
    if not mt:
        d.unmapped(raw_key, "unknown per-table key")
        return
    ident, what = mt.group(1), mt.group(2)
    name, convert = _PER_TABLE_KEYS[what]
    d.per_table.setdefault(ident, {})[name] = convert(value)
    d.mapped(raw_key, f"tables[{ident}].{what.replace('-', '_').replace('commit_', '')}")


def _catalog_property(d: _Draft, raw_key: str, value: Any) -> None:
    prop = raw_key[len("iceberg.catalog.") :]
    if prop == "io-impl":
        d.unmapped(raw_key, "pyiceberg picks its FileIO from the warehouse scheme (py-io-impl to override)")
    elif prop == "uri" and str(value).startswith("jdbc:"):
        uri = _jdbc_uri(str(value))
        d.catalog["uri"] = d.secret(raw_key, "catalog_uri") if embeds_secret(uri) else uri
        d.catalog.setdefault("type", "sql")
        d.mapped(raw_key, "catalog.properties.uri (JDBC URL as a SQLAlchemy URL)")
    else:
        d.catalog[prop] = d.value_or_secret(raw_key, prop, value, "catalog_" + prop)
        d.mapped(raw_key, f"catalog.properties.{prop}")


_MANAGED = ("group.id", "enable.auto.commit", "isolation.level", "auto.offset.reset")


def _kafka_property(d: _Draft, raw_key: str, value: Any) -> None:
    prop = raw_key.split(".", 2)[2] if _kebab(raw_key).startswith("iceberg.kafka.") else raw_key[len("consumer.override.") :]
    if prop in _MANAGED:
        d.unmapped(raw_key, "managed by Tidewater (offsets live in the tables; new partitions start at the log start)")
    elif prop == "bootstrap.servers":
        d.bootstrap = d.bootstrap or str(value)
        d.mapped(raw_key, "kafka.bootstrap_servers")
    else:
        d.kafka_settings[prop] = d.value_or_secret(raw_key, prop, value, "kafka_" + prop)
        d.mapped(raw_key, f"kafka.settings.{prop}")


_PREFIXES: tuple[tuple[str, Handler], ...] = (
    ("iceberg.tables.auto-create-props.", _table_property("iceberg.tables.auto-create-props.", "table.properties")),
    (
        "iceberg.tables.write-props.",
        _table_property("iceberg.tables.write-props.", "table.properties (write properties are table properties here)"),
    ),
    ("iceberg.table.", _per_table),
    ("iceberg.catalog.", _catalog_property),
    ("iceberg.kafka.", _kafka_property),
    ("consumer.override.", _kafka_property),
    ("transforms", _transform),
)


def _handler(key: str) -> Handler:
    if key in _EXACT:
        return _EXACT[key]
    for prefix, handler in _PREFIXES:
        if key.startswith(prefix):
            return handler
    if key in _IGNORED:
        return _not_mapped(_IGNORED[key])
    return _not_mapped("not a setting Tidewater knows")


def _assemble(d: _Draft) -> None:
    """The pipeline document from what the keys set: sections, the single table or the routing."""
    p = d.res.pipeline
    if not p.get("topics") and not p.get("topic_pattern"):
        raise ConfigError("connector configuration: no `topics` or `topics.regex`")
    p.setdefault("topics", [])
    p["kafka"] = {
        "bootstrap_servers": d.bootstrap or "${KAFKA_BOOTSTRAP_SERVERS}",
        **({"settings": d.kafka_settings} if d.kafka_settings else {}),
    }
    if not d.bootstrap:
        d.res.env.append(("(bootstrap servers)", "KAFKA_BOOTSTRAP_SERVERS"))
    # Rows carry their source (topic, partition, offset): replay and backfills work on the imported pipeline.
    d.fmt.setdefault("metadata", "prefixed")
    if _has_debezium_transform(d.config):
        d.fmt["value"] = {"avro": "debezium_avro", "protobuf": "debezium_protobuf"}.get(str(d.fmt.get("value")), "debezium")
    catalog = {**({"name": d.catalog_name} if d.catalog_name else {}), **({"properties": d.catalog} if d.catalog else {})}
    for section, value in (("format", d.fmt), ("catalog", catalog), ("dead_letter", d.dead_letter)):
        if value:
            p[section] = value
    dynamic = bool(d.routing.get("dynamic"))
    if dynamic and not d.routing.get("field"):
        raise ConfigError("iceberg.tables.dynamic-enabled needs iceberg.tables.route-field")
    if not (dynamic or len(d.tables) > 1 or bool(d.routing.get("field"))):
        if len(d.tables) != 1:
            raise ConfigError("connector configuration: `iceberg.tables` names no table")
        d.table["identifier"] = d.tables[0]
        own = d.per_table.pop(d.tables[0], {})
        d.table.update({k: v for k, v in own.items() if k != "route_regex"})
        p["table"] = d.table
    else:
        if d.table.pop("op_field", None) is not None or d.table.pop("upsert", None) is not None:
            d.table.pop("upsert", None)
            moved = [k for k, t in d.res.mapped if t.startswith(("table.op_field", "table.upsert"))]
            d.res.mapped = [(k, t) for k, t in d.res.mapped if k not in moved]
            for k in moved:
                d.unmapped(
                    k,
                    "a routed change table is listed under `tables` with its one topic and id_columns: set "
                    "tables[].upsert there by hand (or one pipeline per table)",
                )
        p["table"] = d.table
        first = (d.tables[0] if d.tables else "").rsplit(".", 1)
        d.routing["namespace"] = first[0] if len(first) == 2 else "default"
        if dynamic:
            d.routing["table_template"] = "{value}"
        p["routing"] = d.routing
        idents = d.tables if not dynamic else list(d.per_table)
        p["tables"] = [{"identifier": t, **d.per_table.pop(t, {})} for t in idents]
        if not p["tables"]:
            del p["tables"]
    for ident in d.per_table:
        d.unmapped(f"iceberg.table.{ident}.*", "table not listed in iceberg.tables")


def _retarget_catalog(d: _Draft, catalog: str | None, catalog_uri: str | None, warehouse: str | None) -> None:
    """The import options that point the pipeline at another catalog than the connector's."""
    if catalog is not None:
        if catalog != "local":
            raise ConfigError(f"--catalog: {catalog!r} is not known (only `local`: the default SQLite catalog)")
        if d.catalog:
            d.res.notes.append("catalog.properties of the connector replaced by the local default catalog (--catalog local)")
        d.catalog = {}
    if catalog_uri:
        d.catalog = {
            "type": "rest" if catalog_uri.startswith(("http://", "https://")) else "sql",
            "uri": d.value_or_secret("--catalog-uri", "uri", catalog_uri, "catalog_uri"),
        }
        d.res.notes.append("catalog.properties: type and uri from --catalog-uri (the connector's catalog settings dropped)")
    if warehouse:
        d.catalog["warehouse"] = warehouse
        d.res.notes.append("catalog.properties.warehouse from --warehouse")


def convert(
    doc: dict[str, Any],
    name: str | None = None,
    bootstrap: str | None = None,
    *,
    catalog: str | None = None,
    catalog_uri: str | None = None,
    warehouse: str | None = None,
) -> ImportResult:
    """Map a connector configuration to a pipeline document (a dict ready for YAML). ``catalog="local"``,
    ``catalog_uri`` and ``warehouse`` replace the connector's catalog settings."""
    if not isinstance(doc, dict):
        raise ConfigError("connector configuration: expected a JSON object")
    config = doc.get("config", doc)
    if not isinstance(config, dict):
        raise ConfigError("connector configuration: `config` must be a JSON object")
    conn_name = doc.get("name") or config.get("name") or "connector"
    res = ImportResult({})
    res.pipeline["name"] = _name(name or str(conn_name))
    res.pipeline["description"] = f"Imported from Kafka Connect connector {conn_name!r}."
    draft = _Draft(res, config, "TIDEWATER_" + res.pipeline["name"].upper() + "_", bootstrap)
    for raw_key, value in config.items():
        _handler(_kebab(raw_key))(draft, raw_key, value)
    _retarget_catalog(draft, catalog, catalog_uri, warehouse)
    _assemble(draft)
    return res


def to_yaml(res: ImportResult) -> str:
    head = "# Imported by `tidewater connect-import`.\n" + "".join(f"# {line}\n" for line in res.report().splitlines())
    return head + yaml.safe_dump(res.pipeline, sort_keys=False)
