"""Staging on object storage: a path-like location over one of pyarrow's filesystems.

Why not a library: pyiceberg's FileIO reads and writes single files but cannot list or delete a prefix,
and fsspec is not among the project's dependencies; pyarrow's filesystems (which FileIO is built on,
configured by the same properties) can, and this class only gives them the few ``pathlib`` calls the
batch steps use, so a step does not care where the staging area lives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any, TypeVar

from tidewater.errors import ConfigError, TransientError

T = TypeVar("T")

# Words in pyarrow's error text (the AWS, Google and Azure SDKs' own) that mean a person has to act: the
# credentials were refused or the bucket does not exist. Anything else (refused connections, timeouts,
# throttling, 5xx) may heal on a retry.
_REFUSED = (
    "ACCESS_DENIED",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "INVALID_ACCESS_KEY",
    "NoSuchBucket",
    "NO_SUCH_BUCKET",
    "Forbidden",
    "AuthorizationFailure",
    "AuthenticationFailed",
    "PermissionDenied",
    "HTTP status 403",
    "ExpiredToken",
    "InvalidToken",
)
# The SDKs' words for a store that did not answer: transient even when the rest of the text (a host name, a
# port such as 40305) happens to contain one of the words above.
_UNREACHED = ("NETWORK_CONNECTION", "curlCode", "Could not connect", "Connection refused", "timed out")


def storage_failure(e: BaseException, location: str, setting: str) -> Exception:
    """The error to raise for a failed call on the staging store: terminal naming ``setting`` when the store
    refused the credentials or has no such bucket, transient otherwise (unreachable, timed out, busy)."""
    text = str(e)
    if not any(word in text for word in _UNREACHED) and any(word in text for word in _REFUSED):
        return ConfigError(f"{setting}: the store refused access to {location} (credentials or bucket): {text.splitlines()[0]}")
    return TransientError(f"{setting}: the store at {location} could not be reached: {text.splitlines()[0]}")


class ObjectPath:
    """``<scheme>://<bucket>/<key>`` on a pyarrow filesystem. Directories are key prefixes."""

    def __init__(self, fs: Any, key: str, scheme: str, setting: str) -> None:
        self.fs, self.key, self.scheme, self.setting = fs, key.rstrip("/"), scheme, setting

    # -- pathlib's shape ---------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: ObjectPath) -> bool:
        return str(self) < str(other)

    def __truediv__(self, name: str) -> ObjectPath:
        return ObjectPath(self.fs, f"{self.key}/{name}", self.scheme, self.setting)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.fs, self.key.rsplit("/", 1)[0], self.scheme, self.setting)

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        if not self.key.startswith(other.key + "/"):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.key[len(other.key) + 1 :])

    def as_uri(self) -> str:
        return str(self)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a prefix exists once an object is under it."""

    # -- calls on the store ------------------------------------------------------------------------------
    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except FileNotFoundError:
            raise
        except OSError as e:
            raise storage_failure(e, str(self), self.setting) from e

    def _info(self) -> Any:
        return self._call(lambda: self.fs.get_file_info(self.key))

    def is_file(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.File

    def is_dir(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.Directory

    def exists(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type != FileType.NotFound

    def iterdir(self) -> Iterator[ObjectPath]:
        from pyarrow.fs import FileSelector

        infos = self._call(lambda: self.fs.get_file_info(FileSelector(self.key, allow_not_found=True)))
        return iter([ObjectPath(self.fs, i.path, self.scheme, self.setting) for i in infos])

    def rglob(self, pattern: str = "*") -> Iterator[ObjectPath]:
        """Every object under this prefix (``pattern`` must be ``*``: the tests' and the audit's use)."""
        from pyarrow.fs import FileSelector, FileType

        if pattern != "*":
            raise ValueError(f"rglob({pattern!r}): only '*' is served on object storage")
        infos = self._call(lambda: self.fs.get_file_info(FileSelector(self.key, allow_not_found=True, recursive=True)))
        return iter([ObjectPath(self.fs, i.path, self.scheme, self.setting) for i in infos if i.type == FileType.File])

    def read_bytes(self) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_stream(self.key) as fh:
                return fh.read()

        return self._call(read)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """One object, sent whole: it appears under its name only when the upload completes."""

        def write() -> None:
            with self.fs.open_output_stream(self.key) as fh:
                fh.write(data)

        self._call(write)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self._call(lambda: self.fs.delete_file(self.key))
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_tree(self) -> None:
        def remove() -> None:
            from pyarrow.fs import FileType

            if self.fs.get_file_info(self.key).type == FileType.Directory:
                self.fs.delete_dir(self.key)

        self._call(remove)

    def modified(self) -> float:
        """The object's last change, or for a prefix its newest object's (epoch seconds; 0 if empty)."""
        from pyarrow.fs import FileSelector, FileType

        info = self._info()
        if info.type == FileType.File:
            return info.mtime.timestamp()
        infos = self._call(lambda: self.fs.get_file_info(FileSelector(self.key, allow_not_found=True, recursive=True)))
        return max((i.mtime.timestamp() for i in infos if i.type == FileType.File and i.mtime), default=0.0)


def object_path(location: str, properties: Mapping[str, str], setting: str) -> ObjectPath:
    """The location ``<scheme>://<bucket>/<key>`` on the filesystem pyiceberg's FileIO builds from
    ``properties`` (the same ``s3.*``/``gcs.*``/``adls.*`` settings, so the same credentials)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = PyArrowFileIO(dict(properties))
    scheme, netloc, key = io.parse_location(location)
    if not netloc:
        raise ConfigError(f"{setting}: {location!r} names no bucket (expected {scheme}://<bucket>/<prefix>)")
    try:
        fs = io.fs_by_scheme(scheme, netloc)
    except (ValueError, ImportError, OSError) as e:
        raise ConfigError(f"{setting}: {location!r}: the file layer cannot open {scheme}:// here: {e}") from e
    return ObjectPath(fs, key, scheme, setting)
