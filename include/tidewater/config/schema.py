"""The JSON Schema of a pipeline file (docs/pipeline.schema.json), for editors: completion, hover docs and
unknown keys flagged as you type (a YAML language server reads it from a first line such as
``# yaml-language-server: $schema=../docs/pipeline.schema.json``).

pydantic derives the structure and types from the spec dataclasses; every field then gets its reference
text (the same ``doc`` the configuration reference shows), internal fields are left out, and unknown keys
are refused as the parser refuses them. It never rejects a file the parser takes: the parser also reads
scalars written as text (``"10"``, ``"true"``, ``${NAME}`` references), so numbers and booleans accept
strings, and strings accept numbers and booleans.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from tidewater.config.spec import PipelineSpec

_SCALAR_TYPES = ("integer", "number", "boolean", "string")


def pipeline_schema() -> dict[str, Any]:
    """The schema document (JSON Schema draft 2020-12)."""
    import pydantic

    schema = pydantic.TypeAdapter(PipelineSpec).json_schema()
    defs = schema.get("$defs", {})
    for cls in _spec_classes():
        target = schema if cls is PipelineSpec else defs.get(cls.__name__)
        if target is not None:
            _describe(cls, target)
    table = schema["properties"]["table"]
    schema["properties"]["table"] = {
        "description": table.pop("description", ""),
        "anyOf": [{"type": "string", "description": "shorthand for table.identifier"}, table],
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Tidewater pipeline",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def _spec_classes() -> list[type]:
    """Every dataclass of the pipeline file: ``PipelineSpec`` and its sections' (``config/sections``), nested
    ones included."""
    out: list[type] = []
    todo: list[type] = [PipelineSpec]
    while todo:
        cls = todo.pop()
        if cls in out:
            continue
        out.append(cls)
        for tp in typing.get_type_hints(cls).values():
            todo += [t for t in (tp, *typing.get_args(tp)) if isinstance(t, type) and dataclasses.is_dataclass(t)]
    return out


def _describe(cls: type, target: dict[str, Any]) -> None:
    hints = typing.get_type_hints(cls)
    target.pop("title", None)
    target["additionalProperties"] = False
    props = target.get("properties", {})
    for f in dataclasses.fields(cls):
        if f.name not in props:
            continue
        if f.metadata.get("internal"):
            del props[f.name]
            target["required"] = [r for r in target.get("required", []) if r != f.name]
            continue
        prop = props[f.name]
        prop.pop("title", None)
        if f.metadata.get("doc"):
            prop["description"] = f.metadata["doc"]
        if not dataclasses.is_dataclass(hints[f.name]):
            _lenient(prop)
    if not target.get("required"):
        target.pop("required", None)


def _lenient(prop: dict[str, Any]) -> None:
    """Scalars as the parser reads them: any scalar type where one is expected (see the module's docstring)."""
    for key in ("items", "additionalProperties"):
        if isinstance(prop.get(key), dict):
            _lenient(prop[key])
    for alt in prop.get("anyOf", []):
        _lenient(alt)
    if prop.get("type") in _SCALAR_TYPES:
        prop["type"] = list(_SCALAR_TYPES)
