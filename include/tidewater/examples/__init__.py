"""The example pipeline that ships with the package: Scenario 1's pizza orders (``pizzas.yaml``) and its
expectation suite (``pizzas.expectations.json``). The repository's demo reads them through ``include/pipelines/``
(links to these files); ``tidewater init`` copies them into a deployment's pipelines folder."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tidewater.errors import ConfigError

EXAMPLE = "pizzas"
_SCHEMA_LINE = "# yaml-language-server: $schema="


def example_files() -> dict[str, str]:
    """The example's files by name: the pipeline file and its expectation suite."""
    here = resources.files(__name__)
    return {name: (here / name).read_text() for name in (f"{EXAMPLE}.yaml", f"{EXAMPLE}.expectations.json")}


def write_example(folder: Path, *, schema: dict | None = None) -> list[Path]:
    """Copy the example into ``folder`` (created if missing). Refuses, naming the file, when one is there already:
    an operator's pipeline is never overwritten. With ``schema``, the pipeline file's JSON Schema is written beside
    it and the pipeline file points editors at it."""
    files = example_files()
    if schema is not None:
        files["pipeline.schema.json"] = json.dumps(schema, indent=2) + "\n"
    pipeline = files[f"{EXAMPLE}.yaml"]
    head, _, rest = pipeline.partition("\n")
    if head.startswith(_SCHEMA_LINE):  # the repository's line points at its docs/ folder
        pipeline = (f"{_SCHEMA_LINE}pipeline.schema.json\n" if schema is not None else "") + rest
    files[f"{EXAMPLE}.yaml"] = pipeline
    taken = [folder / name for name in files if (folder / name).exists()]
    if taken:
        raise ConfigError(f"init: {taken[0]} exists already; choose an empty folder with --dir (nothing was written)")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        (folder / name).write_text(text)
        written.append(folder / name)
    return written
