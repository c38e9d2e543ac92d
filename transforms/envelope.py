"""The envelope: one change as Sequin's JSON payload and its idempotency id, a :class:`core.message.Message`.

The envelope addresses the message too: its default subject (:func:`core.subjects.subject`)
and its metrics' labels, cached per table and action with the payload's head; routing may
give it another (``transforms/render.py``). The payload is exactly what Sequin publishes
(README, "What lands in JetStream"), so Sequin consumers keep working::

    {"record": {...}, "changes": {...} | null, "action": "insert" | "update" | "delete" | "read",
     "metadata": {"database_name", "table_schema", "table_name", "commit_timestamp",
                  "commit_lsn", "commit_idx", "idempotency_key", "record_pks",
                  "transaction_annotations", "enrichment",
                  "consumer": {"id", "name", "annotations"},
                  "database": {"id", "name", "annotations", "database", "hostname"}}}

Contract: ``record`` is the new row (the old one for a delete), ``changes`` the old values
that differ (``{}`` for an update without an old row, ``null`` otherwise), unchanged TOAST
as ``"unchanged_toast"``, an oversized value as ``"__walflow_oversized_value:<bytes>"``;
values as Sequin writes them. Two encoders (orjson, and pydantic-core's as the exact one)
write the same bytes for every row; a row orjson would write differently takes the exact
one. :meth:`Envelope.shaped` writes shaped parts with the same encoders, head and tail, so
unchanged parts give ``__call__``'s bytes exactly. The idempotency key (also the
``Nats-Msg-Id``) is :class:`core.ids.IdScheme`'s id of the change, the same on every replay.
The rules value by value, and why two encoders: docs/design.md, ``transforms/envelope.py``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final

import orjson
from pydantic_core import PydanticSerializationError, to_json

from config.schema import DatabaseConfig, SinkConfig
from connectors.postgres.types import json_loads
from core.events import UNCHANGED_TOAST, UNCHANGED_TOAST_MARKER, Change, JsonText, OversizedValue, Row, UnchangedToast
from core.ids import IdScheme
from core.jsontext import is_json
from core.message import Message
from core.once import warn_once
from core.subjects import subject as default_subject
from transforms.record import changed_values

log = logging.getLogger("walflow.envelope")

_US: Final = timedelta(microseconds=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH: Final = datetime(1970, 1, 1)
#: Where the derived ids of consumers and databases live (uuid5 names below it).
_ID_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/walflow/walflow")
_ZERO: Final = timedelta(0)
#: The types a row's values have that hold no timestamp (checked first, by exact type), and those that may.
_TIMELESS: Final = frozenset({str, int, float, bool, type(None), Decimal, dict, date, uuid.UUID, JsonText,
                              UnchangedToast, OversizedValue})
_TIMED: Final = (datetime, time, list, tuple)
#: The classes and the zone _inexact_times compares with, as constants: compiled (mypyc), a name
#: imported from another module is looked up in the module's dict at every use.
_DATETIME: Final = datetime
_TIME: Final = time
_UTC: Final = UTC


def _inexact_times(values: Iterable[Any]) -> bool:
    """Whether orjson (``OPT_UTC_Z``) writes one of a row's timestamps or times (in an array too)
    otherwise than the exact encoder: whole seconds (no fraction, where the exact encoder writes
    six digits), any offset but UTC's (orjson rounds a seconds offset the exact encoder
    truncates; both are rare enough to send every such row the exact way), or a time of
    10,000-99,999 microseconds (orjson 3.11 writes five digits: ``00:00:00.01000``). Checked on
    the values, not found in the output: a pattern searched through each row's JSON cost ten
    times more. ``tests/transforms/test_envelope.py`` holds it to orjson's output of every
    microsecond and offset kind."""
    stamp, clock, utc, timeless = _DATETIME, _TIME, _UTC, _TIMELESS  # locals: no lookup per value
    for value in values:
        kind = type(value)
        if kind is stamp:
            if value.microsecond == 0:
                return True
            zone = value.tzinfo
            if zone is not None and zone is not utc and value.utcoffset() != _ZERO:
                return True
        elif kind is str or kind is int or kind in timeless:  # the commonest by identity, no set lookup
            continue
        elif kind is clock:  # naive: orjson refuses an aware time (the row takes the exact way)
            fraction = value.microsecond
            if fraction == 0 or 10_000 <= fraction < 100_000:
                return True
        elif kind is list:
            if _inexact_times(value):
                return True
        elif isinstance(value, _TIMED):  # a subclass: the exact way
            return True
    return False


_dumps: Final = orjson.dumps
#: The payload around its parts: record, changes, head (:meth:`Envelope._head`), commit
#: timestamp, commit LSN and index, idempotency key, record_pks, transaction annotations, and
#: the tail from ``"enrichment"`` to the end.
_PAYLOAD: Final = (
    b'{"record":%s,"changes":%s,%s%s,"commit_lsn":%d,"commit_idx":%d,"idempotency_key":"%s",'
    b'"record_pks":%s,"transaction_annotations":%s,%s'
)


def unix_microseconds(value: datetime) -> int:
    """Microseconds since the Unix epoch; a naive datetime (timestamp without time zone) is read as UTC."""
    return (value - (_NAIVE_EPOCH if value.tzinfo is None else _EPOCH)) // _US


def iso_usec(value: datetime) -> str | datetime:
    """ISO 8601 with six fractional digits (``Z`` for UTC), as Sequin writes timestamps.
    ``to_json`` already writes a datetime with a fraction so: only whole seconds are formatted here."""
    if value.microsecond:
        return value
    text = value.isoformat(timespec="microseconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _positional(value: Decimal) -> str:
    return format(value, "f")  # as numeric_out and Jason: never 1E-8


def _unchanged_toast(_: UnchangedToast) -> str:
    return UNCHANGED_TOAST_MARKER


def _oversized(value: OversizedValue) -> str:
    return value.text


def _json(value: Any) -> bytes:
    return to_json(value, inf_nan_mode="strings", fallback=_unknown)


def _unknown(value: Any) -> str:
    """The exact encoder's text of a type it does not know: its ``str``, except a JsonText, which
    is JSON to embed, not a string: refusing it sends the value to :func:`_embedded`."""
    if type(value) is JsonText:
        raise TypeError("embedded JSON")
    return str(value)


def _embedded(value: Any, encode: Callable[[Any], bytes]) -> bytes:
    """``value`` as ``encode`` writes it, except each JsonText in it, written as its text: the
    exact encoder cannot embed JSON, so the dicts, lists and tuples around one are written here,
    as it writes them (compact, keys as JSON strings), at any depth of arrays. Only for a value
    that holds one (or that nests deeper than the encoder writes: a transform's result)."""
    kind = type(value)
    if kind is JsonText:
        text: bytes = value.text
        return text
    parts: list[bytes] = []  # loops, not generators: one frame per level of nesting
    if kind is dict:
        for key, item in value.items():
            parts.append(encode(key) + b":" + _embedded(item, encode))
        return b"{" + b",".join(parts) + b"}"
    if kind is list or kind is tuple:
        for item in value:
            parts.append(_embedded(item, encode))
        return b"[" + b",".join(parts) + b"]"
    return encode(value)


def _default(value: Any) -> Any:
    """What orjson's ``default`` writes for a value it has no encoding of: what the exact
    encoder writes for it; a ``TypeError`` sends the row to the exact encoder."""
    kind = type(value)
    if kind is Decimal:  # str() is 3x format(): the same digits unless it chose an exponent
        text = str(value)
        return text if "E" not in text else _positional(value)
    if kind is UnchangedToast:
        return UNCHANGED_TOAST_MARKER
    if kind is JsonText:  # a document too deep to load: its text, as it is
        return orjson.Fragment(value.text)
    if kind is OversizedValue:
        return value.text
    raise TypeError(kind)


def _default_unix(value: Any) -> Any:
    """:func:`_default` for ``timestamp_format: unix_microsecond``, which hands orjson's
    dates and times here too (``OPT_PASSTHROUGH_DATETIME``)."""
    kind = type(value)
    if kind is datetime:
        return unix_microseconds(value)
    if kind is date or (kind is time and value.tzinfo is None):
        return value.isoformat()  # as pydantic-core writes them (it truncates a time's offset seconds)
    return _default(value)


def _nones(row: Row) -> int:
    return list(row.values()).count(None)


def _fragment_nulls(row: Row) -> int:
    """The ``null`` a row's spliced documents (:class:`JsonText`) write themselves (0 without
    one: one C-level scan of its values' types, only for rows whose JSON holds a ``null``)."""
    if JsonText not in map(type, row.values()):
        return 0
    return sum(value.text.count(b"null") for value in row.values() if type(value) is JsonText)


def _read_annotations(text: bytes) -> Any:
    """A transaction's annotations as Python values, as a json column's load
    (:func:`connectors.postgres.types.json_loads`: a JsonText where Python's values cannot
    carry them); ValueError when the text is not one JSON text, as Sequin's Jason refuses it
    (``NaN``, a trailing comma, not UTF-8, …). Annotations are any text a database role
    writes, and json_loads trusts Postgres's output functions to print JSON: a JsonText is
    embedded only once :func:`core.jsontext.is_json` said so."""
    value = json_loads(text)
    if type(value) is JsonText and not is_json(text):
        raise ValueError("not JSON")
    return value


def _parsed_annotations(text: bytes) -> Any:
    """A transaction's annotations as Python values; None if not JSON (the payload's
    :meth:`Envelope._annotations` warns about it)."""
    try:
        return _read_annotations(text)
    except ValueError:
        return None


class NotJSON(ValueError):
    """A value :func:`encode_json` cannot write: ``what`` it is (``"a set"``) and
    ``where`` in the value (``"['tags'][2]"``; empty for the value itself), so that the caller
    can say which of its values it was."""

    def __init__(self, what: str, where: str = "") -> None:
        super().__init__(f"{what}{' at ' + where if where else ''} is not JSON")
        self.what = what
        self.where = where


def a_type(value: Any) -> str:
    """``value``'s type with its article, for messages: ``"a set"``, ``"an int"``, ``"a mymodule.Box"``."""
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def _copied(value: Any) -> Any:
    """A JSON value's dicts and lists copied (their scalars are immutable): what a callable may change."""
    kind = type(value)
    if kind is dict:
        return {key: _copied(item) for key, item in value.items()}
    if kind is list:
        return [_copied(item) for item in value]
    return value


#: What :func:`_plain` passes as it is, by exact type: to_json writes them as the exact encoder does
#: (a JsonText is embedded by :func:`_embedded`).
_PLAIN: Final = frozenset({str, int, float, bool, type(None), date, time, uuid.UUID, JsonText})


#: The deepest value :func:`encode_json` writes: deeper than anything the source decodes
#: (``MAX_JSON_DEPTH`` levels in a row and an array), and counted, not left to Python's recursion
#: limit, which the compiled module (core/compiled.py) does not have: a value holding itself is
#: refused at this depth in both.
_MAX_NESTING: Final = 500


def _plain(value: Any, unix: bool, depth: int = 0) -> Any:
    """``value`` with what the exact encoder rewrites rewritten (:func:`encode_json`),
    checked to be JSON on the way; ``unix``: datetimes as Unix microseconds."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if depth >= _MAX_NESTING:
        raise RecursionError  # Python's own way out of too deep a value: encode_json words both alike
    depth += 1
    if kind is dict:
        out: dict[str, Any] = {}
        for name, item in value.items():
            if type(name) is not str and not isinstance(name, str):
                raise NotJSON(f"a dict with {a_type(name)} key")  # not its value: it may be a row's
            try:
                out[name] = _plain(item, unix, depth)
            except NotJSON as exc:
                raise NotJSON(exc.what, f"[{name!r}]{exc.where}") from None
        return out
    if kind is list or kind is tuple:
        items: list[Any] = []
        for i, item in enumerate(value):
            try:
                items.append(_plain(item, unix, depth))
            except NotJSON as exc:
                raise NotJSON(exc.what, f"[{i}]{exc.where}") from None
        return items
    if kind is Decimal:
        return _positional(value)
    if kind is datetime:
        return unix_microseconds(value) if unix else iso_usec(value)
    if kind is UnchangedToast:
        return UNCHANGED_TOAST_MARKER
    if kind is OversizedValue:
        return value.text
    # subclasses: an enum's members, an OrderedDict, a named tuple, a datetime of another library
    if isinstance(value, datetime):
        return unix_microseconds(value) if unix else iso_usec(value)
    if isinstance(value, str | int | float | date | time | uuid.UUID):
        return value
    if isinstance(value, dict):
        return _plain(dict(value), unix, depth)
    if isinstance(value, list | tuple):
        return _plain(list(value), unix, depth)
    raise NotJSON(a_type(value))


def encode_json(value: Any, unix: bool = False) -> bytes:
    """Any JSON value (a transform's result, an enrichment row) as the exact encoder writes a
    column's: decimals positional, datetimes with six fractional digits or, with ``unix``
    (``timestamp_format: unix_microsecond``), as microseconds since the epoch, UNCHANGED_TOAST
    as the marker, an OversizedValue as its marker, NaN and the infinities as ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``; dicts, lists and tuples recursively; dates, times, UUIDs
    and subclasses of str, int and float (an enum's members) as the exact encoder writes them;
    a JsonText (a json column too deep for Python's values) as its text. Anything else (a set,
    bytes, an object, a dict key that is not a str, a lone surrogate) raises :class:`NotJSON`,
    never a str() of it: a transform's value is published as its function meant it, or not at all."""
    try:
        plain = _plain(value, unix)
        try:
            return to_json(plain, inf_nan_mode="strings")
        except PydanticSerializationError:  # a JsonText, or nested deeper than to_json writes: in pieces
            return _embedded(plain, _strict_json)
    except PydanticSerializationError as exc:  # what to_json still refuses: text it cannot write as UTF-8
        raise NotJSON("a string holding a lone surrogate (not Unicode)") from exc
    except RecursionError:
        raise NotJSON("a value nested too deep (or holding itself)") from None


def _strict_json(value: Any) -> bytes:
    return to_json(value, inf_nan_mode="strings")


def derived_id(kind: str, *names: str) -> str:
    """A UUID for a consumer or database that the config gives no ``id``: the same for the
    same names, and distinct names never share one (they are joined as a JSON array)."""
    return str(uuid.uuid5(_ID_NAMESPACE, to_json([kind, *names]).decode()))


class Envelope:
    """``envelope`` step of one sink: a change → its Sequin payload and ``Nats-Msg-Id``."""

    def __init__(self, sink: SinkConfig, database: DatabaseConfig) -> None:
        self._database = database.name
        self._ids = IdScheme(database.name, sink.name, sink.destination.msg_id)
        #: ``metadata.consumer`` and ``metadata.database`` (:meth:`metadata` hands out copies).
        self._consumer: dict[str, Any] = {
            "id": sink.id or derived_id("consumer", database.name, sink.name), "name": sink.name,
            "annotations": sink.annotations}
        self._described: dict[str, Any] = {
            "id": database.id or derived_id("database", database.name), "name": database.name,
            "annotations": database.annotations, "database": database.database, "hostname": database.hostname}
        #: The end of every payload after its enrichment: what depends on the sink and database only.
        self._end = b'"consumer":%s,"database":%s}}' % (_json(self._consumer), _json(self._described))
        #: The end of a payload without enrichment.
        self._tail = b'"enrichment":null,' + self._end
        #: Where its messages are published, unrouted (:func:`core.subjects.subject`).
        self._prefix = sink.destination.subject_prefix
        #: (schema, table, action) -> what depends on them only: the payload's text (see _head),
        #: the default subject and the metrics' labels (:class:`core.message.Message`).
        self._heads: dict[tuple[str, str, str], tuple[bytes, bytes, tuple[str, str]]] = {}
        #: Values the exact encoder rewrites before to_json, by exact type; all others pass untouched.
        unix = sink.timestamp_format == "unix_microsecond"
        self._convert: dict[type, Callable[[Any], Any]] = {
            UnchangedToast: _unchanged_toast,
            OversizedValue: _oversized,
            Decimal: _positional,
            datetime: unix_microseconds if unix else iso_usec,
            list: self._list,
        }
        #: orjson's part (see the module's docstring): how it is called, and whether its
        #: output may hold timestamps the exact encoder writes otherwise.
        self._default = _default_unix if unix else _default
        self._options = orjson.OPT_PASSTHROUGH_DATETIME if unix else orjson.OPT_UTC_Z
        self._timestamps = not unix
        self._unix_times = unix  # not _unix: compiled (mypyc), that field is `__unix`, a C macro on Linux
        # The changes of one transaction share their commit timestamp and annotations: render
        # each once. One tuple each, replaced whole, so worker threads sharing this step never
        # pair a stale half.
        self._last_ts: tuple[datetime | None, bytes, float] = (None, b"", 0.0)
        self._last_annotations: tuple[bytes | None, bytes] = (None, b"null")

    def __call__(self, change: Change) -> Message:
        action = change.action
        changes = b"null"
        if action == "delete":
            record = self.encode_row(change.old or {})
        elif action == "insert" or action == "read":
            record = self.encode_row(change.new or {})
        elif action == "update":
            new, old = change.new or {}, change.old
            if old is None:
                record, changes = self.encode_row(new), b"{}"
            else:
                filled = new
                if UNCHANGED_TOAST in new.values():  # REPLICA IDENTITY FULL: the old row has it, detoasted
                    filled = {name: old[name] if value is UNCHANGED_TOAST and name in old else value
                              for name, value in new.items()}
                record, changes = self.encode_row(filled), self.encode_row(changed_values(new, old))
        else:
            raise ValueError(f"a {action} has no payload: SinkFilter must drop it before the envelope")
        lsn, idx = change.commit_lsn, change.commit_idx
        read = change.read
        key = self._ids.encode(lsn, idx) if read is None else self._ids.encode_read(read.backfill, read.row_key)
        parts = self._heads.get((change.schema, change.table, action))
        if parts is None:
            parts = self._head(change.schema, change.table, action)
        head, subject, labels = parts
        _, timestamp, committed = self._commit_time(change.commit_ts)
        payload = _PAYLOAD % (
            record,
            changes,
            head,
            timestamp,
            lsn,
            idx,
            key,
            _dumps(change.pks),
            b"null" if (annotations := change.annotations) is None else self._annotations(annotations),
            self._tail,
        )
        return Message(subject, payload, key.decode("ascii"), labels, committed if read is None else 0.0)

    def key(self, change: Change) -> bytes:
        """``change``'s idempotency key (its ``Nats-Msg-Id``), as ASCII: :class:`core.ids.IdScheme`'s
        id of its position, or of its backfill and row for a read."""
        read = change.read
        if read is None:
            return self._ids.encode(change.commit_lsn, change.commit_idx)
        return self._ids.encode_read(read.backfill, read.row_key)

    def read_key(self, backfill: str, row_key: str) -> bytes:
        """The key of the row ``row_key`` read by backfill ``backfill``: for a read whose key
        columns are masked, render names the row by its masked key (a hashed ``row_key``), so
        that the id does not carry the value the mask hides."""
        return self._ids.encode_read(backfill, row_key)

    def shaped(self, change: Change, record: Row, changes: Row | None, pks: tuple[str, ...], key: bytes,
               enrichment: Any = None) -> bytes:
        """``change``'s Sequin payload from parts render shaped: ``record`` and ``changes`` as
        published (columns renamed, masked; ``record`` TOAST-filled by
        :func:`transforms.record.record_and_changes`, so it is not filled here: an
        UNCHANGED_TOAST it still holds is written as the marker), ``pks`` as ``record_pks``,
        ``key`` as ``idempotency_key`` (:meth:`key`, :meth:`read_key`) and ``enrichment`` as
        ``metadata.enrichment`` (None: null; its timestamps ISO under any ``timestamp_format``, as
        Sequin enriches after converting them). Written as ``__call__`` writes them: unshaped
        parts give its payload byte for byte."""
        action = change.action
        if action == "truncate":
            raise ValueError("a truncate has no payload: SinkFilter must drop it before the envelope")
        parts = self._heads.get((change.schema, change.table, action))
        head = (parts or self._head(change.schema, change.table, action))[0]
        annotations = change.annotations
        return _PAYLOAD % (
            self.encode_row(record),
            b"null" if changes is None else self.encode_row(changes),
            head,
            self._commit_time(change.commit_ts)[1],
            change.commit_lsn,
            change.commit_idx,
            key,
            _dumps(pks),
            b"null" if annotations is None else self._annotations(annotations),
            self._tail if enrichment is None
            else b'"enrichment":%s,%s' % (self.encode_value(enrichment, iso=True), self._end),
        )

    def metadata(self, change: Change, pks: tuple[str, ...], key: bytes, enrichment: Any = None) -> dict[str, Any]:
        """The payload's ``metadata`` as Python values, for the callables (filters, transforms,
        routing are called ``f(action, record, changes, metadata)``, as Sequin calls its
        functions): the payload's keys in its order, ``commit_timestamp`` a UTC datetime,
        ``transaction_annotations`` parsed (None when absent or not JSON). New dicts and lists on
        every call, ``enrichment`` copied too: a callable may change what it is given."""
        ts = change.commit_ts
        annotations = change.annotations
        return {
            "database_name": self._database,
            "table_schema": change.schema,
            "table_name": change.table,
            "commit_timestamp": ts if ts.tzinfo is UTC else ts.astimezone(UTC),
            "commit_lsn": change.commit_lsn,
            "commit_idx": change.commit_idx,
            "idempotency_key": key.decode("ascii"),
            "record_pks": list(pks),
            "transaction_annotations": None if annotations is None else _parsed_annotations(annotations),
            "enrichment": _copied(enrichment),
            "consumer": _copied(self._consumer),
            "database": _copied(self._described),
        }

    def encode_value(self, value: Any, *, iso: bool = False) -> bytes:
        """:func:`encode_json` of ``value`` under this sink's ``timestamp_format``; ``iso``: datetimes
        as ISO whatever it says (Sequin converts only ``record`` and ``changes``: a value from
        ``metadata`` or an enrichment keeps ISO)."""
        return encode_json(value, self._unix_times and not iso)

    def committed(self, change: Change) -> float:
        """The message's ``commit_ts`` (Unix seconds; 0.0 for a backfill's read, which has no
        commit of its own), computed once per transaction as :meth:`__call__` computes it."""
        return 0.0 if change.read is not None else self._commit_time(change.commit_ts)[2]

    def address(self, schema: str, table: str, action: str) -> tuple[bytes, tuple[str, str]]:
        """The default subject of a table's and action's messages, and their metrics' labels
        (what :class:`core.message.Message` takes beside the payload)."""
        parts = self._heads.get((schema, table, action)) or self._head(schema, table, action)
        return parts[1], parts[2]

    def _head(self, schema: str, table: str, action: str) -> tuple[bytes, bytes, tuple[str, str]]:
        """What only depends on a table and an action: the payload's JSON from ``"action"`` up to
        the commit timestamp's value, the default subject, the labels."""
        metadata = to_json(
            {"database_name": self._database, "table_schema": schema, "table_name": table, "commit_timestamp": None}
        )
        head = b'"action":%s,"metadata":%s' % (to_json(action), metadata[: -len(b"null}")])
        subject = default_subject(self._prefix, self._database, schema, table, action).encode()
        parts = self._heads[(schema, table, action)] = (head, subject, (f"{schema}.{table}", action))
        return parts

    def _commit_time(self, ts: datetime) -> tuple[datetime | None, bytes, float]:
        """``ts``, rendered ISO 8601 UTC with 6 fractional digits and ``Z`` (whatever
        ``timestamp_format`` says: Sequin converts only ``record`` and ``changes``), and as
        Unix seconds (the message's ``commit_ts``); cached per transaction."""
        cached = self._last_ts
        if ts is not cached[0] and ts != cached[0]:
            if ts.tzinfo is UTC and ts.microsecond:  # as the source makes them: orjson writes what to_json does
                rendered = _dumps(ts, option=orjson.OPT_UTC_Z)
            else:
                rendered = to_json(iso_usec(ts.astimezone(UTC)))
            cached = self._last_ts = (ts, rendered, ts.timestamp())
        return cached

    def _annotations(self, text: bytes) -> bytes:
        """The transaction's annotations as compact JSON, or as their text when nested too deep
        (none: ``null``, decided by the caller without a call per change); ``null`` if not JSON
        (Sequin too publishes ``null`` and reports it), with one warning per process that never
        quotes them."""
        last, rendered = self._last_annotations
        if text is not last and text != last:
            try:  # integers beyond 64 bits stay exact, as in Jason (once per transaction)
                value = _read_annotations(text)
            except ValueError:
                warn_once(log, ("annotations",), "transaction annotations that are not JSON are published as null "
                          "(their text is not shown; this is logged once)")
                rendered = b"null"
            else:
                rendered = value.text if type(value) is JsonText else _json(value)
            self._last_annotations = (text, rendered)
        return rendered

    def encode_row(self, row: Row) -> bytes:
        """``row`` (a row of the source's values: ``record``, ``changes``, Debezium's ``before`` and
        ``after``) as JSON, by orjson where its bytes are the exact encoder's (the module's
        docstring); a value of a type it does not know is written as its text, as the source
        loads a value it cannot convert."""
        try:
            out = _dumps(row, default=self._default, option=self._options)
        except TypeError:  # orjson.JSONEncodeError: a value orjson cannot write
            return self._exact(row)
        # find, not ``in``: bytes ``in`` raises and clears a TypeError per call (types.json_loads)
        if (out.find(b"null") >= 0 and (nulls := out.count(b"null")) != _nones(row)
                and nulls != _nones(row) + _fragment_nulls(row)) or (
            self._timestamps and _inexact_times(row.values())
        ):
            return self._exact(row)
        return out

    def _exact(self, row: Row) -> bytes:
        """``row`` by the exact encoder; a row holding a JsonText (a document too deep to load,
        :func:`connectors.postgres.types.json_loads`) as a value or an array's element at any
        dimension, in pieces around it (:func:`_embedded`)."""
        rewritten = self._row(row)
        try:
            return _json(rewritten)
        except PydanticSerializationError:  # a JsonText (_unknown): the only value of the source's it refuses
            return _embedded(rewritten, _json)

    def _value(self, value: Any) -> Any:
        convert = self._convert.get(type(value))
        return value if convert is None else convert(value)

    def _list(self, values: list[Any]) -> list[Any]:
        """An array (or a JSON array): its elements rewritten if the first non-null one needs it."""
        for value in values:
            if value is not None:
                if type(value) in self._convert:
                    return [self._value(v) for v in values]
                break
        return values

    def _row(self, row: Row) -> Row:
        """``row`` with the values that need it rewritten for the exact encoder; copied only when one does."""
        out: Row | None = None
        convert = self._convert
        for name, value in row.items():
            rewrite = convert.get(type(value))
            if rewrite is not None:
                if out is None:
                    out = dict(row)
                out[name] = rewrite(value)
        return row if out is None else out
