"""Snapshot summary properties, and the offline Iceberg runtime repair (class-file rewrite)."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from tidewater.batch import BatchManifest, PartitionStats
from tidewater.spark.jars import PARQUET_SHADED, SHADED, bundled_runtime_jar, repaired_jackson_jar, rewrite_class
from tidewater.table.summary import BATCH_ID, OFFSETS, VALID_THROUGH_MS, summary_properties


def test_summary_is_namespaced_cumulative_and_secret_free():
    props = summary_properties(
        offsets={"a": {0: 10, 1: 5}},
        batch_id="b1",
        pipeline="p",
        records=15,
        valid_through_ms=1_700_000_000_000,
        dag_run_id="manual__x",
    )
    assert all(k.startswith("tidewater.") for k in props)
    assert json.loads(props[OFFSETS]) == {"a": {"0": 10, "1": 5}}
    assert props[BATCH_ID] == "b1" and props[VALID_THROUGH_MS] == "1700000000000"


def test_valid_through_is_min_over_partitions_of_max_timestamp():
    parts = (
        PartitionStats("t", 0, 0, 5, 5, 0, 4, 100, 900),
        PartitionStats("t", 0, 5, 9, 4, 5, 8, 950, 1200),  # second sub-range of partition 0
        PartitionStats("t", 1, 0, 3, 3, 0, 2, 50, 700),
        PartitionStats("t", 2, 0, 0, 0, None, None, None, None),
    )
    m = BatchManifest("b", "ns.t", (), parts, 0, "now")
    assert m.valid_through_ms() == 700
    assert m.next_offsets() == {"t": {0: 9, 1: 3, 2: 0}}
    assert m.records == 12


def _utf8_constants(data: bytes) -> list[bytes]:
    count = struct.unpack_from(">H", data, 8)[0]
    pos, i, out = 10, 1, []
    sizes = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}
    while i < count:
        tag = data[pos]
        if tag == 1:
            (n,) = struct.unpack_from(">H", data, pos + 1)
            out.append(data[pos + 3 : pos + 3 + n])
            pos += 3 + n
        else:
            pos += 1 + sizes[tag]
            i += tag in (5, 6)
        i += 1
    return out


def test_class_rewrite_relocates_every_reference_and_keeps_the_pool_parseable():
    jar = bundled_runtime_jar()
    name = PARQUET_SHADED.decode() + "/core/JsonFactoryBuilder.class"
    with zipfile.ZipFile(jar) as z:
        original = z.read(name)
    rewritten = rewrite_class(original, [(PARQUET_SHADED, SHADED)])
    before, after = _utf8_constants(original), _utf8_constants(rewritten)
    assert len(before) == len(after)
    assert any(SHADED in c for c in after)
    assert not any(PARQUET_SHADED in c for c in after)


def test_repaired_jar_provides_the_missing_classes(home):
    path = repaired_jackson_jar()
    assert path is not None and path.is_file()
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
    assert SHADED.decode() + "/core/JsonFactoryBuilder.class" in names
    assert SHADED.decode() + "/databind/ObjectMapper.class" in names
    assert any("/datatype/jsr310/JavaTimeModule.class" in n for n in names)


def test_the_offline_iceberg_runtime_serves_spark_3_5_only_and_names_the_setting_for_spark_4():
    """The bundled runtime jar is Spark 3.5's: a session of this environment's Spark 3.5 gets it; a Spark 4 session
    is refused before its JVM starts, naming spark.iceberg_packages and the 4.0 runtime's coordinate."""
    import pytest

    from tidewater.errors import ConfigError
    from tidewater.spark.jars import RUNTIME_JAR, spark_release

    assert spark_release() == "3.5" and bundled_runtime_jar().name == RUNTIME_JAR
    with pytest.raises(ConfigError) as refused:
        bundled_runtime_jar("4.0")
    text = str(refused.value)
    assert text.startswith("spark.iceberg_packages:") and "iceberg-spark-runtime-4.0_2.13" in text


def test_spark_submit_is_spark_home_s_then_this_environment_s_then_the_path_s(tmp_path):
    """`tidewater run` starts $SPARK_HOME/bin/spark-submit when SPARK_HOME names a distribution, else the one of
    this environment's pyspark; a SPARK_HOME without it falls back, and nothing anywhere is a ConfigError that
    says what to install."""
    import sys

    import pytest

    from tidewater.errors import ConfigError
    from tidewater.spark.conf import spark_submit_binary

    home = tmp_path / "spark-4"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    ours = str(Path(sys.executable).parent / "spark-submit")
    assert spark_submit_binary({"SPARK_HOME": str(home)}) == str(home / "bin" / "spark-submit")
    assert spark_submit_binary({"SPARK_HOME": str(tmp_path / "none")}) == ours == spark_submit_binary({})
    (home / "bin" / "spark-submit").unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
        with pytest.raises(ConfigError) as missing:
            spark_submit_binary({"SPARK_HOME": str(home), "PATH": str(tmp_path)})
    assert "SPARK_HOME=" in str(missing.value) and "[spark]" in str(missing.value)


def test_executors_python_is_set_only_where_this_interpreter_exists(tmp_path):
    """spark.pyspark.python: this interpreter on a local master; nothing on a cluster (the cluster's own
    spark-defaults or PYSPARK_PYTHON applies; this path rarely exists on the workers); the shipped
    environment with spark.python_env. The driver's Python is this interpreter in every case."""
    import sys

    from tidewater.config.parse import parse_pipeline
    from tidewater.spark.conf import write_submit_settings

    base = {"name": "p", "topics": ["t"], "kafka": {"bootstrap_servers": "h:9092"}, "table": "ns.t"}
    spec = parse_pipeline(base)
    local = write_submit_settings(spec, "local[2]")["conf"]
    assert local["spark.pyspark.python"] == sys.executable == local["spark.pyspark.driver.python"]
    cluster = write_submit_settings(spec, "spark://master:7077")["conf"]
    assert "spark.pyspark.python" not in cluster and cluster["spark.pyspark.driver.python"] == sys.executable
    pack = tmp_path / "env.tar.gz"
    pack.write_bytes(b"")
    shipped = write_submit_settings(parse_pipeline({**base, "spark": {"python_env": str(pack)}}), "spark://master:7077")["conf"]
    assert shipped["spark.pyspark.python"] == "./environment/bin/python" and shipped["spark.archives"] == f"{pack}#environment"


def test_deployment_faults_and_spark_failures_are_classified():
    """What no retry heals (the executors' Python lacks the packages or does not exist) is terminal and names
    spark.python_env; Spark's own failures become one line, transient only for conflicts and unreachable
    services."""
    from pyspark.errors import AnalysisException

    from tidewater.errors import ConfigError
    from tidewater.spark.session import spark_failure
    from tidewater.write.job import deployment_fault

    fault = deployment_fault("py4j.protocol.Py4JJavaError: ...\nModuleNotFoundError: No module named 'tidewater'\n")
    assert isinstance(fault, ConfigError) and "spark.python_env" in str(fault) and "'tidewater'" in str(fault)
    fault = deployment_fault('java.io.IOException: Cannot run program "./environment/bin/python": error=2, No such file')
    assert isinstance(fault, ConfigError) and "./environment/bin/python" in str(fault)
    assert deployment_fault("org.apache.spark.SparkException: Job aborted: executor lost") is None
    fault = deployment_fault(
        "org.apache.spark.SparkException: Cluster deploy mode is currently not supported for python applications on standalone clusters."
    )
    assert isinstance(fault, ConfigError) and "spark.connect_url" in str(fault)
    bad_sql = spark_failure(AnalysisException(message="[TABLE_OR_VIEW_NOT_FOUND] The table `x` cannot be found.\nplan..."))
    assert bad_sql is not None and not bad_sql.transient and str(bad_sql).startswith("Spark: [TABLE_OR_VIEW_NOT_FOUND]")
    assert "plan" not in str(bad_sql)
    busy = spark_failure(AnalysisException(message="org.sqlite.SQLiteException: database is locked"))
    assert busy is not None and busy.transient
    assert spark_failure(ValueError("not Spark")) is None
