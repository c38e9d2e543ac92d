"""The catalog side of decoding: a loader per column type, the key of each table.

pgoutput sends each value as its type's text output; psycopg already parses that for every
built-in type, so walflow never parses a type by hand. This module adds, on the catalog's own
connection (not globally):

- **custom types** resolved by OID (a domain loads as its base type, arrays of custom types
  over their element's effective type, custom ranges registered, enums as strings; anything
  else as its text);
- **values as Sequin publishes them** (a Sequin consumer must read the same JSON): bytea,
  ranges, multiranges, oidvector, int2vector, inet and cidr as Postgres's own text, intervals
  as ``{"months", "days", "microseconds"}`` (:class:`IntervalLoader`), pgvector's ``vector``
  as a list of floats (:class:`PgvectorLoader`);
- **json/jsonb** through orjson where it gives what ``json.loads`` gives, else as
  :class:`core.events.JsonText` (:func:`json_loads`);
- **partitions** described as their parent table, as Sequin reports them.

:class:`Catalog` decides a type OID's loader once per OID per run, and a table's key (what
groups its changes, so that one row's changes stay in order): the replica identity's columns;
under REPLICA IDENTITY FULL the primary key, kept for the run; else the whole table is one
group, with one warning saying why.

Values a loader cannot represent (``infinity`` dates, BC timestamps) are not this module's
concern: :mod:`transforms.convert` falls back to their text. The order in which a loader is
chosen, and the key's rules in full: ``docs/design.md``, *connectors/postgres/types.py*.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, NamedTuple, cast

import orjson
import psycopg
from psycopg import pq
from psycopg.abc import AdaptContext, Buffer
from psycopg.abc import Transformer as TransformerLike
from psycopg.adapt import AdaptersMap, Transformer
from psycopg.adapt import Loader as PsycopgLoader
from psycopg.types import TypeInfo
from psycopg.types.array import register_array
from psycopg.types.json import JsonLoadsFunction, set_json_loads
from psycopg.types.string import TextLoader

from connectors.postgres.protocol import PG_EPOCH, pg_timestamp
from connectors.postgres.relations import Relation, TypeName
from core.events import JsonText, Loader, Table

log = logging.getLogger("walflow.postgres.types")

#: The deepest document loaded as Python values: orjson writes at most 254 levels, and a value
#: sits inside a row (one level) and maybe an array of up to 6 dimensions; deeper documents
#: are carried as their text.
MAX_JSON_DEPTH: Final = 240
#: What json_loads looks for in a document (see there): digits as ``0``, ``[`` and ``{`` as ``[``.
_SCAN: Final = bytes(48 if 48 <= b <= 57 else 91 if b in (91, 123) else 32 for b in range(256))
#: orjson returns a float for an integer beyond 64 bits, which has at least 19 digits.
_DIGITS_19: Final = b"0" * 19
#: Fewer bytes than this cannot nest deeper than MAX_JSON_DEPTH (each level takes two).
_SHALLOW: Final = 2 * (MAX_JSON_DEPTH + 1)
#: A surrogate escape without its other half (``json.loads`` keeps it; nothing writes it as UTF-8).
_LONE_SURROGATE: Final = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_JSON_OIDS: Final = frozenset({114, 3802})  # json, jsonb
_TIMESTAMPTZ_OID: Final = 1184
_INTERVAL_OID: Final = 1186
_TEXT_ARRAY_OID: Final = 1009
#: What a loader raises for a value Python cannot hold (as in transforms.convert).
_UNLOADABLE: Final = (psycopg.DataError, ValueError, OverflowError)
#: Loaded as their text: inet, cidr (see above); bytea, int2vector, oidvector; the built-in
#: ranges (int4, num, ts, tstz, date, int8) and multiranges.
_TEXT_OIDS: Final = (869, 650, 17, 22, 30, 3904, 3906, 3908, 3910, 3912, 3926, 4451, 4532, 4533, 4534, 4535, 4536)
#: OIDs below this are assigned by initdb's catalog data (FirstGenbkiObjectId): built-in.
_FIRST_GENBKI_OID: Final = 10000
#: pgoutput sends pg_catalog as an empty namespace (logicalrep_write_namespace).
_PG_CATALOG: Final = frozenset({"", "pg_catalog"})

_PRIMARY_KEY_QUERY = """
SELECT a.attname
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary AND k.ord <= i.indnkeyatts
ORDER BY k.ord
"""

#: A partition's parent (Sequin's query: the immediate parent, also for inheritance children).
_TYPE_NAMES_QUERY = """
SELECT format_type(t.oid, t.typmod) FROM unnest(%s::oid[], %s::int4[]) WITH ORDINALITY AS t(oid, typmod, i) ORDER BY t.i
"""
#: pgoutput's replica identity letters, as ``ALTER TABLE … REPLICA IDENTITY`` words them.
_REPLICA_IDENTITY_NAMES: Final = {"d": "default", "n": "nothing", "f": "full", "i": "index"}
_PARENT_QUERY = """
SELECT pn.nspname, pc.relname
FROM pg_inherits i JOIN pg_class pc ON pc.oid = i.inhparent JOIN pg_namespace pn ON pn.oid = pc.relnamespace
WHERE i.inhrelid = %s
"""

_CATALOG_QUERY = (
    "SELECT typtype, typbasetype, typelem, typcategory, typdelim, oid::regtype::text FROM pg_type WHERE oid = %s"
)


def json_loads(data: bytes) -> Any:
    """A json or jsonb value from Postgres's text: what ``json.loads`` returns, through orjson
    where that is the same, or a :class:`core.events.JsonText` of the text where Python's
    values cannot carry it exactly.

    One ``translate`` finds what needs more than orjson: 19 digits in a row (orjson returns a
    float for an integer beyond 64 bits: such a document goes to ``json.loads``, string
    contents included, to be sure) and the brackets that could nest deeper than
    :data:`MAX_JSON_DEPTH` (fewer than ``_SHALLOW`` bytes cannot). A JsonText is what orjson
    refuses (nested deeper than it reads, a number beyond a double, a lone surrogate escape:
    Postgres printed the text, so it is JSON), what it could not write inside a row
    (:func:`_too_deep`), and what ``json.loads`` would read inexactly. Nothing is measured on
    the common path: a small document costs the ``translate``, an ``in`` and orjson.

    **Any depth Postgres accepts.** jsonb and json have no depth limit; orjson reads 1,024
    levels and writes 254, Python's parser stops near 1,000 (``RecursionError``). A deeper
    document is published as its text, as it is (the envelope embeds it); shaping sees the
    ``JsonText`` (a condition's or a transform's path cannot look inside it).
    """
    scanned = data.translate(_SCAN)
    # find, not ``in``: CPython's bytes ``in`` tries its operand as an int first, and raises and
    # clears a TypeError (its message formatted) for every bytes operand: twice the cost
    if scanned.find(_DIGITS_19) < 0:
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:  # Postgres printed it, so it is JSON that orjson refuses
            return JsonText(data)
        if len(data) < _SHALLOW or scanned.count(b"[") <= MAX_JSON_DEPTH or not _too_deep(value):
            return value
        return JsonText(data)
    return _long_integers(data, scanned)


def _long_integers(data: bytes, scanned: bytes) -> Any:
    """:func:`json_loads` of a document with 19 digits in a row, through ``json.loads``: its
    integers exact. Which of them is a JsonText: one that may nest too deep and does (orjson
    tells, as above; a document orjson refuses is one too), one with a lone surrogate escape
    (``json.loads`` keeps it in a str no encoder writes) or a number beyond a double."""
    if len(data) >= _SHALLOW and scanned.count(b"[") > MAX_JSON_DEPTH:
        try:
            shape = orjson.loads(data)
        except orjson.JSONDecodeError:
            return JsonText(data)
        if _too_deep(shape):
            return JsonText(data)
    if _LONE_SURROGATE.search(data) is not None:
        return JsonText(data)
    try:
        return json.loads(data, parse_float=_finite, parse_constant=_finite)
    except ValueError:
        return JsonText(data)


def _too_deep(value: Any) -> bool:
    """Whether orjson could not write ``value`` with 14 levels around it (a row, up to 6 array
    dimensions, and room to spare): nested deeper than MAX_JSON_DEPTH. orjson's C walk, not
    one of Python's: only a document with that many brackets is asked."""
    for _ in range(254 - MAX_JSON_DEPTH):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:  # the only one a value orjson read can raise: its depth
        return True
    return False


def _finite(text: str) -> float:
    """A JSON number as ``json.loads`` reads it, refusing infinity (``1e400``): a double cannot hold it."""
    value = float(text)
    if math.isinf(value) or math.isnan(value):
        raise ValueError("not a finite double")
    return value


_INTERVAL: Final = re.compile(
    rb"(?:([-+]?\d+) years? ?)?(?:([-+]?\d+) mons? ?)?(?:([-+]?\d+) days? ?)?(?:([-+])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
)


class IntervalLoader(PsycopgLoader):
    """An interval's text (IntervalStyle ``postgres``, pinned on both connections) as
    ``{"months", "days", "microseconds"}``: the three fields Postgres stores, as Sequin
    publishes them. Years count 12 months; the time is exact (no float in between)."""

    def load(self, data: Buffer) -> dict[str, int]:
        match = _INTERVAL.fullmatch(bytes(data))
        if match is None:
            raise psycopg.DataError(f"can't parse interval {bytes(data)!r}")
        years, months, days, sign, hours, minutes, seconds, fraction = match.groups()
        micros = 0
        if hours is not None:
            micros = ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1_000_000
            if fraction:
                micros += int(fraction.ljust(6, b"0"))
            if sign == b"-":
                micros = -micros
        return {
            "months": int(years or 0) * 12 + int(months or 0),
            "days": int(days or 0),
            "microseconds": micros,
        }


class PgvectorLoader(PsycopgLoader):
    """pgvector's ``vector`` (``[1,2.5,3]``) as a list of floats, as Sequin's value caster
    reads it (``1`` is ``1.0``: the elements are float4)."""

    def load(self, data: Buffer) -> list[float]:
        inner = bytes(data).strip()[1:-1]
        return [float(item) for item in inner.split(b",")] if inner.strip() else []


def _element_wise(whole: Loader, split: Loader, element: Loader) -> Loader:
    """An array loader that, when an element cannot be loaded (``infinity`` in a ``date[]``),
    loads the others and keeps that one as its text, as Sequin's value caster does per
    element. The whole array is parsed by psycopg first: only a failing one is split."""

    def one(text: str) -> Any:
        try:
            return element(text.encode())
        except _UNLOADABLE:
            return text

    def each(values: list[Any]) -> list[Any]:
        return [None if v is None else each(v) if type(v) is list else one(v) for v in values]

    def load(data: bytes) -> Any:
        try:
            return whole(data)
        except _UNLOADABLE:
            return each(split(data))

    return load


def _register_loaders(context: AdaptContext) -> None:
    """The loaders walflow wants instead of psycopg's defaults, on ``context`` only (a
    connection, or a process's own map in :func:`loaders_for`). Arrays of these types
    (psycopg knows their OIDs) pick up the element loaders from the same map."""
    # psycopg's json loaders hand over bytes (a memoryview is copied first), which json_loads takes
    set_json_loads(cast(JsonLoadsFunction, json_loads), context)
    context.adapters.register_loader(_INTERVAL_OID, IntervalLoader)
    for oid in _TEXT_OIDS:
        context.adapters.register_loader(oid, TextLoader)


class Registration(NamedTuple):
    """A loader the catalog registered for a custom type OID, as plain data, to repeat in
    another process: an array over its element's effective type (``element``, ``delimiter``)
    or pgvector's ``vector``."""

    kind: str  # "array" | "vector"
    oid: int
    name: str
    element: int = 0
    delimiter: str = ","

    def apply(self, context: AdaptContext) -> None:
        if self.kind == "array":
            register_array(TypeInfo(self.name, self.element, self.oid, delimiter=self.delimiter), context)
        else:
            context.adapters.register_loader(self.oid, PgvectorLoader)


class TypeSpecs(NamedTuple):
    """What a table's loaders are made of (:attr:`core.events.Table.types`): each column's
    effective type OID, and the registrations those need. Plain data: it pickles, and
    :func:`loaders_for` makes the same loaders from it in any process, without a connection."""

    effective: tuple[int, ...]
    registrations: tuple[Registration, ...]


def _loader(tx: TransformerLike, effective: int, effective_of: Callable[[int], int]) -> Loader:
    """The loader for values of the effective type OID ``effective`` (an array's elements
    through ``effective_of``)."""
    if effective in _JSON_OIDS:
        return json_loads  # what psycopg's text json loader does with the bytes it gets, one call shorter
    found = tx.get_loader(effective, pq.Format.TEXT)
    load: Loader = found.load
    element = getattr(type(found), "base_oid", None)
    if element is None or getattr(found, "delimiter", b",") != b",":
        return load
    split: Loader = tx.get_loader(_TEXT_ARRAY_OID, pq.Format.TEXT).load
    element_oid = effective_of(element)
    return _element_wise(load, split, _loader(tx, element_oid, effective_of))


@functools.lru_cache(maxsize=256)
def loaders_for(types: TypeSpecs) -> tuple[Loader, ...]:
    """A table's loaders in a process other than its reader's (a sink partition past the
    exchange): the catalog's own registrations repeated on a map of this process's, so
    every value converts as the reader's process would have converted it. Cached per
    distinct table shape: every partition receives each table version."""
    adapters = AdaptersMap(psycopg.adapters)
    _register_loaders(adapters)
    for registration in types.registrations:
        registration.apply(adapters)
    tx = Transformer(adapters)
    return tuple(_loader(tx, oid, _same) for oid in types.effective)


def _same(oid: int) -> int:
    return oid  # TypeSpecs hold effective OIDs already


def _commit_time(raw: bytes) -> datetime:
    try:
        return pg_timestamp(int.from_bytes(raw, signed=True))
    except OverflowError:
        raise psycopg.DataError("commit time out of range") from None


class Catalog:
    """Loaders by type OID and tables by relation, looked up once each on a normal connection.

    The decoder calls :meth:`type_seen` for each Type message and :meth:`describe` for each
    Relation message, in the order they arrive (pgoutput sends a relation's Type messages
    before it), and reads :attr:`commit_time` once.
    """

    def __init__(self, conn: psycopg.Connection[Any], keys: dict[int, tuple[str, ...]] | None = None,
                 database: str = "") -> None:
        """``conn``: a normal connection made by :func:`~connectors.postgres.connection.conninfo`
        (its pinned settings), used by the catalog alone: the loaders above are registered on it.
        ``keys``: the key columns used per relation so far in this run, shared by the run's
        sessions (a reconnect must not change which partition a row goes to).
        ``database``: the configured name its tables belong to."""
        self._conn = conn
        self._database = database
        #: Custom type OID → the loader registered for it, to repeat elsewhere (TypeSpecs).
        self._registrations: dict[int, Registration] = {}
        _register_loaders(conn)
        self._tx = Transformer(conn)
        self._effective: dict[int, int] = {}
        #: Type OID → (namespace, name) of its base type, as pgoutput's Type messages said.
        self._type_names: dict[int, tuple[str, str]] = {}
        #: Relation OID → the key columns used for it in this run (``()``: one group).
        self._keys: dict[int, tuple[str, ...]] = {} if keys is None else keys
        self._commit_time: Callable[[bytes], datetime] | None = None

    def type_seen(self, type_name: TypeName) -> None:
        """pgoutput named a custom type (for a domain, its base type) before the relation that uses it."""
        named = (type_name.namespace, type_name.name)
        if self._type_names.get(type_name.oid, named) != named:
            self._effective.pop(type_name.oid, None)  # the OID names another type now: resolve it again
        self._type_names[type_name.oid] = named

    def describe(self, relation: Relation) -> Table:
        """The :class:`Table` that the changes following ``relation`` are read with."""
        identity = tuple(c.name for c in relation.columns if c.is_key)
        if relation.replica_identity == "f":  # every column is flagged: the key is not in the message
            keys = self._full_key(relation)
        else:
            keys = identity
        self._keys[relation.relid] = keys
        schema, name = self._reported_name(relation)
        return Table(
            schema=schema,
            name=name,
            columns=tuple(c.name for c in relation.columns),
            key_columns=keys,
            identity_columns=identity,
            loaders=tuple(self.loader(c.type_oid) for c in relation.columns),
            database=self._database,
            relid=relation.relid,
            rebuild=loaders_for,
            types=self._specs(relation),
            type_names=self._type_names_of(relation),
            replica_identity=_REPLICA_IDENTITY_NAMES.get(relation.replica_identity, relation.replica_identity),
        )

    def _type_names_of(self, relation: Relation) -> tuple[str, ...]:
        """Each column's type as ``format_type`` names it with its modifier, in one query: what a
        schema event reports (``transforms/schema_events.py``)."""
        rows = self._conn.execute(_TYPE_NAMES_QUERY, [[c.type_oid for c in relation.columns],
                                                      [c.typmod for c in relation.columns]]).fetchall()
        return tuple(str(row[0]) for row in rows)

    def _specs(self, relation: Relation) -> TypeSpecs:
        """The relation's columns' types as :class:`TypeSpecs` (after :meth:`loader` resolved them)."""
        effective = tuple(self.effective_oid(c.type_oid) for c in relation.columns)
        needed: dict[int, Registration] = {}
        pending = list(effective)
        while pending:  # an array's element may be registered too (an array of vectors)
            registration = self._registrations.get(pending.pop())
            if registration is not None and registration.oid not in needed:
                needed[registration.oid] = registration
                if registration.kind == "array":
                    pending.append(registration.element)
        return TypeSpecs(effective, tuple(needed.values()))

    def _reported_name(self, relation: Relation) -> tuple[str, str]:
        """The relation's schema and name, or its parent's if it is a partition (one parent
        only: with several, its own), read from the current catalog as Sequin does."""
        parents = self._conn.execute(_PARENT_QUERY, [relation.relid]).fetchall()
        if len(parents) == 1:
            return str(parents[0][0]), str(parents[0][1])
        return relation.namespace or "pg_catalog", relation.name

    def _full_key(self, relation: Relation) -> tuple[str, ...]:
        """The key of a REPLICA IDENTITY FULL relation: see the module docstring."""
        columns = {c.name for c in relation.columns}
        previous = self._keys.get(relation.relid)
        if previous is not None:
            if all(name in columns for name in previous):
                return previous  # also () : a relation that is one group stays one group
            why = f"its key columns ({', '.join(previous)}) are no longer all among its columns"
        else:
            rows = self._conn.execute(_PRIMARY_KEY_QUERY, [relation.relid]).fetchall()
            primary = tuple(str(name) for (name,) in rows)
            if primary and all(name in columns for name in primary):
                return primary
            if primary:
                why = f"its primary key ({', '.join(primary)}) is not among its published columns"
            else:
                why = "it has no primary key in the catalog (it has none, or it was dropped before walflow read its changes)"
        log.warning(
            "table %s.%s (REPLICA IDENTITY FULL): its changes are kept in order as one group, because %s",
            relation.namespace or "pg_catalog",
            relation.name,
            why,
        )
        return ()

    def loader(self, oid: int) -> Loader:
        """What converts a value of type ``oid`` from its text."""
        return _loader(self._tx, self.effective_oid(oid), self.effective_oid)

    def effective_oid(self, oid: int) -> int:
        """The OID whose loader parses values of ``oid`` (itself if psycopg knows it)."""
        if oid not in self._effective:
            self._effective[oid] = self._resolve(oid)
        return self._effective[oid]

    def _resolve(self, oid: int) -> int:
        """The rule of the module docstring, in its order."""
        if self._conn.adapters.get_loader(oid, pq.Format.TEXT) is not None:
            return oid
        named = self._builtin(oid)
        if named is not None:
            return named
        row = self._conn.execute(_CATALOG_QUERY, [oid]).fetchone()
        if row is None:
            log.warning("type OID %s is not in pg_type; its values are passed as text", oid)
            return oid
        typtype, base, elem, category, delimiter, name = row
        if typtype == "d":  # a domain is stored and printed as its base type
            return self.effective_oid(base)
        if category == "A" and elem:
            element = self.effective_oid(elem)
            registration = Registration("array", oid, name, element, delimiter)
        elif typtype == "b" and name.rpartition(".")[2] == "vector":  # pgvector, wherever it was installed
            registration = Registration("vector", oid, name)
        else:
            return oid  # enums load as their label (str); ranges, composites and others as their text
        registration.apply(self._conn)
        self._registrations[oid] = registration
        return oid

    def _builtin(self, oid: int) -> int | None:
        """The built-in type a Type message named for ``oid``, if psycopg knows it by name."""
        namespace, name = self._type_names.get(oid, (None, ""))
        if namespace not in _PG_CATALOG:
            return None
        array = name.startswith("_")  # a built-in array type is named _ + its element's name
        info = self._conn.adapters.types.get(name[1:] if array else name)
        if info is None or info.oid >= _FIRST_GENBKI_OID or info.name != (name[1:] if array else name):
            return None
        found = info.array_oid if array else info.oid
        return found or None

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
