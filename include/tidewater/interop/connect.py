"""`tidewater connect-import`: a Kafka Connect Iceberg sink configuration into a pipeline specification.

Accepts the JSON posted to the Connect REST API, with or without the ``name``/``config`` wrapper, in
the Apache Iceberg spelling (``iceberg.tables.route-field``) or the original one
(``iceberg.tables.routeField``). Every key is either mapped or reported with the reason it was not.
Secrets are never copied into the file: they become ``${ENV_VAR}`` references, reported as such.
"""


from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tidewater.config.spec import is_secret_key
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

    def report(self) -> str:
        lines = [f"mapped {len(self.mapped)} key(s):"]
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
        return "sqlite:///" + uri[len("jdbc:sqlite:"):]  # an absolute path gives sqlite:////path
    if uri.startswith("jdbc:postgresql:"):
        return "postgresql+psycopg2:" + uri[len("jdbc:postgresql:"):]
    return uri


def convert(doc: dict[str, Any], name: str | None = None, bootstrap: str | None = None) -> ImportResult:
    """Map a connector configuration to a pipeline document (a dict ready for YAML)."""
    if not isinstance(doc, dict):
        raise ConfigError("connector configuration: expected a JSON object")
    config = doc.get("config", doc)
    if not isinstance(config, dict):
        raise ConfigError("connector configuration: `config` must be a JSON object")
    conn_name = doc.get("name") or config.get("name") or "connector"
    res = ImportResult({})
    p = res.pipeline
    p["name"] = _name(name or str(conn_name))
    p["description"] = f"Imported from Kafka Connect connector {conn_name!r}."
    table: dict[str, Any] = {}
    per_table: dict[str, dict[str, Any]] = {}
    catalog: dict[str, str] = {}
    kafka_settings: dict[str, str] = {}
    fmt: dict[str, Any] = {}
    routing: dict[str, Any] = {}
    tables: list[str] = []
    dead_letter: dict[str, Any] = {}
    env_prefix = "TIDEWATER_" + p["name"].upper() + "_"

    def secret(key: str, value: Any, target: str) -> str:
        var = env_prefix + re.sub(r"[^A-Z0-9]+", "_", target.upper()).strip("_")
        res.env.append((key, var))
        return "${" + var + "}"

    for raw_key, value in config.items():
        key = _kebab(raw_key)
        m = res.mapped.append
        if key in ("topics",):
            p["topics"] = _list(value)
            m((raw_key, "topics"))
        elif key == "topics.regex":
            p["topic_pattern"] = str(value)
            m((raw_key, "topic_pattern"))
        elif key == "iceberg.tables":
            tables = _list(value)
            m((raw_key, "table.identifier / tables[].identifier"))
        elif key == "iceberg.tables.dynamic-enabled":
            routing["dynamic"] = _bool(value)
            m((raw_key, "routing.dynamic"))
        elif key == "iceberg.tables.route-field":
            routing["field"] = str(value)
            m((raw_key, "routing.field"))
        elif key == "iceberg.tables.default-id-columns":
            table["id_columns"] = _list(value)
            m((raw_key, "table.id_columns"))
        elif key == "iceberg.tables.default-partition-by":
            table["partition_by"] = _partition_fields(value)
            m((raw_key, "table.partition_by"))
        elif key == "iceberg.tables.auto-create-enabled":
            table["auto_create"] = _bool(value)
            m((raw_key, "table.auto_create"))
        elif key.startswith("iceberg.tables.auto-create-props."):
            table.setdefault("properties", {})[raw_key[len("iceberg.tables.auto-create-props."):]] = str(value)
            m((raw_key, "table.properties"))
        elif key.startswith("iceberg.tables.write-props."):
            table.setdefault("properties", {})[raw_key[len("iceberg.tables.write-props."):]] = str(value)
            m((raw_key, "table.properties (write properties are table properties here)"))
        elif key == "iceberg.tables.evolve-schema-enabled":
            table["evolve_schema"] = _bool(value)
            m((raw_key, "table.evolve_schema"))
        elif key == "iceberg.tables.schema-force-optional":
            if _bool(value):
                m((raw_key, "(default: auto-created columns are optional)"))
            else:
                res.unmapped.append((raw_key, "auto-created columns are always optional (except id_columns)"))
        elif key == "iceberg.tables.schema-case-insensitive":
            table["case_insensitive"] = _bool(value)
            m((raw_key, "table.case_insensitive"))
        elif key == "iceberg.tables.default-commit-branch":
            table["branch"] = str(value)
            m((raw_key, "table.branch"))
        elif key.startswith("iceberg.table."):
            mt = re.match(r"^iceberg\.table\.(.+)\.(route-regex|id-columns|partition-by|commit-branch)$", key)
            if not mt:
                res.unmapped.append((raw_key, "unknown per-table key"))
                continue
            ident, what = mt.group(1), mt.group(2)
            t = per_table.setdefault(ident, {})
            if what == "route-regex":
                t["route_regex"] = str(value)
            elif what == "id-columns":
                t["id_columns"] = _list(value)
            elif what == "partition-by":
                t["partition_by"] = _partition_fields(value)
            else:
                t["branch"] = str(value)
            m((raw_key, f"tables[{ident}].{what.replace('-', '_').replace('commit_', '')}"))
        elif key in ("iceberg.control.commit.interval-ms",):
            p["schedule"], note = _schedule(int(value))
            m((raw_key, "schedule" + (f" ({note})" if note else "")))
        elif key == "tasks.max":
            p["spark"] = {"master": f"local[{int(value)}]"}
            m((raw_key, "spark.master local[N] (on a cluster: spark.conf executor cores/instances)"))
        elif key == "iceberg.catalog" or key == "iceberg.catalog.catalog-impl":
            cls = str(value).rsplit(".", 1)[-1]
            if cls in _CATALOG_CLASSES:
                catalog["type"] = _CATALOG_CLASSES[cls]
                m((raw_key, "catalog.properties.type"))
            else:
                res.unmapped.append((raw_key, f"catalog class {value} has no pyiceberg equivalent"))
        elif key.startswith("iceberg.catalog."):
            prop = raw_key[len("iceberg.catalog."):]
            if prop == "io-impl":
                res.unmapped.append((raw_key, "pyiceberg picks its FileIO from the warehouse scheme (py-io-impl to override)"))
            elif prop.startswith("jdbc.") and prop[5:] in ("user", "password"):
                catalog[prop] = secret(raw_key, value, "catalog_" + prop) if is_secret_key(prop) else str(value)
                m((raw_key, f"catalog.properties.{prop}"))
            elif prop == "uri" and str(value).startswith("jdbc:"):
                catalog["uri"] = _jdbc_uri(str(value))
                catalog.setdefault("type", "sql")
                m((raw_key, "catalog.properties.uri (JDBC URL as a SQLAlchemy URL)"))
            else:
                catalog[prop] = secret(raw_key, value, "catalog_" + prop) if is_secret_key(prop) else str(value)
                m((raw_key, f"catalog.properties.{prop}"))
        elif key == "iceberg.catalog.name" or key == "iceberg.catalog-name":
            m((raw_key, "catalog.name"))
        elif key.startswith("iceberg.kafka.") or key.startswith("consumer.override."):
            prop = raw_key.split(".", 2)[2] if key.startswith("iceberg.kafka.") else raw_key[len("consumer.override."):]
            if prop in ("group.id", "enable.auto.commit", "isolation.level", "auto.offset.reset"):
                res.unmapped.append((raw_key, "managed by Tidewater (offsets live in the tables; new partitions start at the log start)"))
            elif prop == "bootstrap.servers":
                bootstrap = bootstrap or str(value)
                m((raw_key, "kafka.bootstrap_servers"))
            else:
                kafka_settings[prop] = secret(raw_key, value, "kafka_" + prop) if is_secret_key(prop) else str(value)
                m((raw_key, f"kafka.settings.{prop}"))
        elif key == "value.converter":
            cls = str(value).rsplit(".", 1)[-1]
            schemas = _bool(config.get("value.converter.schemas.enable", "true"))
            fmt["value"] = {"JsonConverter": "connect_json" if schemas else "json", "AvroConverter": "avro",
                            "StringConverter": "string", "ByteArrayConverter": "bytes"}.get(cls)
            if fmt["value"] is None:
                del fmt["value"]
                res.unmapped.append((raw_key, f"converter {value} is not supported (json, connect_json, avro, string, bytes)"))
            else:
                m((raw_key, f"format.value {fmt['value']}"))
        elif key == "value.converter.schemas.enable":
            m((raw_key, "format.value (json or connect_json)"))
        elif key == "value.converter.schema.registry.url":
            fmt["registry_url"] = str(value).split(",")[0]
            m((raw_key, "format.registry_url"))
        elif key == "value.converter.basic.auth.user.info":
            fmt["registry_basic_auth"] = secret(raw_key, value, "registry_basic_auth")
            m((raw_key, "format.registry_basic_auth"))
        elif key == "key.converter":
            cls = str(value).rsplit(".", 1)[-1]
            kind = {"StringConverter": "string", "ByteArrayConverter": "bytes"}.get(cls)
            if kind:
                fmt["key"] = kind
                m((raw_key, f"format.key {kind}"))
            else:
                res.unmapped.append((raw_key, f"keys are kept as a column only as string or bytes; {cls} keys are not read"))
        elif key == "errors.tolerance":
            dead_letter["policy"] = "dead_letter" if str(value) == "all" else "fail"
            m((raw_key, f"dead_letter.policy {dead_letter['policy']}"))
        elif key == "errors.deadletterqueue.topic.name":
            dead_letter["topic"] = str(value)
            m((raw_key, "dead_letter.topic"))
        elif key in ("iceberg.tables.cdc-field", "iceberg.tables.upsert-mode-enabled"):
            res.unmapped.append((raw_key, "applying changes (deletes, upserts) is not supported yet: change events land "
                                          "as rows (use format.value debezium for an _op column)"))
        elif key.startswith("transforms"):
            res.unmapped.append((raw_key, "single message transforms are not run; use format.* settings "
                                          "(flatten, map_columns, timestamps) or a view"))
        elif key == "name":
            m((raw_key, "name"))
        elif key in _IGNORED:
            res.unmapped.append((raw_key, _IGNORED[key]))
        else:
            res.unmapped.append((raw_key, "not a setting Tidewater knows"))

    if not p.get("topics") and not p.get("topic_pattern"):
        raise ConfigError("connector configuration: no `topics` or `topics.regex`")
    p.setdefault("topics", [])
    p["kafka"] = {"bootstrap_servers": bootstrap or "${KAFKA_BOOTSTRAP_SERVERS}", **({"settings": kafka_settings} if kafka_settings else {})}
    if not bootstrap:
        res.env.append(("(bootstrap servers)", "KAFKA_BOOTSTRAP_SERVERS"))
    if fmt:
        p["format"] = fmt
    if catalog:
        p["catalog"] = {"properties": catalog}
    if dead_letter:
        p["dead_letter"] = dead_letter
    dynamic = bool(routing.get("dynamic"))
    if dynamic and not routing.get("field"):
        raise ConfigError("iceberg.tables.dynamic-enabled needs iceberg.tables.route-field")
    routed = dynamic or len(tables) > 1 or bool(routing.get("field"))
    if not routed:
        if len(tables) != 1:
            raise ConfigError("connector configuration: `iceberg.tables` names no table")
        table["identifier"] = tables[0]
        own = per_table.pop(tables[0], {})
        table.update({k: v for k, v in own.items() if k != "route_regex"})
        p["table"] = table
    else:
        p["table"] = table
        first = (tables[0] if tables else "").rsplit(".", 1)
        routing["namespace"] = first[0] if len(first) == 2 else "default"
        if dynamic:
            routing["table_template"] = "{value}"
        p["routing"] = routing
        idents = tables if not dynamic else list(per_table)
        p["tables"] = [{"identifier": t, **per_table.pop(t, {})} for t in idents]
        if not p["tables"]:
            del p["tables"]
    for ident in per_table:
        res.unmapped.append((f"iceberg.table.{ident}.*", "table not listed in iceberg.tables"))
    return res


def to_yaml(res: ImportResult) -> str:
    import yaml

    head = "# Imported by `tidewater connect-import`.\n" + "".join(f"# {line}\n" for line in res.report().splitlines())
    return head + yaml.safe_dump(res.pipeline, sort_keys=False)
