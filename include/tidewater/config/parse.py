"""Reading pipeline files: YAML, ``${ENV}`` interpolation, coercion into the spec classes, discovery."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tidewater.config.locations import PIPELINES_DIR_ENV, pipelines_dir
from tidewater.config.sections.airflow import INVALID_DAG_KIND
from tidewater.config.spec import PipelineSpec
from tidewater.config.validate import validate
from tidewater.errors import ConfigError, config_problems, problems_of

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


# ---- parsing -------------------------------------------------------------------------------------


def _interpolate(value: Any, path: str) -> Any:
    if isinstance(value, str):

        def repl(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            env = os.environ.get(name)
            if env is not None:
                return env
            if default is not None:
                return default
            raise ConfigError(f"{path}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")

        return _ENV_REF.sub(repl, value)
    if isinstance(value, list):
        return [_interpolate(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _to_bool(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{path}: expected true or false, got {value!r}")


def _to_int(value: Any, path: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: expected an integer, got {value!r}") from None


def _to_float(value: Any, path: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: expected a number, got {value!r}") from None


def _to_str(value: Any, path: str) -> str:
    if isinstance(value, (dict, list)) or value is None:
        raise ConfigError(f"{path}: expected a string, got {type(value).__name__}")
    return str(value)


_SCALARS: dict[Any, Callable[[Any, str], Any]] = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if origin is typing.Literal:  # a mode: one of its choices, as text
        if not isinstance(value, str) or value not in args:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(args)}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        return {str(k): _scalar_to_str(v, f"{path}.{k}") for k, v in value.items()}
    scalar = _SCALARS.get(tp)
    if scalar is not None:
        return scalar(value, path)
    raise ConfigError(f"{path}: unsupported type {_type_name(tp)}")


def _scalar_to_str(value: Any, path: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigError(f"{path}: expected a string, number or boolean, got {type(value).__name__}")


def build(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'pipeline'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    problems: list[str] = []  # every problem of the file at once, not the first
    for key in (k for k in data if k not in fields):
        near = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else f" (known keys: {', '.join(fields)})"
        problems.append(f"{path + '.' if path else ''}{key}: unknown key{hint}")
    kwargs = {}
    for name, value in data.items():
        if name in fields:
            try:
                kwargs[name] = _coerce(hints[name], value, f"{path}.{name}" if path else name)
            except ConfigError as e:
                problems.extend(problems_of(e))
    if problems:
        raise config_problems(problems)
    return cls(**kwargs)


def _merge_table_defaults(data: Any) -> Any:
    """`tables:` entries take their defaults from `table:` (entry keys win)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("tables"), list):
        return data
    defaults = data.get("table") or {}
    if isinstance(defaults, str):
        return data
    defaults = {k: v for k, v in dict(defaults).items() if k != "identifier"}
    entries = [{**defaults, **e} if isinstance(e, Mapping) else e for e in data["tables"]]
    return {**data, "tables": entries}


def parse_pipeline(data: Any, source_path: str | None = None) -> PipelineSpec:
    """Parse and validate a pipeline specification from already-loaded YAML data."""
    data = _interpolate(data, "")
    if isinstance(data, Mapping) and isinstance(data.get("table"), str):
        data = {**data, "table": {"identifier": data["table"]}}
    spec: PipelineSpec = build(PipelineSpec, _merge_table_defaults(data), "")
    spec = dataclasses.replace(spec, source_path=source_path)
    validate(spec)
    return spec


def load_pipeline(path: str | os.PathLike[str]) -> PipelineSpec:
    """Load one pipeline file. Errors name the file and the key at fault."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read pipeline file: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    try:
        return parse_pipeline(data, source_path=str(p.resolve()))
    except ConfigError as e:
        found = problems_of(e)
        err = ConfigError(f"{p}: {config_problems(found).message}")
        err.problems = tuple(found) if len(found) > 1 else ()
        raise err from None


def invalid_dag_id(path: Path) -> str:
    """The DAG id under which a pipeline file that does not load shows in Airflow (a failing DAG naming its error)."""
    return f"{INVALID_DAG_KIND}_{path.stem.replace('.', '_').replace('-', '_')}"


def discover_pipelines(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Pipeline files (``*.yaml``/``*.yml``) in the pipelines directory, sorted."""
    d = Path(directory) if directory else pipelines_dir()
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def find_pipeline(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """The file of the pipeline called ``name`` in the pipelines directory: ``<name>.yaml`` (or ``.yml``) when its
    pipeline has that name (how ``tidewater init`` and the examples name files), else the one file whose ``name:`` it
    is. A file that is not YAML is skipped here (``tidewater validate`` reports it). No file, or two, is a
    ConfigError naming the directory and the pipelines it holds."""
    d = Path(directory) if directory else pipelines_dir()
    for path in (d / f"{name}.yaml", d / f"{name}.yml"):
        if path.is_file() and _name_in(path) == name:
            return path
    found = {p: _name_in(p) for p in discover_pipelines(d)}
    matches = [p for p, n in found.items() if n == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(
            f"pipeline {name!r}: {len(matches)} files in {d} name it ({', '.join(p.name for p in matches)}); pass one with --pipeline FILE"
        )
    known = sorted(n for n in found.values() if n)
    hint = difflib.get_close_matches(name, known, n=1)
    raise ConfigError(
        f"no pipeline named {name!r} in {d} (set {PIPELINES_DIR_ENV} or pass --pipeline FILE)"
        + (f"; did you mean {hint[0]!r}?" if hint else f"; pipelines there: {', '.join(known) or 'none'}")
    )


def _name_in(path: Path) -> str | None:
    """The ``name:`` a pipeline file declares, read without validating the rest (None if it has none or is not YAML)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return doc.get("name") if isinstance(doc, dict) and isinstance(doc.get("name"), str) else None
