"""Spark configuration, in one place, for every Spark entry point (the write job, queries, maintenance): the
Iceberg catalog (with the pyiceberg catalog's name, so both see the same tables), object storage, jars, the
executors' Python, and the spark-submit command with its secrets in a private properties file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tidewater.config.secrets import SPARK_REDACTION_REGEX, split_secrets
from tidewater.config.sections.run import catalog_type
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError
from tidewater.spark.jars import JDBC_DRIVERS, bundled_runtime_jar, repaired_jackson_jar

log = logging.getLogger(__name__)


def catalog_conf(spec: PipelineSpec) -> dict[str, str]:
    """Spark catalog settings equivalent to the pipeline's pyiceberg catalog."""
    props = spec.catalog_properties()
    name = spec.catalog.name
    pre = f"spark.sql.catalog.{name}"
    conf = {pre: "org.apache.iceberg.spark.SparkCatalog"}
    ctype = catalog_type(props)
    warehouse = props.get("warehouse")
    if ctype == "sql":
        uri = props["uri"]
        parsed = urlparse(uri)
        if parsed.scheme.startswith("sqlite"):
            jdbc = "jdbc:sqlite:" + uri.split(":///", 1)[1]
        elif parsed.scheme.startswith("postgresql"):
            jdbc = f"jdbc:postgresql://{parsed.hostname}:{parsed.port or 5432}{parsed.path}"
            if parsed.username:
                conf[f"{pre}.jdbc.user"] = parsed.username
            if parsed.password:
                conf[f"{pre}.jdbc.password"] = parsed.password
        else:
            raise ConfigError(f"catalog.properties.uri: Spark cannot use a {parsed.scheme} SQL catalog")
        conf.update({f"{pre}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog", f"{pre}.uri": jdbc})
        conf[f"{pre}.jdbc.schema-version"] = "V1"
    elif ctype == "glue":
        conf.update(_glue_conf(pre, props))
    elif ctype in ("rest", "hive"):
        conf[f"{pre}.type"] = ctype
        conf.update({f"{pre}.{k}": v for k, v in props.items() if k not in ("type", "warehouse")})
    else:
        raise ConfigError(f"catalog.properties.type: {ctype!r} has no Spark equivalent")
    if warehouse:
        conf[f"{pre}.warehouse"] = warehouse
    conf.update(_object_storage_conf(pre, props))
    # Other processes commit to these tables all the time (ingest): never serve a cached table.
    conf[f"{pre}.cache-enabled"] = "false"
    return conf


S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"


# pyiceberg's Glue catalog credentials -> the AWS SDK's environment variables. Iceberg Java's Glue client takes no keys
# as catalog properties (AwsClientProperties: a credentials provider class, else the SDK's default chain, whose first
# link is the environment), so the Spark driver's JVM gets them in its environment (``jvm_env``).
_GLUE_ENV = {
    "AWS_ACCESS_KEY_ID": ("glue.access-key-id", "client.access-key-id"),
    "AWS_SECRET_ACCESS_KEY": ("glue.secret-access-key", "client.secret-access-key"),
    "AWS_SESSION_TOKEN": ("glue.session-token", "client.session-token"),
}


def _glue_conf(pre: str, props: dict[str, str]) -> dict[str, str]:
    """Iceberg's GlueCatalog with the pyiceberg catalog's properties (Iceberg Java reads the same ``glue.endpoint``,
    ``glue.id``, ``client.region``; pyiceberg's ``glue.region`` becomes ``client.region``), less the credentials,
    which the JVM takes from its environment (``jvm_env``)."""
    conf = {f"{pre}.catalog-impl": "org.apache.iceberg.aws.glue.GlueCatalog"}
    if "client.region" not in props and "glue.region" in props:
        conf[f"{pre}.client.region"] = props["glue.region"]
    credentials = {k for keys in _GLUE_ENV.values() for k in keys}
    conf.update({f"{pre}.{k}": v for k, v in props.items() if k not in ("type", "warehouse", *credentials)})
    return conf


def jvm_env(spec: PipelineSpec) -> dict[str, str]:
    """Environment variables the Spark driver's JVM needs for the pipeline's catalog: a Glue catalog's credentials
    (the role's temporary keys where the connection names one), nothing for other catalogs."""
    props = spec.catalog_properties()
    if catalog_type(props) != "glue":
        return {}
    found = {var: next((props[k] for k in keys if props.get(k)), None) for var, keys in _GLUE_ENV.items()}
    return {var: str(v) for var, v in found.items() if v}


AWS_BUNDLE = "org.apache.iceberg:iceberg-aws-bundle:1.12.0"  # the pair the Glue and REST tests run


# pyiceberg's S3 properties -> Iceberg Java's (S3FileIO); the others keep their names
_S3_PROPERTIES = {"s3.region": "client.region", "s3.force-virtual-addressing": None}


def _object_storage_conf(pre: str, props: dict[str, str]) -> dict[str, str]:
    """Spark catalog settings for a warehouse on S3-compatible storage: Iceberg's S3FileIO with the pyiceberg
    catalog's `s3.*` properties under the names Iceberg Java reads."""
    warehouse = str(props.get("warehouse", ""))
    if not (warehouse.startswith(("s3://", "s3a://")) or any(k.startswith("s3.") for k in props)):
        return {}
    conf = {f"{pre}.io-impl": S3_FILE_IO}
    for k, v in props.items():
        if k.startswith("s3."):
            name = _S3_PROPERTIES.get(k, k)
            if name:
                conf[f"{pre}.{name}"] = v
    if "s3.endpoint" in props:  # MinIO and other S3-compatible stores address buckets by path
        conf.setdefault(f"{pre}.s3.path-style-access", "true")
    return conf


def check_object_storage_jars(spec: PipelineSpec, conf: dict[str, str]) -> None:
    """S3FileIO lives in Iceberg's AWS bundle, which no package here ships: refuse before the JVM starts."""
    if S3_FILE_IO not in conf.values():
        return
    given = " ".join([spec.spark.iceberg_packages or "", conf.get("spark.jars", ""), conf.get("spark.jars.packages", "")])
    if "iceberg-aws-bundle" not in given:
        raise ConfigError(
            f"catalog.properties: the warehouse is on object storage, and Spark reaches it through "
            f"Iceberg's S3FileIO, which needs {AWS_BUNDLE}: add it to spark.iceberg_packages (with the "
            "Iceberg runtime, e.g. 'org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.12.0,"
            + AWS_BUNDLE
            + "') or its jar to spark.conf spark.jars. Ingest does not need it (pyiceberg writes the files)."
        )


# a class of the HTTP library Iceberg's REST client shades into its runtime jars
REST_CLIENT_CLASS = "org/apache/iceberg/shaded/org/apache/hc/core5/http/Method.class"


def check_rest_client(spec: PipelineSpec, conf: dict[str, str]) -> None:
    """A REST catalog in Spark needs the REST client's HTTP library, which the offline bundled runtime does not
    carry (Spark would fail later with NoClassDefFoundError): refuse before the JVM starts, naming the setting."""
    if conf.get(f"spark.sql.catalog.{spec.catalog.name}.type") != "rest" or spec.spark.iceberg_packages:
        return
    import zipfile

    with zipfile.ZipFile(bundled_runtime_jar()) as jar:
        if REST_CLIENT_CLASS in jar.namelist():
            return
    raise ConfigError(
        "spark.iceberg_packages: unset, and the offline bundled Iceberg runtime has no REST client "
        "(its HTTP library is not in the jar): a REST catalog in Spark (maintenance, `tidewater sql`) "
        "needs Iceberg's runtime from Maven, e.g. 'org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.12.0'. "
        "Ingest does not need it (pyiceberg commits)."
    )


def jars(spec: PipelineSpec) -> list[str]:
    out = [p for p in JDBC_DRIVERS if Path(p).is_file()]
    if not spec.spark.iceberg_packages:
        runtime = bundled_runtime_jar()
        out.insert(0, str(runtime))
        repaired = repaired_jackson_jar(runtime)
        if repaired is not None:
            out.insert(1, str(repaired))
    return out


_BASE_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
}


ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def spark_conf(spec: PipelineSpec, master: str | None = None) -> dict[str, str]:
    """Settings of a Spark session on the pipeline's Iceberg catalog (SQL, maintenance)."""
    conf = {"spark.sql.extensions": ICEBERG_EXTENSIONS, **_BASE_CONF}
    conf.update(python_conf(spec, master or spec.spark.master))
    conf.update(catalog_conf(spec))
    conf.update(spec.spark.conf)
    check_object_storage_jars(spec, conf)
    check_rest_client(spec, conf)
    return conf


def submit_settings(spec: PipelineSpec, master: str | None = None) -> dict[str, Any]:
    """What a Spark session on the Iceberg catalog needs: conf, jars (comma list) and packages."""
    return {
        "conf": spark_conf(spec, master),
        "jars": ",".join(jars(spec)),
        "packages": spec.spark.iceberg_packages,
    }


# The write job's driver JVM only schedules tasks (records never enter the JVM), and lives seconds: the
# client compiler alone and the serial collector start it faster (write step of a one-record batch 4.5 s
# -> 3.9 s, median of 3 runs, BENCHMARKS.md). Maintenance and SQL sessions, where the JVM does the work,
# keep the JVM's defaults. A pipeline's own spark.conf value replaces this one.
WRITE_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def launcher_env() -> dict[str, str]:
    """Environment for spark-submit's launcher JVM (it only builds the command line): the same fast-start
    options, unless SPARK_LAUNCHER_OPTS is set already."""
    return {} if "SPARK_LAUNCHER_OPTS" in os.environ else {"SPARK_LAUNCHER_OPTS": WRITE_DRIVER_JAVA_OPTIONS}


@contextlib.contextmanager
def process_env(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while the block runs (so a child such as spark-submit inherits them
    without their appearing on any command line), the previous values put back after."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def local_master(master: str) -> bool:
    return master.startswith("local")


def python_conf(spec: PipelineSpec, master: str) -> dict[str, str]:
    """Which Python the executors run: the shipped environment (``spark.python_env``); on a local master this
    interpreter (the executors are this machine's processes); on a cluster nothing is set, so the cluster's
    own choice applies (``spark.pyspark.python`` in its spark-defaults.conf or ``spark.conf``, or
    ``PYSPARK_PYTHON``): this interpreter's path rarely exists on the workers. The driver's is this one."""
    if spec.spark.python_env:
        return python_env_conf(spec)
    conf = {"spark.pyspark.driver.python": sys.executable}
    if local_master(master):
        conf["spark.pyspark.python"] = sys.executable
    return conf


def python_env_conf(spec: PipelineSpec) -> dict[str, str]:
    """Executors' Python from ``spark.python_env`` (a packed virtualenv unpacked by Spark in each executor's
    working directory as ``environment``); the driver's stays this interpreter."""
    if not spec.spark.python_env:
        return {}
    where = spec.spark.python_env
    if "://" not in where:
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"spark.python_env: {path} does not exist (`make executor-env` builds it)")
        where = str(path)
    return {
        "spark.archives": f"{where}#environment",
        "spark.pyspark.python": "./environment/bin/python",
        "spark.pyspark.driver.python": sys.executable,
    }


def write_submit_settings(spec: PipelineSpec, master: str | None = None) -> dict[str, Any]:
    """What the write step's spark-submit needs.

    The write step writes Parquet with pyiceberg inside Python tasks and never opens the Iceberg catalog
    in Spark: no catalog settings (so no catalog credentials), no Iceberg runtime or JDBC jars, no SQL
    extensions. Secret settings (``config/secrets.py``: by key name or by value, such as an S3 secret key or a
    JDBC URL with a password) are returned apart, for a properties file (``properties_file``), never for the
    command line. Spark's own redaction (its UI, event logs) is widened to the same rules unless
    ``spark.conf`` sets ``spark.redaction.regex``.
    """
    conf = {**_BASE_CONF, **python_conf(spec, master or spec.spark.master)}
    conf["spark.driver.extraJavaOptions"] += " " + WRITE_DRIVER_JAVA_OPTIONS
    conf["spark.redaction.regex"] = SPARK_REDACTION_REGEX
    conf.update(spec.spark.conf)
    public, secret = split_secrets(conf)
    return {"conf": public, "secret_conf": secret, "jars": "", "packages": None}


def _escape_property(text: str) -> str:
    """A value as java.util.Properties reads it (spark-submit --properties-file)."""
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + out if out[:1] in (" ", "\t") else out


def spark_defaults_file(env: Mapping[str, str] | None = None) -> Path | None:
    """The ``spark-defaults.conf`` spark-submit would load: ``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``, else
    the conf folder of this environment's pyspark (where its spark-submit finds its home); None if absent."""
    env = os.environ if env is None else env
    if env.get("SPARK_CONF_DIR"):
        folder = Path(env["SPARK_CONF_DIR"])
    elif env.get("SPARK_HOME"):
        folder = Path(env["SPARK_HOME"]) / "conf"
    else:
        found = importlib.util.find_spec("pyspark")
        if found is None or not found.submodule_search_locations:
            return None
        folder = Path(list(found.submodule_search_locations)[0]) / "conf"
    path = folder / "spark-defaults.conf"
    return path if path.is_file() else None


def properties_file(conf: dict[str, str], defaults: Path | None = None) -> Path:
    """A spark-submit properties file holding ``conf``, readable by this user only (0600), in a private
    temporary directory (never the staging directory). The caller deletes it once spark-submit exited.

    spark-submit reads one properties file: given ``--properties-file`` it no longer loads the cluster's
    ``spark-defaults.conf`` (Spark 3.5; Spark 4 adds ``--load-spark-defaults``, which 3.5 and Airflow's Spark
    hook lack). So ``defaults`` (see ``spark_defaults_file``) is copied in first, as it is, and ``conf`` after
    it: java.util.Properties keeps the last value of a key, so ``conf`` wins over a default and the
    command line's ``--conf`` over both, the order spark-submit itself applies. Copying the text, not
    parsing it, keeps every default exactly as Spark would read it."""
    directory = Path(tempfile.mkdtemp(prefix="tidewater-spark-"))  # mode 0700
    path = directory / "secrets.properties"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        if defaults is not None:
            log.info(
                "spark-submit: secret settings go in a private properties file, so the cluster's defaults "
                "from %s are copied into it (spark-submit would skip them)",
                defaults,
            )
            # a trailing continuation line or a missing final newline must not swallow our first key
            fh.write(defaults.read_text(encoding="utf-8") + "\n\n# tidewater: the pipeline's secret settings\n")
        for k, v in conf.items():
            fh.write(f"{k}={_escape_property(str(v))}\n")
    return path


def remove_properties_file(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path.parent, ignore_errors=True)


def spark_submit_binary(env: Mapping[str, str] | None = None) -> str:
    """The spark-submit ``tidewater run`` starts, as Spark's own scripts find their home: ``$SPARK_HOME/bin`` when
    ``SPARK_HOME`` names a Spark distribution (Spark 3.5 or 4), else the one of this environment's pyspark (the
    ``spark`` extra), else ``spark-submit`` on the PATH. None of them: a ConfigError saying what to install."""
    env = os.environ if env is None else env
    candidates = [Path(env["SPARK_HOME"]) / "bin" / "spark-submit"] if env.get("SPARK_HOME") else []
    candidates.append(Path(sys.executable).parent / "spark-submit")
    for path in candidates:
        if path.is_file():
            return str(path)
    found = shutil.which("spark-submit", path=env.get("PATH"))
    if found:
        return found
    where = f"SPARK_HOME={env['SPARK_HOME']} has no bin/spark-submit; " if env.get("SPARK_HOME") else ""
    raise ConfigError(
        f"spark-submit: not found ({where}none beside {sys.executable} nor on the PATH): install Spark "
        "with the package's `spark` extra (pip install 'airflow-provider-tidewater[spark]') or set "
        "SPARK_HOME to a Spark 3.5 or 4 distribution"
    )


def spark_submit_command(
    spec: PipelineSpec, application: str, args: list[str], master: str | None = None, secrets_file: Path | None = None
) -> list[str]:
    """The write step's spark-submit command line (``tidewater run``; the DAG passes the same settings).
    Secret settings are never on it: pass ``secrets_file`` (see ``properties_file``)."""
    s = write_submit_settings(spec, master)
    cmd = [spark_submit_binary(), "--master", master or spec.spark.master]
    for k, v in s["conf"].items():
        cmd += ["--conf", f"{k}={v}"]
    if secrets_file is not None:
        cmd += ["--properties-file", str(secrets_file)]
    return [*cmd, application, *args]
