"""Per-step task settings (``airflow.steps.<plan|write|validate|commit>``): the queue and pool of a batch's step and,
on the KubernetesExecutor, its pod (``executor_config={"pod_override": V1Pod}``, which Airflow merges into its pod
template), so that only the write step's pod needs Java and Spark, or more memory.

The Kubernetes client's models are imported only for a pipeline that sets a pod field: parsing the DAG folder
otherwise loads no Kubernetes code (tests/dags/test_dagbag.py, HEAVY).
"""

from __future__ import annotations

from typing import Any

from tidewater.config.sections.airflow import StepSpec
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError


def step_args(spec: PipelineSpec, step: str) -> dict[str, Any]:
    """The task arguments of ``step`` (a field of ``config.sections.airflow.StepsSpec``): queue, pool and executor_config, only
    those the step sets (the pipeline-wide ``airflow.queue`` and ``airflow.pool`` are its DAGs' default_args)."""
    settings: StepSpec = getattr(spec.airflow.steps, step)
    args: dict[str, Any] = {k: v for k, v in (("queue", settings.queue), ("pool", settings.pool)) if v}
    if settings.pod_settings():
        args["executor_config"] = {"pod_override": pod_override(settings, f"airflow.steps.{step}")}
    return args


def pod_override(settings: StepSpec, key: str) -> Any:
    """The pod fragment of ``settings``: the container Airflow runs the task in is named ``base``, and only what is set
    is filled in (the rest comes from the executor's pod template)."""
    try:
        from kubernetes.client import models as k8s
    except ImportError:
        raise ConfigError(
            f"{key}: pod settings need the Kubernetes client (install the cncf.kubernetes provider, "
            "which the KubernetesExecutor needs anyway)"
        ) from None
    resources = (
        k8s.V1ResourceRequirements(requests=settings.requests or None, limits=settings.limits or None)
        if settings.requests or settings.limits
        else None
    )
    env_from = [k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=name)) for name in settings.env_from_secrets]
    container = k8s.V1Container(name="base", image=settings.image, resources=resources, env_from=env_from or None)
    return k8s.V1Pod(
        spec=k8s.V1PodSpec(
            containers=[container], node_selector=settings.node_selector or None, service_account_name=settings.service_account
        )
    )
