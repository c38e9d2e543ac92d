"""The envelope: one change as Sequin's JSON payload and its idempotency id, a :class:`core.events.Message`.

The envelope does not address the message: the sink gives it its subject from the names
the message carries (``transforms/route.py``).

The payload is Sequin's shape (``shared/CONTRACT.md``), so Sequin consumers keep working::

    {"record": {...}, "changes": {...} | null, "action": "insert" | "update" | "delete" | "read",
     "metadata": {"database_name", "table_schema", "table_name", "commit_timestamp",
                  "commit_lsn", "commit_idx", "idempotency_key",
                  "consumer": {"name", "annotations" (only when the sink has any)}}}

``annotations`` sit inside ``consumer``, where Sequin puts a sink's annotations.

**Record and changes.** ``record`` is the new row (insert, update, a backfill's read) or the old row as far as
the replica identity gives it (delete; absent columns are left out, never ``null``).
``changes`` holds, for an update whose old row Postgres sent (REPLICA IDENTITY FULL, or a
changed key), the old value of each column whose value differs (``{}`` if none does); else
``null``. A TOASTed column that the update left alone has no new value: ``record`` shows
its old value when Postgres sent the old row, else ``"unchanged_toast"`` (Sequin's marker),
and ``changes`` leaves it out, since nothing says whether it changed.

**Values.** ``pydantic_core.to_json`` encodes the row in Rust (faster than ``json.dumps``)
and already writes most types as Sequin consumers expect: numeric as a
string (exact), timestamptz as ISO 8601 with ``Z``, timestamp without zone as ISO 8601
without one, dates and times as ISO, uuid and inet/cidr as text, json/jsonb embedded as
JSON, arrays as JSON arrays, NaN/±Infinity floats as the strings ``"NaN"``/``"Infinity"``.
Only values whose default is wrong are rewritten before it, found by one type lookup per
column (and, for arrays, per first element: Postgres arrays hold one type):

- **bytea** → standard base64 with padding (RFC 4648 §4). ``to_json``'s own base64 mode
  writes the URL-safe alphabet, which ``base64.b64decode`` and most decoders silently
  misread (``-`` and ``_`` are skipped, not rejected).
- **interval** → an ISO 8601 duration in days and time (``P428DT4H5M6.789S``, negative with
  a leading ``-``). ``to_json`` would write 428 days as ``P1Y63D…``, inventing a year that
  Postgres never stored. psycopg has already folded the interval's months into days
  (30 days each), so days and time are exactly what it holds.
- **unchanged TOAST** → as above.
- **timestamps** with ``timestamp_format: unix_microsecond`` → integer microseconds since
  the Unix epoch, as Sequin does; a timestamp without time zone is read as UTC. Dates and
  times stay ISO strings.

Anything ``to_json`` does not know goes through :func:`pg_text`: ranges and multiranges in
Postgres's own text form (``[1,10)``, ``empty``, ``{[1,3),[5,7)}``), anything else as
``str()``. Values the source could not load (``infinity`` dates, unknown types) already are
Postgres's exact text.

**Idempotency key** (also the ``Nats-Msg-Id``): :class:`core.ids.IdScheme`'s id of the
change, standard base64 of ``"<database>/<sink>/<commit_lsn>:<commit_idx>"`` (a read's
names its backfill and row instead): unique per sink and database (Sequin's ``Base64("<commit_lsn>:<commit_idx>")`` is not, and JetStream
deduplicates per stream), and the same on every replay.
"""

from __future__ import annotations

import math
from binascii import b2a_base64
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from psycopg.types.multirange import Multirange
from psycopg.types.range import Range
from pydantic_core import to_json

from config.schema import SinkConfig
from core.events import UNCHANGED_TOAST, Change, Message, Row, UnchangedToast
from core.ids import IdScheme

#: Sequin's value for a TOASTed column that an update left alone and Postgres did not send.
UNCHANGED_TOAST_MARKER: Final = "unchanged_toast"

_US: Final = timedelta(microseconds=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH: Final = datetime(1970, 1, 1)
_US_PER_DAY: Final = 86_400_000_000


def iso_duration(value: timedelta) -> str:
    """An interval as an ISO 8601 duration of days and time: ``P428DT4H5M6.789S``, ``-PT1S``, ``PT0S``."""
    micros = value // _US
    sign = "-" if micros < 0 else ""
    days, micros = divmod(abs(micros), _US_PER_DAY)
    seconds, fraction = divmod(micros, 1_000_000)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    time = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if seconds or fraction:
        time += f"{seconds}.{fraction:06d}".rstrip("0").rstrip(".") + "S"
    if not time and not days:
        time = "0S"
    return f"{sign}P{f'{days}D' if days else ''}{f'T{time}' if time else ''}"


def unix_microseconds(value: datetime) -> int:
    """Microseconds since the Unix epoch; a naive datetime (timestamp without time zone) is read as UTC."""
    return (value - (_NAIVE_EPOCH if value.tzinfo is None else _EPOCH)) // _US


def _base64(value: bytes) -> str:
    return b2a_base64(value, newline=False).decode("ascii")


def _unchanged_toast(_: UnchangedToast) -> str:
    return UNCHANGED_TOAST_MARKER


# -- Postgres text of values that JSON has no type for ---------------------------------------

_RANGE_QUOTE: Final = frozenset('"\\()[],') | frozenset(" \t\n\r\v\f")


def _pg_datetime(value: datetime) -> str:
    """Postgres's ISO DateStyle output: ``2024-01-02 03:04:05.12+00``."""
    text = f"{value.date().isoformat()} {value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    offset = value.utcoffset()
    if offset is not None:
        seconds = offset // timedelta(seconds=1)
        hours, rest = divmod(abs(seconds), 3600)
        minutes, seconds_part = divmod(rest, 60)
        text += f"{'-' if seconds < 0 else '+'}{hours:02d}"
        if minutes or seconds_part:
            text += f":{minutes:02d}"
        if seconds_part:
            text += f":{seconds_part:02d}"
    return text


def _pg_float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value.is_integer() and abs(value) < 1e15:
        return f"{value:.0f}"  # Postgres prints 100, not 100.0
    return repr(value)


def _pg_scalar(value: Any) -> str:
    """A range bound as Postgres prints it (for the built-in subtypes; else its ``str()``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return _pg_datetime(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float):
        return _pg_float(value)
    if isinstance(value, Decimal):
        return format(value, "f")  # positional, as numeric_out: never 1E-7
    if isinstance(value, timedelta):
        return iso_duration(value)  # Postgres reads ISO 8601 durations back
    return str(value)


def _range_bound(value: Any) -> str:
    """A bound quoted as Postgres's ``range_out`` does: when empty or holding ``"\\()[],`` or space."""
    text = _pg_scalar(value)
    if text and not any(char in _RANGE_QUOTE for char in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def _range_text(value: Range[Any]) -> str:
    if value.isempty:
        return "empty"
    lower = "" if value.lower is None else _range_bound(value.lower)
    upper = "" if value.upper is None else _range_bound(value.upper)
    return f"{value.bounds[0]}{lower},{upper}{value.bounds[1]}"


def pg_text(value: Any) -> str:
    """``to_json``'s fallback: ranges and multiranges as Postgres writes them, anything else as ``str()``."""
    if isinstance(value, Range):
        return _range_text(value)
    if isinstance(value, Multirange):
        return "{" + ",".join(_range_text(r) for r in value) + "}"
    return str(value)


# -- the envelope ---------------------------------------------------------------------------


class Envelope:
    """``envelope`` step of one sink: a change → its Sequin payload and ``Nats-Msg-Id``."""

    def __init__(self, sink: SinkConfig, database: str) -> None:
        self._database = database
        self._ids = IdScheme(database, sink.name)
        consumer: dict[str, Any] = {"name": sink.name}
        if sink.annotations:
            consumer["annotations"] = sink.annotations
        self._consumer_json = b'"consumer":%s' % to_json(consumer, inf_nan_mode="strings", fallback=pg_text)
        #: (schema, table, action) -> the payload text that depends on them only: see _head.
        self._heads: dict[tuple[str, str, str], bytes] = {}
        self._unix = sink.timestamp_format == "unix_microsecond"
        #: Values rewritten before to_json, by exact type; all others pass untouched.
        self._convert: dict[type, Callable[[Any], Any]] = {
            UnchangedToast: _unchanged_toast,
            timedelta: iso_duration,
            bytes: _base64,
            list: self._list,
        }
        if self._unix:
            self._convert[datetime] = unix_microseconds
        # The changes of one transaction share their commit timestamp: render it once. One
        # tuple, replaced whole, so worker threads sharing this step never pair a stale half.
        self._last_ts: tuple[datetime | None, str | int] = (None, "")

    def __call__(self, change: Change) -> Message:
        action = change.action
        changes: Row | None = None
        if action == "delete":
            record = self._row(change.old or {}, None)
        elif action == "insert" or action == "read":
            record = self._row(change.new or {}, None)
        elif action == "update":
            new, old = change.new or {}, change.old
            record = self._row(new, old)
            if old is not None:
                changes = self._changes(new, old)
        else:
            raise ValueError(f"a {action} has no payload: SinkFilter must drop it before the envelope")
        lsn, idx = change.commit_lsn, change.commit_idx
        read = change.read
        key = self._ids.encode(lsn, idx) if read is None else self._ids.encode_read(read.backfill, read.row_key)
        head = self._heads.get((change.schema, change.table, action))
        if head is None:
            head = self._head(change.schema, change.table, action)
        payload = b'{"record":%s,"changes":%s,%s%s,"commit_lsn":%d,"commit_idx":%d,"idempotency_key":"%s",%s}}' % (
            to_json(record, inf_nan_mode="strings", fallback=pg_text),
            b"null" if changes is None else to_json(changes, inf_nan_mode="strings", fallback=pg_text),
            head,
            to_json(self._commit_timestamp(change.commit_ts)),
            lsn,
            idx,
            key,
            self._consumer_json,
        )
        return Message(change.schema, change.table, action, payload, key.decode("ascii"))

    def _head(self, schema: str, table: str, action: str) -> bytes:
        """The payload's text that only depends on a table and an action: JSON from
        ``"action"`` up to the commit timestamp's value."""
        metadata = to_json(
            {"database_name": self._database, "table_schema": schema, "table_name": table, "commit_timestamp": None}
        )
        head = b'"action":%s,"metadata":%s' % (to_json(action), metadata[: -len(b"null}")])
        self._heads[(schema, table, action)] = head
        return head

    def _commit_timestamp(self, ts: datetime) -> datetime | str | int:
        """ISO 8601 UTC with 6 fractional digits and ``Z``, or Unix microseconds.

        A UTC datetime with a non-zero fraction is left to ``to_json``, which renders it
        exactly so, three times faster than Python formats it (each single-row transaction
        has its own commit time); other ones are formatted here, cached per transaction."""
        if not self._unix and ts.microsecond and ts.tzinfo is UTC:
            return ts
        last, rendered = self._last_ts
        if ts != last:
            if self._unix:
                rendered = unix_microseconds(ts)
            else:
                utc = ts.astimezone(UTC)
                rendered = utc.isoformat(timespec="microseconds")[:-6] + "Z"  # "+00:00" → "Z", all 6 digits
            self._last_ts = (ts, rendered)
        return rendered

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

    def _row(self, row: Row, old: Row | None) -> Row:
        """``row`` with the values that need it rewritten; copied only when one does."""
        out: Row | None = None
        convert = self._convert
        for name, value in row.items():
            rewrite = convert.get(type(value))
            if rewrite is not None:
                if out is None:
                    out = dict(row)
                if value is UNCHANGED_TOAST and old is not None and name in old:
                    out[name] = self._value(old[name])  # REPLICA IDENTITY FULL: the old row has it, detoasted
                else:
                    out[name] = rewrite(value)
        return row if out is None else out

    def _changes(self, new: Row, old: Row) -> Row:
        """The old values of the columns whose value differs; a TOASTed untouched column is unknown, left out."""
        return {
            name: self._value(before)
            for name, before in old.items()
            if (after := new.get(name, UNCHANGED_TOAST)) is not UNCHANGED_TOAST and _differs(before, after)
        }


def _differs(before: Any, after: Any) -> bool:
    """``before != after``, except that NaN equals NaN: a NaN column that stayed NaN did not change."""
    return bool(before != after) and not (_is_nan(before) and _is_nan(after))


def _is_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    return isinstance(value, Decimal) and value.is_nan()
