"""The sections of a pipeline file, one module each (``source``: ``kafka``, ``format``, ``dead_letter``; ``table``:
``table``, ``routing``; ``run``: ``catalog``, ``batch``, ``validation``, ``spark``; ``airflow``: ``airflow``, ``trigger``,
``audit``; ``maintenance``). ``config/spec.py`` assembles them into a ``PipelineSpec``; ``config/locations.py`` says
where files live."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def doc(text: str, **kw: Any) -> Any:
    """A setting: its reference text (``doc``: the configuration reference and the JSON Schema show it) and its
    default (``default=`` or ``default_factory=``)."""
    return field(metadata={"doc": text}, **kw)
