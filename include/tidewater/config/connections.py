"""Settings held in Airflow connections, so that Airflow's secrets backends (Vault, AWS Secrets Manager, GCP Secret
Manager, ...) serve Tidewater's credentials as they serve every other operator's.

``kafka.conn_id`` (``source/kafka.py``), ``catalog.conn_id``, ``format.registry_conn_id`` and
``batch.staging_conn_id`` (here) name one. A
connection's secret values are registered with Airflow's log masker where Airflow runs, and never leave the process
but as the settings they become (the Spark job's private properties file and environment, as ``${ENV}`` values do).

A catalog connection becomes pyiceberg catalog properties by its type:

- ``postgres``, ``mysql``, ``sqlite``: ``type: sql``, and ``uri`` the SQLAlchemy URL of the host, port, login, password
  and database (the connection's schema); for ``sqlite`` the host is the database file.
- ``aws``: ``type: glue``, the login and password as ``client.access-key-id`` and ``client.secret-access-key``.
- ``http``, ``https`` or any other type with a host: ``type: rest``, ``uri`` the host (with its scheme and port), the
  login and password as ``credential`` (``login:password``, an OAuth2 client), a password alone as ``token``.

The connection's extra JSON is copied in as properties (``warehouse``, ``s3.*``, ``type``, ...) and wins over what
the fields give; the pipeline's own ``catalog.properties`` win over both.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tidewater.config.secrets import is_secret
from tidewater.errors import ConfigError

# Set by the ingest DAG for its spark-submit job, whose driver cannot ask Airflow: what the catalog's and the schema
# registry's connections resolve to
CATALOG_CONFIG_ENV = "TIDEWATER_CATALOG_CONFIG"
REGISTRY_CONFIG_ENV = "TIDEWATER_REGISTRY_CONFIG"
STORAGE_CONFIG_ENV = "TIDEWATER_STORAGE_CONFIG"
# an Airflow ``aws`` connection's extra keys, as pyiceberg FileIO properties
_AWS_EXTRA = {"endpoint_url": "s3.endpoint", "region_name": "s3.region", "aws_session_token": "s3.session-token"}
CACHE_SECONDS = 60.0  # a long-lived process (the API server) asks again after this; a task asks once
_SQL_DRIVERS = {"postgres": "postgresql+psycopg2", "postgresql": "postgresql+psycopg2", "mysql": "mysql+pymysql"}
_CACHE: dict[str, tuple[float, dict[str, str]]] = {}


def airflow_connection(conn_id: str, setting: str) -> Any:
    """The Airflow connection ``conn_id`` (``setting`` names the pipeline setting that asked, for the error)."""
    try:
        from airflow.sdk import BaseHook
    except ImportError:  # the command line without the airflow extra
        raise ConfigError(f"{setting}: Airflow is not installed, cannot resolve connection {conn_id!r}") from None
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as e:  # noqa: BLE001 - AirflowNotFoundException, or a secrets backend's own error: not found here
        raise ConfigError(f"{setting}: Airflow connection {conn_id!r} not found ({type(e).__name__})") from None
    if conn.password:  # whatever setting it becomes (a registry's `basic.auth.user.info` has no secret's name)
        mask({"password": conn.password})
    return conn


def mask(settings: dict[str, str]) -> None:
    """Register the secret values of ``settings`` with Airflow's log masker (nothing where Airflow is absent)."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:
        return
    for k, v in settings.items():
        if is_secret(k, v):
            mask_secret(v)


def catalog_connection(conn_id: str) -> dict[str, str]:
    """The catalog properties of the Airflow connection ``conn_id`` (see the module's table)."""
    return _resolved(conn_id, CATALOG_CONFIG_ENV, "catalog.conn_id", catalog_properties_of)


def registry_connection(conn_id: str) -> dict[str, str]:
    """The schema registry of the Airflow connection ``conn_id``: ``url`` (the host with its scheme and port),
    ``basic.auth.user.info`` (``login:password``) and the extra JSON's settings of confluent-kafka's registry client
    (``ssl.ca.location``, ``bearer.auth.*``, ...)."""
    return _resolved(conn_id, REGISTRY_CONFIG_ENV, "format.registry_conn_id", registry_settings_of)


def storage_connection(conn_id: str) -> dict[str, str]:
    """The object storage file settings (pyiceberg FileIO properties) of the Airflow connection ``conn_id``: an
    ``aws`` connection's login and password as ``s3.access-key-id`` and ``s3.secret-access-key``, its extra's
    ``endpoint_url``, ``region_name`` and ``aws_session_token`` as ``s3.endpoint``, ``s3.region`` and
    ``s3.session-token``; any extra key with a dot (``s3.*``, ``gcs.*``, ``adls.*``) as it is."""
    return _resolved(conn_id, STORAGE_CONFIG_ENV, "batch.staging_conn_id", storage_properties_of)


def storage_properties_of(conn: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    if conn.login:
        out["s3.access-key-id"] = conn.login
    if conn.password:
        out["s3.secret-access-key"] = conn.password
    for k, v in (conn.extra_dejson or {}).items():
        if k in _AWS_EXTRA:
            out[_AWS_EXTRA[k]] = str(v)
        elif "." in k:
            out[str(k)] = str(v)
    return out


def from_env(env_name: str) -> dict[str, str] | None:
    """The settings the ingest DAG gave its Spark job in ``env_name`` (a JSON object), or None when it is unset."""
    env = os.environ.get(env_name)
    if not env:
        return None
    try:
        return {str(k): str(v) for k, v in json.loads(env).items()}
    except (ValueError, AttributeError):
        raise ConfigError(f"{env_name}: not a JSON object") from None


def _resolved(conn_id: str, env_name: str, setting: str, build: Any) -> dict[str, str]:
    """What ``build`` makes of the connection: from the environment the ingest DAG gave its Spark job (``env_name``),
    else from Airflow (kept for ``CACHE_SECONDS``), its secret values masked."""
    given = from_env(env_name)
    if given is not None:
        return given
    cached = _CACHE.get(setting + ":" + conn_id)
    if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
        return cached[1]
    props = build(airflow_connection(conn_id, setting))
    mask(props)
    _CACHE[setting + ":" + conn_id] = (time.monotonic(), props)
    return props


def _url(conn: Any) -> str:
    """The connection's host as a URL: its scheme (``https`` for that connection type, else ``http``) and port."""
    kind = (conn.conn_type or "").lower()
    host = conn.host if "://" in conn.host else f"{'https' if kind == 'https' else 'http'}://{conn.host}"
    return f"{host}:{conn.port}" if conn.port and host.count(":") < 2 else host


def registry_settings_of(conn: Any) -> dict[str, str]:
    """The schema registry client's settings from a connection (see ``registry_connection``)."""
    if not conn.host:
        raise ConfigError(f"format.registry_conn_id: Airflow connection {conn.conn_id!r} has no host (the registry's URL)")
    out = {"url": _url(conn)}
    if conn.login:
        out["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
    out.update({str(k): str(v) for k, v in (conn.extra_dejson or {}).items()})
    return out


def catalog_properties_of(conn: Any) -> dict[str, str]:
    """pyiceberg catalog properties from a connection's type, fields and extra JSON."""
    kind = (conn.conn_type or "").lower()
    out: dict[str, str] = {}
    if kind in _SQL_DRIVERS or kind == "sqlite":
        out["type"] = "sql"
        if kind == "sqlite":
            out["uri"] = f"sqlite:///{conn.host}"
        else:
            from sqlalchemy.engine import URL

            url = URL.create(_SQL_DRIVERS[kind], username=conn.login or None, password=conn.password or None,
                             host=conn.host or None, port=conn.port or None, database=conn.schema or None)
            out["uri"] = url.render_as_string(hide_password=False)
    elif kind == "aws":
        out["type"] = "glue"
        if conn.login:
            out["client.access-key-id"] = conn.login
        if conn.password:
            out["client.secret-access-key"] = conn.password
    elif conn.host:
        out["type"] = "rest"
        out["uri"] = _url(conn)
        if conn.login and conn.password:
            out["credential"] = f"{conn.login}:{conn.password}"
        elif conn.password:
            out["token"] = conn.password
    out.update({str(k): str(v) for k, v in (conn.extra_dejson or {}).items()})
    return out
