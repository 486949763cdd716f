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
    spec = parse_pipeline({**BASE, "batch": {"staging_dir": "s3://lake/staging", "staging_properties": {"s3.region": "eu-west-1"}}})
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


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        # The CI failure this guards against: a port number containing "403" read as an HTTP 403.
        (
            "When getting information for key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION during HeadObject "
            "operation: curlCode: 7, Could not connect to server; Details: Failed to connect to 127.0.0.1:40305",
            "transient",
        ),
        (
            "When getting information for key 'k' in bucket 'b': AWS Error UNKNOWN (HTTP status 403) during HeadObject "
            "operation: No response body.",
            "terminal",
        ),
        ("When creating key 'k' in bucket 'b': AWS Error NO_SUCH_BUCKET during PutObject operation: bucket missing", "terminal"),
        ("When reading 'k': AWS Error SLOW_DOWN during GetObject operation: reduce your request rate", "transient"),
    ],
)
def test_store_failures_are_classed_by_the_sdk_words_not_by_digits_in_a_host_or_port(text, kind):
    from tidewater.errors import TransientError
    from tidewater.staging.objects import storage_failure

    error = storage_failure(OSError(text), "s3://b/k", "batch.staging_dir")
    assert isinstance(error, TerminalError if kind == "terminal" else TransientError), error
    assert str(error).startswith("batch.staging_dir: ")
