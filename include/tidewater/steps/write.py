"""The write step of a batch: the plan's ranges read and written as staged files by Spark, through spark-submit
(a job per batch) or a Spark Connect server (warm), never committed; the manifest is staged next to the plan.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tidewater.batch import (
    ERROR_NAME,
    BatchManifest,
    BatchPlan,
    manifest_path,
    read_json,
)
from tidewater.config.spec import PipelineSpec, spark_app_path
from tidewater.errors import ConfigError, TerminalError, TransientError
from tidewater.source.kafka import kafka_settings
from tidewater.steps.spark import (
    launcher_env,
    local_master,
    properties_file,
    remove_properties_file,
    spark_defaults_file,
    spark_submit_command,
    write_submit_settings,
)
from tidewater.write.job import deployment_fault, missing_module, read_error, run_arrow, stage_manifest

log = logging.getLogger(__name__)


def load_plan(plan_path: Any, spec: PipelineSpec | None = None) -> BatchPlan:
    """The staged plan at ``plan_path`` (text, as XCom and command lines carry it, is resolved in ``spec``'s
    staging area: object storage needs its settings)."""
    return BatchPlan.from_json(read_json(spec.stage(plan_path) if spec is not None else plan_path))


def load_manifest(plan_path: Any, spec: PipelineSpec | None = None) -> BatchManifest:
    """The write step's manifest; raises the write step's own error if it failed."""
    plan_path = spec.stage(plan_path) if spec is not None else plan_path
    mpath = manifest_path(plan_path)
    if not mpath.is_file():
        err = read_error(mpath.parent)
        if err is not None:
            raise err
        raise TerminalError(f"no manifest at {mpath}: the write step has not completed")
    return BatchManifest.from_json(read_json(mpath))


class WriteJob:
    """One spark-submit of the write job for a staged plan.

    Its output goes to ``spark-submit.log`` next to the plan. On object storage (no appending there) it is
    written to a private temporary file while the job runs and uploaded when it has exited (the file is
    then removed): error messages name the staged copy."""

    def __init__(self, spec: PipelineSpec, plan_path: Any, master: str | None = None,
                 timings: dict[str, float] | None = None) -> None:
        self.timings = {} if timings is None else timings
        (plan_path.parent / ERROR_NAME).unlink(missing_ok=True)
        manifest_path(plan_path).unlink(missing_ok=True)
        secret = write_submit_settings(spec, master)["secret_conf"]
        env = _spark_env(master or spec.spark.master)
        self.secrets_file = properties_file(secret, spark_defaults_file(env)) if secret else None
        cmd = spark_submit_command(spec, str(spark_app_path()), write_job_args(spec, plan_path), master=master,
                                   secrets_file=self.secrets_file)
        self.log_path, self.staged_log = _job_log(plan_path)
        self.started = time.monotonic()
        self.timings["submitted"] = time.time()
        try:
            with open(self.log_path, "w") as logf:
                self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        except BaseException:
            remove_properties_file(self.secrets_file)
            raise

    def wait(self, plan_path: Any, progress: Any = None, background: list[Any] | None = None) -> BatchManifest:
        """The job's manifest once it exists (``background``: without waiting for the JVM to exit)."""
        mpath = manifest_path(plan_path)
        poll = 0.1 if isinstance(mpath, Path) else 0.5  # a HEAD request per look on object storage
        try:
            while self.proc.poll() is None:
                if background is not None and mpath.is_file():
                    break
                time.sleep(poll)
                if progress is not None:
                    progress(time.monotonic() - self.started)
            self.timings["returned"] = time.time()
        finally:
            remove_properties_file(self.secrets_file)  # read by spark-submit when it started
        if self.proc.returncode is None:  # the manifest is there and Spark is stopping: reaped by the caller
            proc, logs = self.proc, (self.log_path, self.staged_log)
            background.append(lambda: _reap(proc, *logs))  # type: ignore[union-attr]
            return load_manifest(plan_path)
        shown = _publish_log(self.log_path, self.staged_log)
        if self.proc.returncode != 0:
            self._raise_failure(plan_path, shown)
        return load_manifest(plan_path)

    def _raise_failure(self, plan_path: Any, shown: Any) -> None:
        err = read_error(plan_path.parent)
        if err is not None:
            raise err
        text = shown.read_text()
        fault = deployment_fault(text)
        if fault is not None:  # retrying cannot help
            raise ConfigError(f"{fault.message}. Log {shown}")
        raise TransientError(f"spark-submit exited with {self.proc.returncode}; log {shown}:\n{text[-3000:]}")


def write_job_args(spec: PipelineSpec, plan_path: Any) -> list[str]:
    """The write job's arguments: the pipeline file (its settings reach the staging area) and the plan."""
    return ["--pipeline", str(spec.source_path), "--plan", str(plan_path)]


def _job_log(plan_path: Any) -> tuple[Path, Any]:
    """Where spark-submit's output goes while it runs, and where it is staged afterwards (None: in place)."""
    staged = plan_path.parent / "spark-submit.log"
    if isinstance(staged, Path):
        return staged, None
    fd, tmp = tempfile.mkstemp(prefix="tidewater-spark-submit-", suffix=".log")
    os.close(fd)
    return Path(tmp), staged


def _publish_log(local: Path, staged: Any) -> Any:
    """Stage a finished job's log on object storage (the local copy removed); returns where it now is."""
    if staged is None:
        return local
    try:
        staged.write_bytes(local.read_bytes())
    except TransientError as e:  # the batch does not depend on its log: keep the local copy and say where
        log.warning("spark-submit's log stays at %s: %s", local, e)
        return local
    local.unlink(missing_ok=True)
    return staged


def run_write_step(spec: PipelineSpec, plan_path: Path, master: str | None = None, progress: Any = None,
                   timings: dict[str, float] | None = None, background: list[Any] | None = None) -> BatchManifest:
    """Run the Spark job with spark-submit (as the DAG does) and return its manifest. ``timings`` receives
    when spark-submit started and when the step returned (epoch seconds, for :func:`write_breakdown`).

    With ``background`` (a list), the step returns as soon as the job's manifest exists (written atomically
    after the last task: the batch's files are complete) and Spark stops while the caller validates and
    commits; a function that waits for spark-submit to exit is appended to the list, to call at the end.
    """
    if spec.spark.connect_url:
        return run_connect_write(spec, plan_path, timings)
    return WriteJob(spec, plan_path, master, timings).wait(plan_path, progress, background)


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
        return ConfigError(f"spark.connect_url: the Spark Connect server's Python workers cannot import {missing!r}: "
                           "start the server with an interpreter that has the project's packages (PYSPARK_PYTHON; "
                           "`make spark-connect` does)")
    # gRPC gone (UNAVAILABLE, refused, reset), the session lost with a restart (INVALID_HANDLE), or a server that
    # is shutting down and still answers (its SparkContext stopped first)
    if any(t in text for t in ("UNAVAILABLE", "Connection refused", "failed to connect", "Socket closed",
                               "INVALID_HANDLE", "Deadline Exceeded", "connection reset", "stopped SparkContext",
                               "SparkContext was shut down")):
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)[:300]
        host, port = _connect_endpoint(url)  # never the whole URL: it may carry a token
        return TransientError(f"spark.connect_url: the Spark Connect server {host}:{port} went away or is restarting "
                              f"({first})")
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


def run_connect_write(spec: PipelineSpec, plan_path: Path, timings: dict[str, float] | None = None,
                      url: str | None = None, tries: Any = None) -> BatchManifest:
    """The write step on a Spark Connect server (``url``, default ``spark.connect_url``), from this process:
    the same plan, tasks, manifest and error document as the spark-submit job. Its operations carry a tag of this
    try, kept in ``tries`` (the task's state store) before they start, so that a later try interrupts them first
    (``interrupt_previous_try``): sessions are shared by every batch on the server, so only the tag names this
    try's work."""
    timings = {} if timings is None else timings
    url = url or str(spec.spark.connect_url)
    (plan_path.parent / ERROR_NAME).unlink(missing_ok=True)
    manifest_path(plan_path).unlink(missing_ok=True)
    plan = load_plan(plan_path)
    timings["submitted"] = time.time()
    spark = connect_session(url)
    timings.update(driver_started=timings["submitted"], imports_done=time.time(), session_ready=time.time())
    interrupt_previous_try(spark, tries)
    tag = f"tidewater-{spec.name}-{plan.batch_id}-{uuid.uuid4().hex[:8]}"
    if tries is not None:
        tries.set(CONNECT_TAG_KEY, tag)
    spark.addTag(tag)
    try:
        manifest = stage_manifest(plan_path.parent, lambda: run_arrow(spark, plan, spec, kafka_settings(spec), timings))
    except Exception as e:
        mapped = connect_failure(e, url)
        if mapped is not None and mapped.transient:
            forget_connect_session(url)
        if mapped is None:
            raise
        raise mapped from None
    finally:
        with contextlib.suppress(Exception):  # the session is shared: later batches must not carry this try's tag
            spark.removeTag(tag)
    timings["returned"] = time.time()
    return manifest


def _reap(proc: subprocess.Popen, log_path: Path, staged_log: Any = None) -> None:
    code = proc.wait()
    shown = _publish_log(log_path, staged_log)
    if code != 0:  # after a complete manifest: the batch is unaffected, but say so
        log.warning("spark-submit exited with %d after writing the batch's manifest; log %s", code, shown)


def write_breakdown(manifest: BatchManifest, submitted: float, returned: float) -> dict[str, float]:
    """Where the write step's wall time went, in seconds, in order (from the driver's milestones and the
    tasks' timings; the figures add up to returned - submitted)."""
    d, tasks = manifest.driver_timings, manifest.task_timings
    if not d or "manifest_built" not in d:
        return {"spark-submit": round(returned - submitted, 3)}
    marks = [("spark-submit and JVM start, until the Python driver runs", submitted, d["driver_started"]),
             ("driver imports", d["driver_started"], d["imports_done"]),
             ("SparkContext start", d["imports_done"], d["session_ready"])]
    ready = d["session_ready"]
    if tasks:
        first, last = min(t["started_at"] for t in tasks), max(t["finished_at"] for t in tasks)
        setup = min(tasks, key=lambda t: t["started_at"]).get("setup_seconds", 0.0)
        marks += [("task scheduling and Python worker start", ready, first),
                  ("first task's set-up (catalog, table, clients)", first, first + setup),
                  ("data path after set-up (read, decode, write)", first + setup, last),
                  ("task results to the driver", last, d["job_done"])]
    else:
        marks.append(("no tasks", ready, d["job_done"]))
    marks += [("manifest (driver)", d["job_done"], d["manifest_built"]),
              ("manifest written until the step returned (Spark stop and JVM exit, unless in the background)",
               d["manifest_built"], returned)]
    return {name: round(b - a, 3) for name, a, b in marks}


def _spark_env(master: str) -> dict[str, str]:
    """spark-submit's environment: this interpreter for the driver, and for the executors on a local master
    only (on a cluster, its own choice applies: see ``runtime.spark.python_conf``)."""
    env = {**os.environ, **launcher_env()}
    if local_master(master):
        env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env
