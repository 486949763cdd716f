"""The staging layer's local behaviour and the settings that name it (object storage: tests/integration/
test_object_staging.py, against a local S3 endpoint)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewater.config.parse import parse_pipeline
from tidewater.errors import ConfigError, TerminalError
from tidewater.staging import locate, read_json, write_json
from tidewater.staging.objects import ObjectPath

BASE = {"name": "p", "topics": ["a"], "kafka": {"bootstrap_servers": "h:9092"}, "table": "ns.t"}


def test_local_locations_are_paths_and_object_storage_is_an_object_path(tmp_path: Path):
    assert locate(str(tmp_path), {}) == tmp_path
    assert locate(f"file://{tmp_path}/x", {}) == tmp_path / "x"
    staged = locate("s3://bucket/staging", {"s3.region": "us-east-1"})
    assert isinstance(staged, ObjectPath)
    assert str(staged / "p" / "plan.json") == "s3://bucket/staging/p/plan.json"
    assert (staged / "p").parent.name == "staging"


def test_a_scheme_the_file_layer_cannot_serve_is_refused_by_validation_naming_the_setting():
    with pytest.raises(ConfigError, match=r"batch\.staging_dir: 'ftp://host/staging' uses the scheme 'ftp'"):
        parse_pipeline({**BASE, "batch": {"staging_dir": "ftp://host/staging"}})
    with pytest.raises(ConfigError, match=r"validation\.data_docs_dir: 'hdfs://nn/docs' uses the scheme 'hdfs'"):
        parse_pipeline({**BASE, "validation": {"data_docs_dir": "hdfs://nn/docs"}})
    spec = parse_pipeline({**BASE, "batch": {"staging_dir": "s3://lake/staging",
                                             "staging_properties": {"s3.region": "eu-west-1"}}})
    assert str(spec.staging_dir()) == "s3://lake/staging"


def test_a_local_document_is_replaced_whole_and_leaves_no_temporary_file(tmp_path: Path):
    path = tmp_path / "b" / "manifest.json"
    write_json(path, {"n": 1})
    write_json(path, {"n": 2, "more": list(range(1000))})
    assert read_json(path)["n"] == 2
    assert [p.name for p in path.parent.iterdir()] == ["manifest.json"]


@pytest.mark.parametrize("text", ['{"batch_id": "b1", "data_fi', "[1, 2]", ""])
def test_a_document_that_is_not_whole_is_a_terminal_error_naming_it(tmp_path: Path, text: str):
    path = tmp_path / "manifest.json"
    path.write_text(text)
    with pytest.raises(TerminalError, match="manifest.json") as e:
        read_json(path)
    assert not e.value.transient
