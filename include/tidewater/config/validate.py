"""Checks of a parsed pipeline that need more than types; every error names the key at fault."""

from __future__ import annotations

import re

from tidewater.config.formats import DEBEZIUM_FORMATS, FORMATS
from tidewater.config.partitioning import check_config
from tidewater.config.routes import SOURCE_PLACEHOLDER, TOPIC_PLACEHOLDER
from tidewater.config.sections.run import catalog_type
from tidewater.config.sections.table import RouteTableSpec, TableSpec
from tidewater.config.spec import PipelineSpec
from tidewater.config.times import parse_time
from tidewater.errors import ConfigError, config_problems, problems_of
from tidewater.staging import LOCAL_SCHEMES, scheme_of

OPERATIONS = ("insert", "update", "delete", "truncate")  # what an op value may mean (transform/changes.py)
NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
IDENTIFIER_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def validate(spec: PipelineSpec) -> None:
    """Checks across fields, section by section. Raises one ConfigError naming the key at fault in every
    section that has a problem (the first problem of each section)."""
    problems: list[str] = []
    for check in SECTIONS:
        try:
            check(spec)
        except ConfigError as e:
            problems.extend(problems_of(e))
    if problems:
        raise config_problems(problems)


def _check_name_and_topics(spec: PipelineSpec) -> None:
    """Pipeline name and source topics."""
    if not spec.name:
        raise ConfigError("name: required")
    if not NAME.match(spec.name):
        raise ConfigError(f"name: {spec.name!r} must be lower-case letters, digits and '_', starting with a letter")
    if not spec.topics and not spec.topic_pattern:
        raise ConfigError("topics: at least one topic (or a topic_pattern) is required")
    if spec.topic_pattern is not None:
        try:
            re.compile(spec.topic_pattern)
        except re.error as e:
            raise ConfigError(f"topic_pattern: {spec.topic_pattern!r} is not a valid regular expression ({e})") from None
    for i, t in enumerate(spec.topics):
        if not TOPIC.match(t):
            raise ConfigError(f"topics[{i}]: {t!r} is not a valid Kafka topic name")
    if len(set(spec.topics)) != len(spec.topics):
        raise ConfigError("topics: a topic is listed twice")


def _check_targets(spec: PipelineSpec) -> None:
    """The target table, or the routing settings and target tables."""
    if spec.routed:
        _validate_routing(spec)
    elif not spec.table.identifier:
        raise ConfigError("table.identifier: required (namespace.name)")
    else:
        check_identifier("table.identifier", spec.table.identifier)

    check_config(spec.table.partition_by, spec.table.sort_by, "table")


def _check_kafka(spec: PipelineSpec) -> None:
    """Kafka settings that Tidewater manages itself are refused."""
    if not spec.kafka.bootstrap_servers and not spec.kafka.conn_id:
        raise ConfigError("kafka: set either bootstrap_servers or conn_id")
    for key in ("group.id", "enable.auto.commit", "isolation.level", "enable.partition.eof"):
        if key in spec.kafka.settings:
            raise ConfigError(f"kafka.settings.{key}: managed by Tidewater (offsets live in the table); remove it")
    if spec.kafka.read_timeout_seconds <= 0:
        raise ConfigError("kafka.read_timeout_seconds: must be positive")
    if spec.kafka.start_from not in ("earliest", "latest"):
        parse_time(spec.kafka.start_from, "kafka.start_from (earliest, latest, or an ISO-8601 time)")


def _check_format(spec: PipelineSpec) -> None:
    """Value format, key format, time zone, date-time columns, flattening, source columns."""
    formats = tuple(FORMATS)
    if spec.format.value not in formats:
        raise ConfigError(f"format.value: {spec.format.value!r} is not supported (supported: {', '.join(formats)})")
    if FORMATS[spec.format.value].registry and not spec.format.registry_url and not spec.format.registry_conn_id:
        raise ConfigError(f"format.registry_url: required for value format {spec.format.value} (or format.registry_conn_id)")
    if spec.format.message and "protobuf" not in FORMATS[spec.format.value].module:
        raise ConfigError(
            f"format.message: names a Protobuf message type; value format {spec.format.value} has none (protobuf and debezium_protobuf do)"
        )
    if spec.format.skip_control_events and not FORMATS[spec.format.value].control_classes:
        raise ConfigError(
            f"format.skip_control_events: value format {spec.format.value} has no control events ({', '.join(DEBEZIUM_FORMATS)} do)"
        )
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(spec.format.timezone)
    except Exception:  # noqa: BLE001 - ZoneInfo's several kinds (not found, bad key, a folder): not a zone
        raise ConfigError(f"format.timezone: {spec.format.timezone!r} is not an IANA time zone name") from None
    for column, tfmt in spec.format.timestamps.items():
        if tfmt not in ("iso8601", "epoch_millis", "epoch_seconds") and "%" not in tfmt:
            raise ConfigError(f"format.timestamps.{column}: {tfmt!r} is not iso8601, epoch_millis, epoch_seconds or a strftime pattern")
    if not re.match(r"^[A-Za-z0-9_]{1,8}$", spec.format.flatten_separator):
        raise ConfigError(f"format.flatten_separator: {spec.format.flatten_separator!r} must be 1-8 letters, digits or '_'")


def _check_quality_gate(spec: PipelineSpec) -> None:
    """The quality gate's policy and id checks."""
    if spec.validation.unique_ids != "none" and not spec.routed and not spec.table.id_columns:
        raise ConfigError("validation.unique_ids: needs table.id_columns")


def _check_changes(spec: PipelineSpec) -> None:
    """Upserts and change streams (`table.upsert`, `table.op_field`; per table of a routed pipeline)."""
    if spec.routed:
        _check_routed_changes(spec)
        return
    t = spec.table
    if t.upsert or t.op_field:
        _check_change_table(spec, t, "table")


def _check_change_table(spec: PipelineSpec, t: TableSpec, where: str) -> None:
    """One change table's settings (``where``: `table` or `tables[i]`)."""
    key = f"{where}.op_field" if t.op_field and not t.upsert else f"{where}.upsert"
    if not t.id_columns and not (spec.routed and spec.format.value in DEBEZIUM_FORMATS):
        raise ConfigError(
            f"{key}: needs {where}.id_columns (the columns that identify a row; a routed Debezium "
            "pipeline may leave them to the message keys)"
        )
    if spec.format.metadata != "prefixed":
        raise ConfigError(f"{key}: needs format.metadata: prefixed (changes to a key are ordered by partition and offset)")
    if t.key_source == "message_key" and t.op_field:
        raise ConfigError(f"{where}.key_source: message_key is for upserts without an op field (tombstones delete)")
    for value, op in t.op_values.items():
        if op not in OPERATIONS:
            raise ConfigError(f"{where}.op_values.{value}: {op!r} is not insert, update, delete or truncate")


def _check_routed_changes(spec: PipelineSpec) -> None:
    """Change tables of a routed pipeline: dynamic ones (`table.upsert` / `op_field` as the defaults: every table
    the routes name applies changes) and those listed under `tables`, each fed by one topic (a key's changes are
    ordered by partition and offset, which only means something within one topic; the commit refuses a dynamic
    table fed by two), keys from the value."""
    if spec.table.upsert or spec.table.op_field:
        if not spec.routing.dynamic:
            raise ConfigError(
                "table.upsert / op_field: on a routed pipeline with static `tables`, set them per table "
                "under `tables` (or route dynamically: routing.dynamic)"
            )
        _check_change_table(spec, spec.table, "table")
        template = spec.routing.table_template
        if spec.table.key_source != "value" and ("{value}" in template or spec.routes_by_source):
            raise ConfigError(
                "table.key_source: message_key needs tables named by their topic alone "
                f"(routing.table_template {template!r} takes the record's values)"
            )
    single_topic = len(spec.topics) == 1 and not spec.topic_pattern
    for i, t in enumerate(spec.tables):
        if not (t.upsert or t.op_field):
            continue
        where = f"tables[{i}]"
        _check_change_table(spec, t, where)
        if len(t.topics) != 1 and not single_topic and not spec.routing.dynamic:
            raise ConfigError(
                f"{where}.topics: a change table takes the records of exactly one topic (a key's changes "
                "are ordered by partition and offset within a topic); list that topic"
            )
        if t.key_source != "value":
            _check_keyed_by_message(spec, t, where)


def _check_keyed_by_message(spec: PipelineSpec, t: RouteTableSpec, where: str) -> None:
    """A routed change table keyed by the message key: the key decides every record of its topic (tombstones become
    deletes), so the topic must go to this table alone, by topic."""
    others = [o.identifier for o in spec.tables if o.identifier != t.identifier and (not o.topics or set(o.topics) & set(t.topics))]
    if len(t.topics) != 1 or t.route_regex or others:
        raise ConfigError(
            f"{where}.key_source: message_key needs the table to take one topic by `topics`, without a "
            "route_regex, and no other table to take that topic" + (f" ({', '.join(others)} does)" if others else "")
        )


def _check_dead_letters(spec: PipelineSpec) -> None:
    """Dead-letter policy, topic and table."""
    if spec.dead_letter.topic is not None and (not TOPIC.match(spec.dead_letter.topic) or spec.dead_letter.topic in spec.topics):
        raise ConfigError(f"dead_letter.topic: {spec.dead_letter.topic!r} must be a valid Kafka topic name, not a source topic")
    if spec.dead_letter.topic and spec.dead_letter.policy != "dead_letter":
        raise ConfigError("dead_letter.topic: only used with dead_letter.policy: dead_letter")
    dlq = spec.dead_letter.table
    if dlq is not None and (
        dlq == spec.table.identifier or len(dlq.split(".")) < 2 or not all(IDENTIFIER_PART.match(p) for p in dlq.split("."))
    ):
        raise ConfigError(f"dead_letter.table: {dlq!r} must be `namespace.name` (letters, digits, '_'), not the target table")


def _check_limits_and_maintenance(spec: PipelineSpec) -> None:
    """Numeric limits, compaction strategy and the orphan-removal safety margin."""
    m = spec.maintenance
    for key, value, minimum in (
        ("batch.max_records", spec.batch.max_records, 1),
        ("batch.records_per_task", spec.batch.records_per_task, 1),
        ("batch.chunk_records", spec.batch.chunk_records, 1),
        ("batch.write_parallelism", spec.batch.write_parallelism, 0),
        ("validation.chunk_rows", spec.validation.chunk_rows, 1),
        ("format.flatten_max_depth", spec.format.flatten_max_depth, 1),
        ("format.max_nesting_depth", spec.format.max_nesting_depth, 1),
        ("table.max_new_columns", spec.table.max_new_columns, 1),
        ("table.max_columns", spec.table.max_columns, 1),
        ("table.max_field_name_length", spec.table.max_field_name_length, 1),
        ("airflow.task_timeout_minutes", spec.airflow.task_timeout_minutes, 1),
        ("maintenance.rewrite_data_files.min_input_files", m.rewrite_data_files.min_input_files, 1),
        ("maintenance.expire_snapshots.retain_last", m.expire_snapshots.retain_last, 1),
        ("maintenance.expire_snapshots.older_than_hours", m.expire_snapshots.older_than_hours, 0),
        *(
            (f"trigger.{k}", v, 1)
            for k, v in (
                ("pending_records", spec.trigger.pending_records),
                ("pending_bytes", spec.trigger.pending_bytes),
                ("max_age_seconds", spec.trigger.max_age_seconds),
            )
            if v is not None
        ),
        ("trigger.poll_seconds", spec.trigger.poll_seconds, 1),
    ):
        if value < minimum:
            raise ConfigError(f"{key}: must be at least {minimum}")
    if m.rewrite_data_files.strategy == "zorder" and not m.rewrite_data_files.zorder_columns:
        raise ConfigError("maintenance.rewrite_data_files.zorder_columns: needed for strategy zorder")
    longest_h = spec.longest_batch_seconds() / 3600
    if m.remove_orphan_files.older_than_hours < max(longest_h, 24):
        raise ConfigError(
            f"maintenance.remove_orphan_files.older_than_hours: {m.remove_orphan_files.older_than_hours:g} is less than "
            f"the longest possible batch ({longest_h:.1f} h from airflow.task_timeout_minutes, retries and "
            "retry_delay_seconds) or 24 h; a younger file may belong to a batch still being written"
        )


def _check_dotted(setting: str, value: str | None, example: str) -> None:
    """A setting naming a callable or a class to import: a dotted path (``module.name``), when set."""
    if value is not None and not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", value):
        raise ConfigError(f"{setting}: {value!r} is not a dotted path such as {example}")


def _check_dag_ids(spec: PipelineSpec) -> None:
    """``airflow.dag_id_prefix`` makes valid DAG ids; ``airflow.dags`` names optional DAGs only."""
    from tidewater.config.sections.airflow import OPTIONAL_DAGS

    if not re.fullmatch(r"[A-Za-z0-9_.-]*", spec.airflow.dag_id_prefix):
        raise ConfigError(
            f"airflow.dag_id_prefix: {spec.airflow.dag_id_prefix!r} may hold only letters, digits, '_', '-' and '.' (Airflow's DAG ids)"
        )
    unknown = [k for k in spec.airflow.dags if k not in OPTIONAL_DAGS]
    if unknown:
        raise ConfigError(
            f"airflow.dags: {', '.join(map(repr, unknown))} is not an optional DAG; choose among "
            f"{', '.join(OPTIONAL_DAGS)} (the ingest DAG is always there)"
        )


def _check_catalog_airflow_suites(spec: PipelineSpec) -> None:
    """Catalog properties, Airflow schedules and retries, and the expectation suite files."""
    check_schedule("schedule", spec.schedule)
    check_schedule("maintenance.schedule", spec.maintenance.schedule)
    # a catalog connection is resolved where the catalog is used, never at parse time (the DAG processor would ask
    # Airflow's secrets backend for every pipeline at every parse)
    props = spec.catalog.properties if spec.catalog.conn_id else spec.catalog_properties()
    if not spec.catalog.conn_id and "type" not in props and "uri" not in props:
        raise ConfigError("catalog.properties: set at least `type` (sql, rest, glue, hive) or `uri`")
    if spec.airflow.retries < 0:
        raise ConfigError("airflow.retries: must be zero or more")
    spec.airflow.freshness_interval()  # a ConfigError naming airflow.freshness when it is not a duration
    _check_dag_ids(spec)
    _check_dotted("airflow.on_failure", spec.airflow.on_failure, "'my_company.alerts.page_on_call'")
    _check_dotted("airflow.on_late", spec.airflow.on_late, "my_alerts.page_on_call or my_alerts.OnCallNotifier")
    suite = spec.suite_path()
    if suite is not None and not suite.is_file():
        raise ConfigError(f"{'table.suite' if spec.table.suite else 'validation.suite'}: file {suite} does not exist")
    for i, t in enumerate(spec.tables):
        if t.suite:
            path = spec.for_table(t.identifier).suite_path()
            if path is None or not path.is_file():
                raise ConfigError(f"tables[{i}].suite: file {path} does not exist")


def _check_staging(spec: PipelineSpec) -> None:
    """The staging area and the Data Docs project: a local path or a scheme the file layer serves (its filesystem
    is built, not reached); Spark's cluster deploy mode where Spark allows it."""
    from tidewater.staging import locate

    # the file settings of the pipeline's own properties: a connection is not resolved at parse time
    props = {**(spec.catalog.properties if spec.catalog.conn_id else spec.catalog_properties()), **spec.batch.staging_properties}
    if spec.batch.staging_dir:
        locate(spec.batch.staging_dir, props, "batch.staging_dir")
    if spec.spark.master.startswith("spark://") and spec.spark.conf.get("spark.submit.deployMode") == "cluster":
        raise cluster_mode_refused("spark.conf spark.submit.deployMode")
    if spec.validation.data_docs_dir:
        locate(spec.validation.data_docs_dir, props, "validation.data_docs_dir")


def _check_audit(spec: PipelineSpec) -> None:
    check_schedule("audit.schedule", spec.audit.schedule)
    if spec.audit.deep and spec.format.metadata not in ("prefixed", "struct"):
        raise ConfigError(
            "audit.deep: the deep audit reads each row's source offset; set format.metadata to prefixed "
            "or struct (the default), or turn audit.deep off"
        )


def cluster_mode_refused(setting: str) -> ConfigError:
    """The terminal error for a Python driver in cluster deploy mode on a standalone master (Spark refuses it)."""
    return ConfigError(
        f"{setting}: Spark runs a Python driver in cluster deploy mode on YARN and Kubernetes only, not "
        "on a standalone master; use client mode (the default: spark.conf spark.submit.deployMode, or "
        "the Airflow Spark connection's deploy-mode) or a Spark Connect server (spark.connect_url), with "
        "batch.staging_dir on object storage when the hosts share no disk"
    )


SECTIONS = (
    _check_name_and_topics,
    _check_targets,
    _check_kafka,
    _check_format,
    _check_quality_gate,
    _check_changes,
    _check_dead_letters,
    _check_limits_and_maintenance,
    _check_catalog_airflow_suites,
    _check_staging,
    _check_audit,
)


# Airflow's schedule presets (besides cron expressions).
SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly", "@annually", "@midnight")


def check_schedule(key: str, schedule: str | None) -> None:
    """A cron expression (5 or 6 fields, croniter's grammar, which Airflow uses) or one of Airflow's presets."""
    if schedule is None or schedule in SCHEDULE_PRESETS:
        return
    from croniter import croniter

    if not croniter.is_valid(schedule):
        raise ConfigError(f"{key}: {schedule!r} is neither a cron expression (e.g. '*/3 * * * *') nor one of {', '.join(SCHEDULE_PRESETS)}")


def check_identifier(key: str, ident: str) -> None:
    parts = ident.split(".")
    if len(parts) < 2 or not all(IDENTIFIER_PART.match(p) for p in parts):
        raise ConfigError(f"{key}: {ident!r} must be namespace.name made of letters, digits and '_'")


def _validate_routing(spec: PipelineSpec) -> None:
    r = spec.routing
    if spec.table.identifier:
        raise ConfigError(
            "table.identifier: not used when records are routed (`tables` or routing.dynamic); "
            "`table` holds the defaults of every target table, list the targets under `tables`"
        )
    if not r.namespace or not IDENTIFIER_PART.match(r.namespace):
        raise ConfigError(
            "routing.namespace: required when routing (letters, digits and '_'): it holds the pipeline's checkpoint and dead-letter tables"
        )
    if r.field is not None and not re.match(r"^[A-Za-z_$][A-Za-z0-9_$-]*(\.[A-Za-z_$][A-Za-z0-9_$-]*)*$", r.field):
        raise ConfigError(f"routing.field: {r.field!r} is not a field name or dotted path")
    if r.dynamic:
        _check_template(r.table_template, r.field, spec.format.value)
    seen: set[str] = set()
    for i, t in enumerate(spec.tables):
        _check_route_table(spec, f"tables[{i}]", t, seen)
    for ident in (spec.checkpoint_table(), spec.dead_letter_table(), spec.ledger_table()):
        if ident in seen:
            raise ConfigError(f"tables: {ident!r} is the pipeline's own checkpoint, dead-letter or ledger table")


def _check_template(template: str, field: str | None, fmt: str) -> None:
    """`routing.table_template`: `{value}` (the route field's value) once, or the topic placeholders alone, or
    (Debezium formats) the envelope's `{source.<field>}` placeholders in the table name."""
    by_topic = bool(TOPIC_PLACEHOLDER.search(template))
    by_source = bool(SOURCE_PLACEHOLDER.search(template))
    rest = SOURCE_PLACEHOLDER.sub("s", TOPIC_PLACEHOLDER.sub("t", template)).replace("{value}", "v")
    if "{" in rest or "}" in rest:
        raise ConfigError(
            f"routing.table_template: {template!r}: the placeholders are {{value}}, {{topic}}, "
            "{topic[N]} (the N-th dot-separated part of the topic's name, negative from the end) and, "
            "for Debezium formats, {source.<field>} (a field of the envelope's source block)"
        )
    if by_source:
        if fmt not in DEBEZIUM_FORMATS:
            raise ConfigError(
                f"routing.table_template: {template!r}: {{source.<field>}} needs a Debezium format "
                f"(format.value {', '.join(DEBEZIUM_FORMATS)}; not {fmt})"
            )
        if "{value}" in template:
            raise ConfigError(f"routing.table_template: {template!r}: use {{value}} or {{source.<field>}}, not both")
        if "\x00" in SOURCE_PLACEHOLDER.sub("\x00", template).rpartition(".")[0]:
            raise ConfigError(
                f"routing.table_template: {template!r}: {{source.<field>}} may only be in the table "
                "name, never in the namespace (records must not choose where their table lives)"
            )
        return
    if not by_topic or "{value}" in template:
        if not field:
            raise ConfigError("routing.field: required with routing.dynamic (or name tables by {topic} in routing.table_template)")
        if template.count("{value}") != 1:
            raise ConfigError(f"routing.table_template: {template!r} must contain {{value}} once (or {{topic}})")
        if "{value}" in template.rpartition(".")[0]:
            raise ConfigError(
                f"routing.table_template: {template!r}: {{value}} may only be in the table name, "
                "never in the namespace (records must not choose where their table lives)"
            )


def _check_route_table(spec: PipelineSpec, key: str, t: RouteTableSpec, seen: set[str]) -> None:
    """One entry of ``tables``: identifier (unique), route regex, topics, partitioning."""
    r = spec.routing
    if not t.identifier:
        raise ConfigError(f"{key}.identifier: required")
    check_identifier(f"{key}.identifier", t.identifier)
    if t.identifier in seen:
        raise ConfigError(f"{key}.identifier: {t.identifier!r} is listed twice")
    seen.add(t.identifier)
    if t.route_regex is not None:
        if r.dynamic:
            raise ConfigError(f"{key}.route_regex: not used with routing.dynamic (the value names the table)")
        if not r.field:
            raise ConfigError(f"{key}.route_regex: needs routing.field")
        try:
            re.compile(t.route_regex)
        except re.error as e:
            raise ConfigError(f"{key}.route_regex: {t.route_regex!r} is not a valid regular expression ({e})") from None
    for topic in t.topics:
        listed = topic in spec.topics or (spec.topic_pattern and re.fullmatch(spec.topic_pattern, topic))
        if not listed:
            raise ConfigError(f"{key}.topics: {topic!r} is not one of the pipeline's topics (or topic_pattern)")

    check_config(t.partition_by, t.sort_by, key)


SINGLE_HOST_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})
"""Airflow executors that run every task of a DAG run on the host of the scheduler that runs them."""


def multi_host(executor: str | None) -> bool:
    """Whether Airflow's ``[core] executor`` setting (one executor or a comma-separated list, each by name or import
    path, with an optional ``alias:`` in front) can run a DAG run's tasks on different hosts: any executor but the
    single-host ones (Celery, Kubernetes, Edge, a custom one)."""
    names = [part.split(":")[-1].strip().rsplit(".", 1)[-1] for part in (executor or "").split(",") if part.strip()]
    return any(n not in SINGLE_HOST_EXECUTORS for n in names)


def check_hosts(spec: PipelineSpec, executor: str | None) -> None:
    """Refuse every per-host place of a pipeline's state when Airflow's executor can run a batch's tasks on different
    hosts (Celery, Kubernetes, Edge: :func:`multi_host`). Each would split what one batch needs between hosts with no
    error: the plan task and the commit task reading offsets from different catalogs (exactly-once broken), the write
    task not finding the plan, the api-server not finding the Data Docs. Refused, each naming its setting:

    - the defaults under ``$TIDEWATER_HOME`` (no catalog settings, no ``batch.staging_dir``, no
      ``validation.data_docs_dir``);
    - a SQLite catalog (``catalog.properties.uri``), even on a shared mount (SQLite's locks do not hold over NFS);
    - a local or ``file://`` warehouse, staging folder or Data Docs folder, unless it lies under one of
      ``airflow.shared_paths``, the mounts a platform declares every host has.

    A catalog from ``catalog.conn_id`` is not read here (nothing is contacted when a DAG file is parsed)."""
    if not multi_host(executor):
        return
    problems = [
        f"{setting}: Airflow's executor ({executor}) can run a batch's tasks on different hosts, and {why}"
        for setting, why in _per_host_places(spec)
    ]
    if problems:
        raise config_problems(problems)


def _per_host_places(spec: PipelineSpec):
    """(setting, why) for each place of ``spec`` that only one host sees (:func:`check_hosts`)."""
    shared = [p.rstrip("/") + "/" for p in spec.airflow.shared_paths]
    advice = "object storage (`s3://bucket/prefix`, `gs://`, `abfs://`), or a path every worker mounts, declared in `airflow.shared_paths`"
    props = spec.catalog.properties
    if not props and not spec.catalog.conn_id:
        yield (
            "catalog.properties",
            "without catalog properties each host has its own SQLite catalog under "
            "$TIDEWATER_HOME, so each would read and write the committed offsets in a different catalog. Set a "
            "catalog every host reaches (PostgreSQL `type: sql`, `rest`, `glue` or `hive`), or `catalog.conn_id`",
        )
    if str(props.get("uri", "")).startswith("sqlite"):
        yield (
            "catalog.properties.uri",
            f"{props['uri']!r} is a SQLite file: each host would have its own (and "
            "SQLite's locks do not hold on a shared mount). Use PostgreSQL (`postgresql+psycopg2://...`), a REST "
            "catalog or Glue",
        )
    warehouse = props.get("warehouse")
    # a REST catalog's warehouse is a name the server resolves, not a place
    if warehouse and catalog_type(props) != "rest" and _per_host(str(warehouse), shared):
        yield (
            "catalog.properties.warehouse",
            f"{warehouse!r} is a local folder: the data files written on one host would be missing on the others. Use {advice}",
        )
    for setting, place, default in (
        ("batch.staging_dir", spec.batch.staging_dir, "$TIDEWATER_HOME/staging"),
        ("validation.data_docs_dir", spec.validation.data_docs_dir, "$TIDEWATER_HOME/data-docs"),
    ):
        if place is None:
            yield (
                setting,
                f"by default each host keeps it under its own {default}, where the next task (or the "
                f"api-server) would not find it. Use {advice}",
            )
        elif _per_host(place, shared):
            yield (setting, f"{place!r} is a local folder that the next task's host (or the api-server) would not see. Use {advice}")


def _per_host(location: str, shared: list[str]) -> bool:
    """Whether ``location`` (a path, ``file://`` or a URI) is on a host's own disk: local, and under no shared mount."""
    scheme = scheme_of(location)
    if scheme not in LOCAL_SCHEMES:
        return False
    path = location[len("file://") :] if scheme else location
    return not any((path.rstrip("/") + "/").startswith(prefix) for prefix in shared)
