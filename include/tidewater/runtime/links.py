"""Addresses of Tidewater's pages as Airflow serves them, for logs and for a decision's body."""

from __future__ import annotations

from tidewater.config.spec import PipelineSpec


def data_docs_url(spec: PipelineSpec, batch_id: str) -> str:
    """The batch's Data Docs page as the Tidewater view serves it (reachable from any browser that reaches
    Airflow, unlike a worker's file path)."""
    from airflow.sdk.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    base = base or f"http://localhost:{conf.get('api', 'port', fallback='8080')}"  # [api] base_url unset
    return f"{base}/tidewater/data-docs/{spec.name}/{batch_id}.html"
