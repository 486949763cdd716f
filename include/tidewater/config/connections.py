"""Settings held in Airflow connections, so that Airflow's secrets backends (Vault, AWS Secrets Manager, GCP Secret
Manager, ...) serve Tidewater's credentials as they serve every other operator's.

``kafka.conn_id`` (``source/kafka.py``), ``catalog.conn_id``, ``format.registry_conn_id`` and
``batch.staging_conn_id`` (here) name one. A
connection's secret values are registered with Airflow's log masker where Airflow runs, and never leave the process
but as the settings they become (the Spark job's private properties file and environment, as ``${ENV}`` values do).

A catalog connection becomes pyiceberg catalog properties by its type:

- ``postgres``, ``mysql``, ``sqlite``: ``type: sql``, and ``uri`` the SQLAlchemy URL of the host, port, login, password
  and database (the connection's schema); for ``sqlite`` the host is the database file.
- ``aws``: ``type: glue``, the login and password as ``client.access-key-id`` and ``client.secret-access-key``; the
  extra's Airflow keys as pyiceberg's: ``region_name`` as ``client.region``, ``aws_session_token`` as
  ``client.session-token``, ``endpoint_url`` as ``glue.endpoint`` and ``s3.endpoint`` (``service_config``'s ``glue``
  and ``s3`` ``endpoint_url`` for one service), and ``role_arn`` (with ``role_session_name``, ``external_id``)
  assumed through STS (``service_config``'s ``sts``, else ``endpoint_url``, else AWS's) when the catalog is opened:
  its temporary keys replace the connection's (pyiceberg's Glue client does not assume roles itself). Without login
  and password, boto3 finds the worker's own credentials (instance profile, IRSA, ``AWS_*``).
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
from tidewater.errors import ConfigError, TransientError

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


# an Airflow ``aws`` connection's extra keys, as pyiceberg Glue catalog properties (its endpoints: glue_properties_of)
_GLUE_EXTRA = {"region_name": "client.region", "aws_session_token": "client.session-token"}
# an Airflow ``aws`` connection's extra keys that are Airflow's, not pyiceberg properties
_AIRFLOW_AWS_KEYS = ("region_name", "aws_session_token", "endpoint_url", "service_config", "role_arn", "role_session_name", "external_id")


def glue_properties_of(conn: Any) -> dict[str, str]:
    """pyiceberg Glue catalog properties from an ``aws`` connection (see the module docstring)."""
    extra = dict(conn.extra_dejson or {})
    out = {"type": "glue"}
    if conn.login:
        out["client.access-key-id"] = conn.login
    if conn.password:
        out["client.secret-access-key"] = conn.password
    out.update({_GLUE_EXTRA[k]: str(v) for k, v in extra.items() if k in _GLUE_EXTRA and v})
    services = extra.get("service_config") or {}

    def endpoint(service: str) -> str | None:  # a service's own, else the one for every service
        return (services.get(service) or {}).get("endpoint_url") or extra.get("endpoint_url")

    out.update({key: str(endpoint(service)) for service, key in (("glue", "glue.endpoint"), ("s3", "s3.endpoint")) if endpoint(service)})
    out.update({str(k): str(v) for k, v in extra.items() if k not in _AIRFLOW_AWS_KEYS})
    if extra.get("role_arn"):
        out.update(
            assumed_role(
                conn.conn_id,
                out,
                endpoint("sts"),
                str(extra["role_arn"]),
                str(extra.get("role_session_name") or "tidewater"),
                extra.get("external_id"),
            )
        )
    return out


def assumed_role(
    conn_id: str, props: dict[str, str], endpoint: str | None, role_arn: str, session_name: str, external_id: str | None
) -> dict[str, str]:
    """Temporary keys of ``role_arn`` from STS, asked with the connection's own keys (or the worker's when it has
    none), as pyiceberg properties. STS refusing is a configuration error naming the role; STS unreachable is
    transient."""
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise ConfigError(
            f"catalog.conn_id: connection {conn_id!r} names role_arn, and assuming it needs boto3 "
            "(pip install 'pyiceberg[glue]', which a Glue catalog needs anyway)"
        ) from None
    session = boto3.Session(
        aws_access_key_id=props.get("client.access-key-id"),
        aws_secret_access_key=props.get("client.secret-access-key"),
        aws_session_token=props.get("client.session-token"),
        region_name=props.get("client.region"),
    )
    ask = {"RoleArn": role_arn, "RoleSessionName": session_name, **({"ExternalId": external_id} if external_id else {})}
    try:
        creds = session.client("sts", endpoint_url=endpoint).assume_role(**ask)["Credentials"]
    except ClientError as e:
        raise ConfigError(
            f"catalog.conn_id: connection {conn_id!r}: STS refused to assume role_arn {role_arn}: "
            f"{e.response.get('Error', {}).get('Message', e)}"
        ) from None
    except BotoCoreError as e:
        raise TransientError(f"catalog.conn_id: connection {conn_id!r}: STS unreachable while assuming {role_arn}: {e}") from None
    return {
        "client.access-key-id": creds["AccessKeyId"],
        "client.secret-access-key": creds["SecretAccessKey"],
        "client.session-token": creds["SessionToken"],
    }


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

            url = URL.create(
                _SQL_DRIVERS[kind],
                username=conn.login or None,
                password=conn.password or None,
                host=conn.host or None,
                port=conn.port or None,
                database=conn.schema or None,
            )
            out["uri"] = url.render_as_string(hide_password=False)
    elif kind == "aws":
        return glue_properties_of(conn)
    elif conn.host:
        out["type"] = "rest"
        out["uri"] = _url(conn)
        if conn.login and conn.password:
            out["credential"] = f"{conn.login}:{conn.password}"
        elif conn.password:
            out["token"] = conn.password
    out.update({str(k): str(v) for k, v in (conn.extra_dejson or {}).items()})
    return out
