"""Iceberg's Spark runtime jar, ready to load offline.

Iceberg's Spark runtime comes either from Maven (``spark.iceberg_packages``, production) or, offline,
from the jar bundled in ``snowpark-connect-deps-iceberg``. That bundled jar lacks Iceberg's relocated
Jackson classes; :func:`repaired_jackson_jar` rebuilds them once from the Jackson copy the same jar
carries for Parquet (and jackson-datatype-jsr310 from pyspark), by rewriting the package names in the
class files' constant pools.
"""

from __future__ import annotations

import io
import logging
import struct
import zipfile
from pathlib import Path

from tidewater.config.locations import home_dir
from tidewater.errors import ConfigError

log = logging.getLogger(__name__)


RUNTIME_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"


SHADED = b"org/apache/iceberg/shaded/com/fasterxml/jackson"


PARQUET_SHADED = b"org/apache/iceberg/shaded/org/apache/parquet/shaded/com/fasterxml/jackson"


PLAIN = b"com/fasterxml/jackson"


REPAIR_VERSION = "1"


JDBC_DRIVERS = ("/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/postgresql.jar")


RUNTIME_SPARK = "3.5"  # the Spark release the bundled runtime is built for (RUNTIME_JAR's name)


def spark_release() -> str | None:
    """The major.minor release of this environment's pyspark (the Spark a session of this process starts), or
    None when pyspark is not installed."""
    try:
        from pyspark.version import __version__  # pyspark's own module: pyspark 3.5 and 4, or pyspark-client 4
    except ImportError:
        return None
    return ".".join(__version__.split(".")[:2])


def bundled_runtime_jar(release: str | None = None) -> Path:
    """The offline Iceberg runtime jar, for a Spark session of ``release`` (default: this environment's pyspark):
    it is built for Spark 3.5, so another release is refused, naming the setting and its Maven coordinate."""
    release = release or spark_release()
    if release and release != RUNTIME_SPARK:
        scala = "2.13" if release.startswith("4") else "2.12"
        raise ConfigError(
            f"spark.iceberg_packages: unset, and the offline Iceberg runtime ({RUNTIME_JAR}) is built "
            f"for Spark {RUNTIME_SPARK}, not this Spark {release}; set it to Iceberg's runtime for "
            f"Spark {release}, e.g. org.apache.iceberg:iceberg-spark-runtime-{release}_{scala}:1.10.2"
        )
    try:
        import snowpark_connect_deps_iceberg
    except ImportError:
        raise ConfigError(
            "spark.iceberg_packages: unset, and the offline Iceberg runtime (snowpark-connect-deps-iceberg, "
            "requirements-dev.txt) is not installed; set it to the Maven coordinates, e.g. "
            "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2"
        ) from None

    base = Path(snowpark_connect_deps_iceberg.__file__).parent
    jar = base / "jars" / RUNTIME_JAR
    if not jar.is_file():
        raise ConfigError(f"spark.iceberg_packages: unset, and the bundled Iceberg runtime {jar} is missing")
    return jar


def _rewrite_utf8(data: bytes, pairs: list[tuple[bytes, bytes]]) -> bytes:
    for old, new in pairs:
        if old in data:
            data = data.replace(old, new)
    return data


def rewrite_class(data: bytes, pairs: list[tuple[bytes, bytes]]) -> bytes:
    """Rewrite package names in a class file's CONSTANT_Utf8 entries (lengths adjusted)."""
    if data[:4] != b"\xca\xfe\xba\xbe":
        raise ValueError("not a class file")
    count = struct.unpack_from(">H", data, 8)[0]
    out = io.BytesIO()
    out.write(data[:10])
    pos = 10
    i = 1
    sizes = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}
    while i < count:
        tag = data[pos]
        if tag == 1:
            (length,) = struct.unpack_from(">H", data, pos + 1)
            raw = data[pos + 3 : pos + 3 + length]
            new = _rewrite_utf8(raw, pairs)
            out.write(bytes([1]) + struct.pack(">H", len(new)) + new)
            pos += 3 + length
        else:
            size = sizes[tag]
            out.write(data[pos : pos + 1 + size])
            pos += 1 + size
            if tag in (5, 6):
                i += 1
        i += 1
    out.write(data[pos:])
    return out.getvalue()


def _dotted(b: bytes) -> bytes:
    return b.replace(b"/", b".")


def build_jackson_jar(runtime_jar: Path, jsr310_jar: Path | None, target: Path) -> None:
    pairs_parquet = [(PARQUET_SHADED, SHADED), (_dotted(PARQUET_SHADED), _dotted(SHADED))]
    pairs_plain = [(PLAIN, SHADED), (_dotted(PLAIN), _dotted(SHADED))]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    written = 0
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: tidewater jar repair\n")
        sources = [(runtime_jar, PARQUET_SHADED.decode(), pairs_parquet)]
        if jsr310_jar is not None:
            sources.append((jsr310_jar, "com/fasterxml/jackson/datatype/jsr310", pairs_plain))
        for jar, prefix, pairs in sources:
            with zipfile.ZipFile(jar) as zin:
                for name in zin.namelist():
                    if not name.startswith(prefix) or name.endswith("/"):
                        continue
                    data = zin.read(name)
                    new_name = _rewrite_utf8(name.encode(), pairs).decode()
                    if name.endswith(".class"):
                        data = rewrite_class(data, pairs)
                    out.writestr(new_name, data)
                    written += 1
                for name in zin.namelist():  # service registrations
                    if name.startswith("META-INF/services/") and b"jackson" in name.encode():
                        data = _rewrite_utf8(zin.read(name), pairs)
                        out.writestr(_rewrite_utf8(name.encode(), pairs).decode(), data)
    if written == 0:
        tmp.unlink()
        raise ConfigError(f"no relocatable Jackson classes found in {runtime_jar}")
    tmp.replace(target)
    log.info("built %s (%d entries)", target, written)


def repaired_jackson_jar(runtime_jar: Path | None = None) -> Path | None:
    """The relocated-Jackson jar the bundled runtime needs (built once), or None if not needed."""
    runtime_jar = runtime_jar or bundled_runtime_jar()
    with zipfile.ZipFile(runtime_jar) as z:
        if f"{SHADED.decode()}/core/JsonFactoryBuilder.class" in z.namelist():
            return None
    target = home_dir() / "jars" / f"iceberg-jackson-relocated-v{REPAIR_VERSION}-{runtime_jar.stem}.jar"
    if not target.is_file():
        import pyspark

        jsr = sorted((Path(pyspark.__file__).parent / "jars").glob("jackson-datatype-jsr310-*.jar"))
        build_jackson_jar(runtime_jar, jsr[0] if jsr else None, target)
    return target
