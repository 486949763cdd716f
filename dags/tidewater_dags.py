"""Tidewater's Airflow DAGs for every pipeline file in $TIDEWATER_PIPELINES_DIR (see tidewater.runtime.airflow_dags)."""

from tidewater.runtime.airflow_dags import pipeline_dags

globals().update(pipeline_dags())
