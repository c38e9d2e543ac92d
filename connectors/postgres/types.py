"""The catalog side of decoding: a loader per column type, the key of each table.

pgoutput sends each value as its type's text output; psycopg already knows how to parse
that for every built-in type, so walflow never parses a type by hand. What this adds:

- **Custom types** are resolved by OID on a normal connection (the replication connection
  cannot run parameterised queries): a domain loads as its base type, an array of a
  domain/enum/custom type gets an array loader over the element's effective type, custom
  ranges are registered, enums stay strings. Anything else falls back to its text.
- **json/jsonb** load with orjson where it gives what ``json.loads`` gives (about 7x faster
  for small documents): see :func:`json_loads`.
- **The key** of a table under REPLICA IDENTITY FULL (which flags every column) is its
  primary key, read from the catalog.

Values a loader cannot represent (``infinity`` dates, BC timestamps) are not this module's
concern: :mod:`transforms.convert` falls back to their text.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

import orjson
import psycopg
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.types import TypeInfo
from psycopg.types.array import register_array
from psycopg.types.json import set_json_loads
from psycopg.types.range import RangeInfo, register_range

from connectors.postgres.protocol import PG_EPOCH, pg_timestamp
from connectors.postgres.relations import Relation, TypeName
from core.events import Loader, Table

log = logging.getLogger("walflow.postgres.types")

#: orjson returns a float for an integer beyond 64 bits, which has at least 19 digits.
_LONG_DIGITS: Final = re.compile(rb"\d{19}")
_JSON_OIDS: Final = frozenset({114, 3802})  # json, jsonb
_TIMESTAMPTZ_OID: Final = 1184

_PRIMARY_KEY_QUERY = """
SELECT a.attname
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY k.ord
"""

_CATALOG_QUERY = (
    "SELECT typtype, typbasetype, typelem, typcategory, typdelim, oid::regtype::text FROM pg_type WHERE oid = %s"
)


def json_loads(data: str | bytes) -> Any:
    """What ``json.loads`` returns, through orjson where that is the same.

    orjson differs in two ways: it returns a float for an integer beyond 64 bits (a
    document with 19 digits in a row goes to ``json.loads``, string contents included, to
    be sure), and it refuses what ``json.loads`` accepts (``NaN``, ``1e400``, lone
    surrogates in json, a BOM): those are parsed again by ``json.loads``, which then returns
    or raises exactly what it always did.
    """
    if type(data) is bytes and _LONG_DIGITS.search(data) is None:  # psycopg passes bytes
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def _commit_time(raw: bytes) -> datetime:
    try:
        return pg_timestamp(int.from_bytes(raw, signed=True))
    except OverflowError:
        raise psycopg.DataError("commit time out of range") from None


class Catalog:
    """Loaders by type OID and tables by relation, looked up once each on a normal connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        set_json_loads(json_loads, conn)
        self._tx = Transformer(conn)
        self._effective: dict[int, int] = {}
        self._commit_time: Callable[[bytes], datetime] | None = None

    def type_seen(self, type_name: TypeName) -> None:
        """pgoutput named a custom type before the relation that uses it."""

    def describe(self, relation: Relation) -> Table:
        """The :class:`Table` that the changes following ``relation`` are read with."""
        identity = tuple(c.name for c in relation.columns if c.is_key)
        if relation.replica_identity == "f":  # every column is flagged: ask for the primary key
            rows = self._conn.execute(_PRIMARY_KEY_QUERY, [relation.relid]).fetchall()
            keys = tuple(str(name) for (name,) in rows)
        else:
            keys = identity
        return Table(
            schema=relation.namespace or "pg_catalog",
            name=relation.name,
            columns=tuple(c.name for c in relation.columns),
            key_columns=keys,
            identity_columns=identity,
            loaders=tuple(self.loader(c.type_oid) for c in relation.columns),
        )

    def loader(self, oid: int) -> Loader:
        """What converts a value of type ``oid`` from its text."""
        effective = self.effective_oid(oid)
        if effective in _JSON_OIDS:
            return json_loads  # what psycopg's text json loader does with the bytes it gets, one call shorter
        load: Loader = self._tx.get_loader(effective, pq.Format.TEXT).load
        return load

    def effective_oid(self, oid: int) -> int:
        """The OID whose loader parses values of ``oid`` (itself if psycopg knows it)."""
        if oid not in self._effective:
            self._effective[oid] = self._resolve(oid)
        return self._effective[oid]

    def _resolve(self, oid: int) -> int:
        if self._conn.adapters.get_loader(oid, pq.Format.TEXT) is not None:
            return oid
        row = self._conn.execute(_CATALOG_QUERY, [oid]).fetchone()
        if row is None:
            log.warning("type OID %s is not in pg_type; its values are passed as text", oid)
            return oid
        typtype, base, elem, category, delimiter, name = row
        if typtype == "d":  # a domain is stored and printed as its base type
            return self.effective_oid(base)
        if category == "A" and elem:
            element = self.effective_oid(elem)
            info = TypeInfo(name, element, oid, delimiter=delimiter)
            register_array(info, self._conn)
            return oid
        if typtype == "r":
            range_info = RangeInfo.fetch(self._conn, name)
            if range_info is not None:
                register_range(range_info, self._conn)
                return oid
        return oid  # enums load as their label (str); composites and others as their text

    @property
    def commit_time(self) -> Callable[[bytes], datetime]:
        """Commit times as pgoutput sends them (8 bytes, binary timestamptz) to what
        :func:`~connectors.postgres.protocol.pg_timestamp` returns: psycopg's binary
        timestamptz loader, which is faster, if its datetimes are in UTC as they should be
        (the connection's TimeZone is pinned to UTC), else ``pg_timestamp``. Out of range:
        ``psycopg.DataError``."""
        if self._commit_time is None:
            load: Callable[[bytes], datetime] = self._tx.get_loader(_TIMESTAMPTZ_OID, pq.Format.BINARY).load
            probe = load(bytes(8))
            utc = probe == PG_EPOCH and probe.tzinfo is PG_EPOCH.tzinfo
            self._commit_time = load if utc else _commit_time
        return self._commit_time
