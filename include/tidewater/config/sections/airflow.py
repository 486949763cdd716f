"""The Airflow side of a pipeline file: ``airflow`` (the DAGs, their schedule, retries and steps), ``trigger``
(batches started by pending data) and ``audit``."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from tidewater.config.sections import doc
from tidewater.errors import ConfigError

if TYPE_CHECKING:
    pass


MAX_RETRY_DELAY = timedelta(hours=1)
"""The longest wait between two tries of a transient failure, however many retries a pipeline allows."""


def doubled_delay(base: timedelta, try_number: int) -> timedelta:
    """``base`` doubled at each try after the first, at most :data:`MAX_RETRY_DELAY` (or ``base``, if longer): the wait
    after try ``try_number`` (1-based) failed. Airflow 3.3's retry policy of the pipeline's tasks waits this long
    (runtime/retries.py), and the longest possible batch counts it."""
    return min(base * (2 ** max(try_number - 1, 0)), max(MAX_RETRY_DELAY, base))


# The DAGs a pipeline may go without (``airflow.dags``); every pipeline has its ingest DAG
OPTIONAL_DAGS = ("replay", "skip", "retry_dead_letters", "audit", "maintain")
# Every kind of DAG a pipeline file makes, the one list (``PipelineSpec.dag_ids``, the DAG builders, a task's parse):
# its ingest DAG, the optional ones, the quarantine DAG (under the quarantine policy), and for a file that does not
# load, ``ingest_invalid_<file stem>``
INVALID_DAG_KIND = "ingest_invalid"
DAG_KINDS = ("ingest", *OPTIONAL_DAGS, "quarantine", INVALID_DAG_KIND)


@dataclass(frozen=True)
class StepSpec:
    """Where one step of a batch runs: its executor queue and pool, and on the KubernetesExecutor its pod."""

    queue: str | None = doc(
        "The executor queue of this step's tasks (Celery: the workers that serve it). Unset: `airflow.queue`.", default=None
    )
    pool: str | None = doc("The Airflow pool of this step's tasks. Unset: `airflow.pool`.", default=None)
    image: str | None = doc(
        "KubernetesExecutor: the image of this step's pod (for example one with Java and Spark "
        "for `write` only). Unset: the executor's pod template.",
        default=None,
    )
    requests: dict[str, str] = doc(
        "KubernetesExecutor: resource requests of this step's pod (`cpu: '2'`, `memory: 4Gi`).", default_factory=dict
    )
    limits: dict[str, str] = doc("KubernetesExecutor: resource limits of this step's pod.", default_factory=dict)
    env_from_secrets: list[str] = doc(
        "KubernetesExecutor: Kubernetes secrets whose keys become this step's environment variables (`envFrom`; "
        "for example the `${ENV}` values of the pipeline file).",
        default_factory=list,
    )
    node_selector: dict[str, str] = doc("KubernetesExecutor: node labels this step's pod must run on.", default_factory=dict)
    service_account: str | None = doc("KubernetesExecutor: the service account of this step's pod.", default=None)

    def pod_settings(self) -> bool:
        """Whether this step overrides anything of the pod (any field but its queue and pool)."""
        return any(getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("queue", "pool"))


@dataclass(frozen=True)
class StepsSpec:
    """Per step of a batch (the ingest and replay DAGs' plan, write, validate and commit tasks; the Data Docs task
    follows validate): its queue, pool and Kubernetes pod, so that the write step's pod can differ from the light
    ones."""

    plan: StepSpec = doc("The plan task.", default_factory=StepSpec)
    write: StepSpec = doc("The write task (spark-submit or Spark Connect).", default_factory=StepSpec)
    validate: StepSpec = doc("The validate task and the Data Docs task.", default_factory=StepSpec)
    commit: StepSpec = doc("The commit task.", default_factory=StepSpec)


@dataclass(frozen=True)
class AirflowSpec:
    """DAG settings."""

    retries: int = doc(
        "Task retries. On Airflow 3.3 and later only errors worth retrying (an unreachable broker or catalog, a commit "
        "conflict) use them: an error retrying cannot help (a bad setting, a refused schema) fails the task at once, "
        "and other failures keep Airflow's default retries.",
        default=2,
    )
    retry_delay_seconds: int = doc(
        "Delay before the first retry. On Airflow 3.3 and later an error worth retrying waits this long, doubled at each "
        "further try, at most an hour.",
        default=60,
    )
    owner: str = doc("DAG owner shown in the UI.", default="tidewater")
    tags: list[str] = doc("Extra DAG tags (`tidewater` and `ingest` are always set).", default_factory=list)
    task_timeout_minutes: int = doc(
        "Execution timeout of each ingest task. With retries it bounds the longest possible batch, which "
        "`maintenance.remove_orphan_files.older_than_hours` may never undercut.",
        default=60,
    )
    freshness: str | None = doc(
        "A promise of freshness, as a deadline on each ingest run (Airflow 3.1+ deadline alerts, which Airflow marks "
        "experimental): a run still unfinished this long after it was queued (`90s`, `15m`, `2h`, `1d`) calls "
        "`airflow.on_late`, once per run. It catches a batch that is slow or stuck; a pipeline whose runs are not "
        "queued at all (paused, scheduler down) is caught by the lag trigger or the audit DAG instead (docs: From "
        "the Airflow UI). Unset: no deadline.",
        default=None,
    )
    dag_id_prefix: str = doc(
        "Put before every DAG id of the pipeline (`team_a_` gives `team_a_ingest_orders`, `team_a_replay_orders`, ...), "
        "for a shared Airflow where another team's DAG may have the name. Letters, digits, `_`, `-` and `.` only. A "
        "task's parse still builds only its own pipeline's DAGs when the file is named after the pipeline.",
        default="",
    )
    dags: list[str] = doc(
        "Which optional DAGs the pipeline gets beside its ingest DAG: any of `replay`, `skip`, `retry_dead_letters`, "
        "`audit`, `maintain` (default: all). The quarantine DAG comes with `validation.on_failure: quarantine`. The "
        "Tidewater view leaves out the links and buttons of DAGs a pipeline does not have.",
        default_factory=lambda: list(OPTIONAL_DAGS),
    )
    pool: str | None = doc(
        "The Airflow pool every task of the pipeline's DAGs runs in (create it in Airflow: Admin > Pools), to bound how "
        "many Tidewater tasks a shared Airflow runs at once. Unset: Airflow's `default_pool`.",
        default=None,
    )
    queue: str | None = doc(
        "The executor queue of every task (the Celery executor's queues, for example workers that have Java and "
        "Spark). Unset: the executor's default queue.",
        default=None,
    )
    shared_paths: list[str] = doc(
        "Local folders that every host running the pipeline's tasks mounts at the same path (an NFS or CSI volume). "
        "Under an executor that runs tasks on several hosts (Celery, Kubernetes, Edge) a local warehouse, "
        "`batch.staging_dir` or `validation.data_docs_dir` is refused unless it lies under one of these; a SQLite "
        "catalog is refused even there. Unset: none (object storage only).",
        default_factory=list,
    )
    steps: StepsSpec = doc("Per step of a batch: queue, pool and Kubernetes pod (see `airflow.steps.*` below).", default_factory=StepsSpec)
    on_failure: str | None = doc(
        "What a failed task calls (Airflow's `on_failure_callback` on every task of the pipeline's DAGs): the dotted "
        "path of a callable, given Airflow's task context, or of an Airflow notifier class (made without arguments). "
        "It is imported when the DAG file is parsed, so the DAG processor and the workers must be able to import it; "
        "a path that does not import shows the pipeline as its failing `ingest_invalid_<file>` DAG naming this "
        "setting. Unset: none.",
        default=None,
    )
    on_late: str | None = doc(
        "What a missed `airflow.freshness` deadline calls: the dotted path of a callable, or of an Airflow notifier "
        "class (made without arguments), given one dict (`pipeline`, `freshness`, `message`, `dag_run`, "
        "`deadline`). It runs in Airflow's triggerer, which must be able to import it. Always, before it: a warning in "
        "the triggerer's log and the metric `tidewater.<name>.late`.",
        default=None,
    )

    def freshness_interval(self) -> timedelta | None:
        """``freshness`` as a duration (None when unset); a ConfigError naming the setting when it is not one."""
        if self.freshness is None:
            return None
        m = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", str(self.freshness))
        if not m or int(m.group(1)) == 0:
            raise ConfigError(f"airflow.freshness: {self.freshness!r} is not a duration such as 90s, 15m, 2h or 1d")
        return timedelta(seconds=int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)])

    def dag_kwargs(self, kind: str) -> dict[str, Any]:
        """Arguments every DAG of the pipeline shares (``kind``: ingest, replay, quarantine, maintenance)."""
        return {
            "start_date": datetime(2024, 1, 1, tzinfo=timezone.utc),
            "catchup": False,
            "max_active_runs": 1,
            "tags": sorted({"tidewater", kind, *self.tags}),
            "default_args": self.default_args(),
        }

    def retry_delay(self, try_number: int) -> timedelta:
        """The wait before the next try after try ``try_number`` (1-based) failed with an error worth retrying
        (:func:`doubled_delay` of ``retry_delay_seconds``)."""
        return doubled_delay(timedelta(seconds=self.retry_delay_seconds), try_number)

    def default_args(self) -> dict[str, Any]:
        """Airflow ``default_args`` shared by the pipeline's DAGs."""
        placement = {k: v for k, v in (("pool", self.pool), ("queue", self.queue)) if v}
        return {
            "owner": self.owner,
            "retries": self.retries,
            "retry_delay": timedelta(seconds=self.retry_delay_seconds),
            "execution_timeout": timedelta(minutes=self.task_timeout_minutes),
            **placement,
        }


@dataclass(frozen=True)
class TriggerSpec:
    """Batches started by the amount of pending data, besides the schedule (checked by Airflow's triggerer,
    without Spark). Any threshold set turns it on; a batch starts when one is exceeded."""

    pending_records: int | None = doc("Start a batch when more records than this wait in Kafka (all partitions).", default=None)
    pending_bytes: int | None = doc(
        "Start a batch when the pending records weigh more than this, estimated from the size of the first pending "
        "record of each partition.",
        default=None,
    )
    max_age_seconds: float | None = doc(
        "Start a batch when the oldest pending record (its Kafka timestamp) is older than this.", default=None
    )
    poll_seconds: float = doc("How often the triggerer checks (reads offsets and at most one record per partition).", default=30.0)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.pending_records, self.pending_bytes, self.max_age_seconds))


@dataclass(frozen=True)
class AuditSpec:
    """The `audit_<name>` DAG (`tidewater audit` by hand)."""

    schedule: str | None = doc("Airflow schedule of the audit DAG, which fails on a discrepancy. `null`: triggered only.", default="@daily")
    deep: bool = doc(
        "Also check every row's source offset (`tidewater audit --deep`; needs `format.metadata`): reads "
        "the table's offset columns and the dead letters.",
        default=False,
    )
    full: bool = doc(
        "Check every batch in the ledger on each run (`tidewater audit --full`). By default a run checks "
        "the batches committed since the last clean audit (a deep run: since the last clean deep audit), "
        "and Kafka, the dead letters and the writes outside Tidewater whole.",
        default=False,
    )
