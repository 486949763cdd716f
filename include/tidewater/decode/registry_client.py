"""Schemas by id from a Confluent-compatible schema registry, for the formats that read them (``avro``,
``debezium_avro``, ``json_schema``, ``protobuf``) and for Avro message keys: confluent-kafka's ``SchemaRegistryClient``
(its HTTP client, retries, TLS and basic or bearer auth), its errors told apart as ours, each schema parsed once and
cached for the task's life.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tidewater.errors import TerminalError, TransientError


class UnknownSchemaId(Exception):
    pass


# the registry client's settings that it takes as numbers: a pipeline file's and a connection's values are text
_NUMERIC = ("timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms", "cache.capacity", "cache.latest.ttl.sec")


def _typed(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the numeric ones as numbers (a value that is not one is refused, naming the setting)."""
    out = dict(settings)
    for key in _NUMERIC:
        if isinstance(out.get(key), str):
            try:
                out[key] = float(out[key]) if "." in out[key] else int(out[key])
            except ValueError:
                raise TerminalError(f"format.registry_settings.{key}: {out[key]!r} is not a number") from None
    return out


class RegistryClient:
    """Writer schemas by id, through confluent-kafka's ``SchemaRegistryClient`` (its HTTP client, retries,
    TLS and basic or bearer auth: ``format.registry_basic_auth`` and ``format.registry_settings``), parsed
    once and cached for the task's life. Its errors become ours: an id the registry does not know (404) or
    a schema that is not Avro makes the record a dead letter (``UnknownSchemaId``); refused credentials
    (401, 403) are terminal; an unreachable registry or a server error is transient."""

    def __init__(self, url: str, auth: str | None = None, settings: dict[str, str] | None = None, timeout: float = 10.0) -> None:
        # an optional backend (httpx, authlib, attrs): imported by the Avro formats only
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = url.rstrip("/")
        conf: dict[str, Any] = {"url": self.url, "timeout": timeout, "max.retries": 2, **_typed(settings or {})}
        if auth:
            conf["basic.auth.user.info"] = auth
        try:
            self._client = SchemaRegistryClient(conf)
        except ValueError as e:  # a bad setting (its message names it)
            raise TerminalError(f"format.registry_settings: {e}") from None
        self._cache: dict[Any, Any] = {}  # schema id (Avro) or (type, id) -> the parsed schema

    def schema(self, schema_id: int) -> Any:
        """The parsed Avro writer schema for ``schema_id`` (cached)."""
        import fastavro

        if schema_id not in self._cache:
            self._cache[schema_id] = fastavro.parse_schema(json.loads(self._text(schema_id, "AVRO")))
        return self._cache[schema_id]

    def json_schema(self, schema_id: int) -> dict[str, Any]:
        """The JSON Schema document registered as ``schema_id`` (``schemaType: JSON``; cached), with the schemas it
        refers to (the registry's ``references``: each by name, subject and version) bundled into its ``$defs``, so
        that a ``$ref`` to another registered schema is a local one (``bundle_references``)."""
        key = ("JSON", schema_id)
        if key not in self._cache:
            found = self._registered(schema_id, "JSON")
            doc = _json_document(found.schema_str, f"schema id {schema_id}")
            self._cache[key] = bundle_references(doc, self._referenced(found.references or [], f"schema id {schema_id}"))
        return self._cache[key]

    def _referenced(self, references: list[Any], what: str, depth: int = 0) -> dict[str, dict[str, Any]]:
        """The documents ``references`` name (each by subject and version), their own references bundled: name ->
        document. A reference the registry does not have makes the referring schema unknown."""
        if depth > 32:
            raise UnknownSchemaId(f"{what}: references nest more than 32 deep")
        out = {}
        for ref in references:
            missing = (
                f"{what}: its reference {ref.name!r} (subject {ref.subject!r} version {ref.version}) is not in the registry {self.url}"
            )
            with self._asking(f"a reference of {what}", missing):
                registered = self._client.get_version(ref.subject, ref.version)
            sub = _json_document(registered.schema.schema_str, f"{what}'s reference {ref.name!r}")
            out[ref.name] = bundle_references(sub, self._referenced(registered.schema.references or [], what, depth + 1))
        return out

    def protobuf(self, schema_id: int) -> tuple[Any, Any]:
        """The Protobuf schema registered as ``schema_id`` (``schemaType: PROTOBUF``; cached): its descriptor pool, with
        the files it imports fetched by their subject and version (the registry's ``references``, resolved by
        confluent-kafka's own resolver), and its file descriptor."""
        key = ("PROTOBUF", schema_id)
        if key not in self._cache:
            found = self._registered(schema_id, "PROTOBUF", fmt="serialized")
            try:
                self._cache[key] = file_of(found, self._client, f"schema-{schema_id}.proto")
            except (TypeError, ValueError) as e:  # not a serialized FileDescriptorProto, or an import it cannot resolve
                raise UnknownSchemaId(f"schema id {schema_id} is not a usable Protobuf schema: {e}") from None
        return self._cache[key]

    def _text(self, schema_id: int, kind: str) -> str:
        """The registered schema's text, which must be of ``kind`` (the registry's ``schemaType``; Avro when absent)."""
        return str(self._registered(schema_id, kind).schema_str)

    @contextmanager
    def _asking(self, what: str, missing: str) -> Iterator[None]:
        """One request to the registry, its failures as Tidewater's errors: 404 an unknown schema (``missing``), 401
        and 403 refused credentials (terminal), other answers and transport failures transient."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            yield
        except SchemaRegistryError as e:
            if e.http_status_code == 404:
                raise UnknownSchemaId(missing) from None
            if e.http_status_code in (401, 403):
                raise TerminalError(
                    f"schema registry {self.url} refused the credentials (HTTP {e.http_status_code}); "
                    "check format.registry_basic_auth / format.registry_settings"
                ) from None
            raise TransientError(f"schema registry {self.url} answered HTTP {e.http_status_code} for {what}") from None
        except Exception as e:  # noqa: BLE001 - the client's transport errors (refused, timeouts, TLS): no common base
            raise TransientError(f"schema registry {self.url} unreachable: {type(e).__name__}") from None

    def _registered(self, schema_id: int, kind: str, fmt: str | None = None) -> Any:
        """The registered schema (confluent-kafka's ``Schema``), which must be of ``kind``; ``fmt``: the registry's
        ``format`` (``serialized``: a Protobuf schema as a base64 ``FileDescriptorProto``)."""
        with self._asking(f"schema id {schema_id}", f"schema id {schema_id} is not in the registry {self.url}"):
            found = self._client.get_schema(schema_id, fmt=fmt)
        if (found.schema_type or "AVRO") != kind:
            raise UnknownSchemaId(f"schema id {schema_id} is a {found.schema_type} schema, not {kind}")
        return found


def _json_document(text: Any, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(str(text))
    except json.JSONDecodeError as e:
        raise UnknownSchemaId(f"{what} is not a JSON document: {e}") from None
    if not isinstance(doc, dict):
        raise UnknownSchemaId(f"{what} is not a JSON Schema object")
    return doc


def bundle_references(doc: dict[str, Any], referenced: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``doc`` with each referenced document (by the name its ``$ref`` uses: ``address.json``, or
    ``address.json#/definitions/street`` for a part of it) copied under ``$defs`` and the references rewritten as
    local ones; the referenced document's own local references are rewritten to point inside its copy. Bundling as
    JSON Schema 2020-12 describes it, done here because the table mapping follows local references only."""
    if not referenced:
        return doc
    keys = {name: "ref:" + name.replace("/", "|").replace("~", "-") for name in referenced}

    def rewritten(node: Any, inside: str | None) -> Any:
        if isinstance(node, list):
            return [rewritten(v, inside) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: rewritten(v, inside) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str):
            name, _, fragment = ref.partition("#")
            if name in keys:
                out["$ref"] = f"#/$defs/{keys[name]}{fragment}"
            elif not name and inside is not None:  # a local reference inside a referenced document
                out["$ref"] = f"#/$defs/{inside}{fragment}"
        return out

    out = rewritten(doc, None)
    defs = dict(out.get("$defs") or {})
    for name, sub in referenced.items():
        defs[keys[name]] = rewritten(sub, keys[name])
    out["$defs"] = defs
    return out


def file_of(schema: Any, client: Any, name: str) -> tuple[Any, Any]:
    """A descriptor pool holding the registered ``schema`` (a base64 ``FileDescriptorProto``) and the files it imports,
    and the schema's file descriptor. The well-known types (``google/protobuf/*.proto``) come from protobuf itself."""
    from confluent_kafka.schema_registry._sync.protobuf import _resolve_named_schema  # the deserializer's resolver (the synchronous one)
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message import DecodeError

    pool = descriptor_pool.DescriptorPool()
    for module in _well_known():
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    try:
        _resolve_named_schema(schema, client, pool)
    except SchemaRegistryError as e:
        if e.http_status_code == 404:
            raise ValueError(f"an imported schema is not in the registry ({e})") from None
        raise TransientError(f"schema registry answered HTTP {e.http_status_code} for an imported schema") from None
    except (TypeError, ValueError):
        raise  # a reference without a subject or version, or an import that is not a descriptor: the caller's
    except Exception as e:  # noqa: BLE001 - connection refused, timeouts, TLS: the client's transport errors
        raise TransientError(f"schema registry unreachable while fetching an imported schema: {type(e).__name__}") from None
    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(base64.standard_b64decode(str(schema.schema_str).encode("ascii")))
    except (DecodeError, ValueError) as e:
        raise ValueError(f"not a serialized FileDescriptorProto ({type(e).__name__})") from None
    proto.name = name
    pool.Add(proto)
    return pool, pool.FindFileByName(name)


def _well_known() -> list[Any]:
    from google.protobuf import (
        any_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    return [any_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2]
