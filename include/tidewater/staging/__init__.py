"""Where a batch's steps leave what the next step reads: the staging area (``batch.staging_dir``).

Every step of a batch may run on another host (a Celery or Kubernetes worker, a Spark driver in cluster
deploy mode), so the staging area is either a local directory shared by those hosts or object storage
(``s3://``, ``gs://``, ``abfs://``), read and written through the same file layer as the warehouse
(pyiceberg's ``PyArrowFileIO``: the catalog's ``s3.*``/``gcs.*``/``adls.*`` properties, overridden by
``batch.staging_properties``).

A location is a ``pathlib.Path`` for a local directory (``file://`` or a plain path) and an
:class:`~tidewater.staging.objects.ObjectPath` for object storage: both answer the same small set of calls
(``/``, ``parent``, ``name``, ``is_file``, ``iterdir``, ``unlink``, ``read_bytes``), and the functions here
(``write_json``, ``read_json``, ``remove_tree``, ``modified``, parquet) do what differs.

What a reader may rely on, on both:

- A document is seen whole or not at all. Locally it is written to a temporary file in the same directory
  and renamed over its name (``os.replace``). Object stores have no rename; a PUT is atomic instead (the
  object appears only when its upload completes, a killed upload leaves nothing), so the document is
  serialized whole first and sent as one object: nothing half-written can ever be visible under its name.
- Once written it is what every later read returns: local renames and object stores (S3, GCS and Azure
  Blob are strongly consistent for reads after writes) both give that. A document that cannot be read
  whole (a truncated copy, say) fails JSON parsing and its step stops: it is never committed from.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tidewater.errors import ConfigError, TerminalError
from tidewater.staging.objects import ObjectPath, object_path

StagePath = Path | ObjectPath

# The schemes a staging location may use: a local directory or object storage through pyarrow's
# filesystems (what pyiceberg's PyArrowFileIO serves for these schemes).
LOCAL_SCHEMES = ("", "file")
OBJECT_SCHEMES = ("s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss")


def scheme_of(location: str) -> str:
    return location.split("://", 1)[0].lower() if "://" in location else ""


def locate(location: str | StagePath, properties: Mapping[str, str], setting: str = "batch.staging_dir") -> StagePath:
    """The staging location ``location`` names (a path or a URI). ``properties``: the file layer's settings
    (credentials, endpoint). Raises ConfigError naming ``setting`` for a scheme the file layer cannot serve."""
    if isinstance(location, (Path, ObjectPath)):
        return location
    scheme = scheme_of(location)
    if scheme in LOCAL_SCHEMES:
        return Path(location[len("file://") :] if scheme else location).expanduser()
    if scheme in OBJECT_SCHEMES:
        return object_path(location, properties, setting)

    raise ConfigError(
        f"{setting}: {location!r} uses the scheme {scheme!r}, which the staging file layer cannot serve "
        f"(a path, file://, or one of {', '.join(s + '://' for s in OBJECT_SCHEMES)})"
    )


def write_json(path: StagePath, doc: Mapping[str, Any]) -> None:
    """Write a JSON document so that readers see either nothing or the whole document (module docstring)."""
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    if isinstance(path, ObjectPath):
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: StagePath) -> dict[str, Any]:
    """A staged JSON document; one that is not whole (truncated or altered) is a terminal error naming it,
    so no step ever acts on part of a plan or manifest."""
    data = path.read_bytes()
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise TerminalError(
            f"{path} is not a whole JSON document ({len(data)} bytes: {e}); the step that wrote it "
            "has to run again (its batch is planned anew)"
        ) from None
    if not isinstance(doc, dict):
        raise TerminalError(f"{path} holds JSON {type(doc).__name__}, not a staged document")
    return doc


def remove_tree(path: StagePath) -> None:
    """Remove a staged directory and everything under it (nothing if it is gone)."""
    if isinstance(path, ObjectPath):
        path.remove_tree()
    else:
        shutil.rmtree(path, ignore_errors=True)


def modified(path: StagePath) -> float:
    """When the file (or, for a directory, the newest file directly in it) last changed, in epoch seconds."""
    if isinstance(path, ObjectPath):
        return path.modified()
    times = [path.stat().st_mtime]
    if path.is_dir():
        times += [f.stat().st_mtime for f in path.iterdir() if f.is_file()]
    return max(times)
