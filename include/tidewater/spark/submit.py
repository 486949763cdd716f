"""The spark-submit launcher of the write job: one process per staged plan, its environment, its log (staged beside
the plan, uploaded after the job on object storage) and its failure, told apart as a deployment fault (terminal) or
a failed run (transient).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tidewater.batch import ERROR_NAME, manifest_path
from tidewater.config.locations import spark_app_path
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, TransientError
from tidewater.spark.conf import (
    launcher_env,
    local_master,
    properties_file,
    remove_properties_file,
    spark_defaults_file,
    spark_submit_command,
    write_submit_settings,
)
from tidewater.write.job import deployment_fault, read_error

log = logging.getLogger(__name__)


class WriteJob:
    """One spark-submit of the write job for a staged plan.

    Its output goes to ``spark-submit.log`` next to the plan. On object storage (no appending there) it is
    written to a private temporary file while the job runs and uploaded when it has exited (the file is
    then removed): error messages name the staged copy."""

    def __init__(self, spec: PipelineSpec, plan_path: Any, master: str | None = None, timings: dict[str, float] | None = None) -> None:
        self.timings = {} if timings is None else timings
        (plan_path.parent / ERROR_NAME).unlink(missing_ok=True)
        manifest_path(plan_path).unlink(missing_ok=True)
        secret = write_submit_settings(spec, master)["secret_conf"]
        env = _spark_env(master or spec.spark.master)
        self.secrets_file = properties_file(secret, spark_defaults_file(env)) if secret else None
        cmd = spark_submit_command(
            spec, str(spark_app_path()), write_job_args(spec, plan_path), master=master, secrets_file=self.secrets_file
        )
        self.log_path, self.staged_log = _job_log(plan_path)
        self.started = time.monotonic()
        self.timings["submitted"] = time.time()
        try:
            with open(self.log_path, "w") as logf:
                self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        except BaseException:
            remove_properties_file(self.secrets_file)
            raise

    def wait(self, plan_path: Any, progress: Any = None, background: list[Any] | None = None) -> None:
        """Until the job exited, or (``background``) until its manifest exists, without waiting for the JVM to exit:
        its reaping is appended to ``background``. Raises the job's own error, or why spark-submit failed."""
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
            background.append(lambda: _reap(proc, *logs))  # type: ignore[union-attr]  # set: the loop left early for it
            return
        shown = _publish_log(self.log_path, self.staged_log)
        if self.proc.returncode != 0:
            self._raise_failure(plan_path, shown)

    def _raise_failure(self, plan_path: Any, shown: Any) -> None:
        err = read_error(plan_path.parent)
        if err is not None:
            raise err
        text = shown.read_text()
        fault = deployment_fault(text)
        if fault is not None:  # retrying cannot help
            raise ConfigError(f"{fault.message}. Log {shown}")
        raise TransientError(f"spark-submit exited with {self.proc.returncode}; log {shown}:\n{text[-3000:]}")


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


def _reap(proc: subprocess.Popen, log_path: Path, staged_log: Any = None) -> None:
    code = proc.wait()
    shown = _publish_log(log_path, staged_log)
    if code != 0:  # after a complete manifest: the batch is unaffected, but say so
        log.warning("spark-submit exited with %d after writing the batch's manifest; log %s", code, shown)


def _spark_env(master: str) -> dict[str, str]:
    """spark-submit's environment: this interpreter for the driver, and for the executors on a local master
    only (on a cluster, its own choice applies: see ``runtime.spark.python_conf``)."""
    env = {**os.environ, **launcher_env()}
    if local_master(master):
        env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


def write_job_args(spec: PipelineSpec, plan_path: Any) -> list[str]:
    """The write job's arguments: the pipeline file (its settings reach the staging area) and the plan."""
    return ["--pipeline", str(spec.source_path), "--plan", str(plan_path)]
