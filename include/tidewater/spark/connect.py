"""Spark Connect sessions, cached per server URL and shared by every batch this process writes there: created with
a retry policy, reopened after the server closed them, and closed at exit; a try's operations are tagged so a later
try interrupts them.
"""

from __future__ import annotations

import atexit
import logging
import socket
import uuid
import warnings
from typing import Any
from urllib.parse import urlparse

from tidewater.errors import ConfigError, TransientError
from tidewater.write.job import missing_module

log = logging.getLogger(__name__)


def _connect_endpoint(url: str) -> tuple[str, int]:
    parsed = urlparse(url.split(";", 1)[0])
    if parsed.scheme != "sc" or not parsed.hostname:
        raise ConfigError(f"spark.connect_url: {url!r} is not a Spark Connect URL (sc://host:port)")
    return parsed.hostname, parsed.port or 15002


# How long the Connect client keeps retrying a server that does not answer (gRPC UNAVAILABLE): 50 ms growing
# 4x per try to 5 s, 8 tries, about 25 s in all: enough for a server restart, then the write task fails with a
# transient error and Airflow's retry takes over. The client's default is at least ten minutes.
CONNECT_RETRY_POLICY = {"max_retries": 8, "backoff_multiplier": 4.0, "initial_backoff": 50, "max_backoff": 5000}


_CONNECT_SESSIONS: dict[str, Any] = {}  # url -> session: a process's later batches reuse the server's warm session


SESSION_GENERATIONS = 32  # session ids tried after the server closed the earlier ones (see shared_session)


def connect_session(url: str) -> Any:
    """A Spark Connect session on ``url`` with the bounded retry policy above, reused by this process's later
    batches on the same URL. An unreachable server is a transient error naming ``spark.connect_url`` within
    seconds (the client alone would retry for ten minutes).

    Not ``builder.remote(url).getOrCreate()``: it returns the process's first session whatever the URL, so a
    second server (or pipeline) would silently get the first one's."""
    host, port = _connect_endpoint(url)
    try:
        socket.create_connection((host, port), timeout=10).close()
    except OSError as e:
        raise TransientError(f"spark.connect_url: the Spark Connect server {host}:{port} is unreachable ({e})") from None
    spark = _CONNECT_SESSIONS.get(url)
    if spark is not None and not _still_open(spark):  # the server closed it while this process was idle
        forget_connect_session(url)
        spark = None
    if spark is None:
        spark = _CONNECT_SESSIONS[url] = shared_session(url)
    return spark


def _still_open(spark: Any) -> bool:
    """One cheap call: False when the server closed this session (idle past its timeout), which it then refuses."""
    try:
        spark.version  # noqa: B018 - the call is the check
        return True
    except Exception as e:
        if "SESSION_CLOSED" not in str(e):
            raise
        return False


def _remote(url: str) -> Any:
    """A new session through pyspark's Connect session class itself. Not ``pyspark.sql.SparkSession.builder
    .remote(url)``: that path marks the whole process as a Connect client in ``os.environ``
    (SPARK_CONNECT_MODE_ENABLED), which every spark-submit started from it later inherits and then refuses to
    create a SparkContext (a process may write one pipeline through Connect and another through spark-submit)."""
    from pyspark.sql.connect.session import SparkSession

    with warnings.catch_warnings():  # a refused session id: the builder warns, the caller's check says why
        warnings.filterwarnings("ignore", message=r".*INVALID_HANDLE\.SESSION_CLOSED", category=UserWarning)
        spark = SparkSession.builder.remote(url).create()
    # pyspark 3.5's builder takes no retry policy; its client keeps the policy in this dict (read per call)
    spark.client._retry_policy.update(CONNECT_RETRY_POLICY)
    if not _CREATED:
        atexit.register(_close_all)
    _CREATED.append(spark)
    return spark


_CREATED: list[Any] = []  # every session this process opened: closed at exit (see _close_client)


def _close_all() -> None:
    while _CREATED:
        _close_client(_CREATED.pop())


def shared_session(url: str) -> Any:
    """A session whose id every process derives from the URL, so that batches (each its own process: an
    Airflow task, ``tidewater run``) share the server's warm Python workers, which a server keeps per session:
    a batch in a new session pays the workers' start and imports again (measured: 1.5 s against 0.17 s for a
    two-task job). The server closes a session idle longer than its
    ``spark.connect.session.manager.defaultSessionTimeout`` and refuses its id from then on: the next
    generation's id is taken, the same walk in every process. A URL that names its own ``session_id`` is
    used as it is."""
    if "session_id=" in url:
        return _remote(url)
    base = url.split(";", 1)[0].rstrip("/")
    params = url.split(";", 1)[1] + ";" if ";" in url else ""
    for generation in range(SESSION_GENERATIONS):
        sid = uuid.uuid5(uuid.NAMESPACE_URL, f"tidewater:{base}#{generation}")
        spark = _remote(f"{base}/;{params}session_id={sid}")
        if _still_open(spark):
            return spark
        _close_client(spark)
        log.info("Spark Connect session %s was closed by the server; taking the next one", sid)
    return _remote(url)  # every generation closed: a session of this process's own


def forget_connect_session(url: str) -> None:
    """Drop the cached session after a failure: the server may have restarted and lost it."""
    spark = _CONNECT_SESSIONS.pop(url, None)
    if spark is not None:
        _close_client(spark)


def _close_client(spark: Any) -> None:
    """Close a session's channel while the process still runs (at once for a refused or failed session, at
    exit for the others), and only once. pyspark's session closes its channel in ``__del__``, which for a
    session still alive at exit runs during interpreter shutdown: gRPC's polling threads are frozen by then,
    and closing a channel whose lock one of them held waited forever (seen: a task process that had finished
    its batch never exited). So the client's ``close`` becomes a no-op once it has run."""
    client = spark.client
    if getattr(client, "is_closed", False):
        return
    try:
        client.close()
    except Exception:  # the channel of a server that went away: nothing left to close
        log.debug("closing a Spark Connect session's channel", exc_info=True)
    client.close = lambda: None  # pyspark's __del__ calls it again at shutdown


def connect_failure(e: BaseException, url: str) -> Any:
    """A failure of the Connect server itself as a TidewaterError naming ``spark.connect_url``, else None:
    a server gone or restarting is transient; workers without the project's packages are terminal."""
    module = type(e).__module__ or ""
    if not (module.startswith("pyspark") or module.startswith("grpc")):
        return None
    text = str(e)
    missing = missing_module(text)
    if missing:
        return ConfigError(
            f"spark.connect_url: the Spark Connect server's Python workers cannot import {missing!r}: "
            "start the server with an interpreter that has the project's packages (PYSPARK_PYTHON; "
            "`make spark-connect` does)"
        )
    # gRPC gone (UNAVAILABLE, refused, reset), the session lost with a restart (INVALID_HANDLE), or a server that
    # is shutting down and still answers (its SparkContext stopped first)
    if any(
        t in text
        for t in (
            "UNAVAILABLE",
            "Connection refused",
            "failed to connect",
            "Socket closed",
            "INVALID_HANDLE",
            "Deadline Exceeded",
            "connection reset",
            "stopped SparkContext",
            "SparkContext was shut down",
        )
    ):
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)[:300]
        host, port = _connect_endpoint(url)  # never the whole URL: it may carry a token
        return TransientError(f"spark.connect_url: the Spark Connect server {host}:{port} went away or is restarting ({first})")
    return None


CONNECT_TAG_KEY = "connect_operation_tag"  # in a task's state store: the tag of the try's Connect operations


def interrupt_previous_try(spark: Any, tries: Any) -> list[str]:
    """Interrupt the Connect operations a previous try of this task left running (``tries``: the task's state store,
    Airflow's ``task_state_store``; None where there is none). A worker that died mid-write leaves its operation
    running on the server, where it holds executors and keeps writing files nothing will commit; the retry stops it
    before it submits its own. Returns the interrupted operations' ids."""
    old = tries.get(CONNECT_TAG_KEY) if tries is not None else None
    if not old:
        return []
    try:
        ids = list(spark.interruptTag(str(old)))
    except Exception as e:  # noqa: BLE001 - best effort: the old operation may be gone with its server
        log.warning("could not interrupt the previous try's Spark Connect operations (tag %s): %s", old, e)
        return []
    if ids:
        log.warning("interrupted %d Spark Connect operation(s) of the previous try (tag %s): %s", len(ids), old, ids)
    return ids
