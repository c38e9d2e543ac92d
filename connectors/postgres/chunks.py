"""Reading one table in keyset chunks, values as the texts pgoutput would send.

A backfill reads its table in primary-key order, one ``SELECT … WHERE key > last ORDER BY
key LIMIT n`` per chunk, in a plain READ COMMITTED statement: no long transaction, no
snapshot pinned, nothing locked. A partial backfill orders by ``(sort_column, key)`` from
``sort_column >= start_position`` on. Rows come back in text format, read straight from
the result (:class:`core.events.RawRow`), so a read goes through the same group key,
conversion and envelope as a change: the connection pins the same output settings as the
replication connection (:mod:`connectors.postgres.connection`).

The table is described from the catalog the way pgoutput describes it — published
columns (the publication's column list, no generated columns) in ``attnum`` order, the
replica identity's key flags — through the same :class:`~connectors.postgres.types.Catalog`,
so a read and a change of the same row get the same group key.

**Which key.** The primary key, else the replica identity index. A table with neither is
refused (:class:`BackfillRefused`): its rows cannot be matched with their changes during
a chunk's window, so a read could overwrite a newer change.

**Chunk size** adapts so that one ``SELECT`` takes about ``query_budget_ms``, halving after
a statement that ran past the statement timeout, and never holds more than
``max_chunk_rows`` rows or ``max_chunk_mb`` of estimated memory.

**Size** (``core/sizes.py``): a row over ``walflow.max_change_mb`` has its largest values
replaced by markers until it fits, as a change's would be, never its key or ordering columns
(what that costs in memory: docs/design.md, ``connectors/postgres/chunks.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final

import psycopg
from psycopg import sql

from config.schema import BackfillSettings
from connectors.postgres.decoder import change_memory
from connectors.postgres.relations import Column, Relation
from connectors.postgres.requests import keyless_refusal
from connectors.postgres.signals import BackfillRequest, Cursor
from connectors.postgres.types import Catalog
from core.errors import WalflowError
from core.events import RawRow, Table
from core.ids import row_key
from core.sizes import OversizedReport, largest, replaced

_TABLE_QUERY: Final = """
SELECT c.oid, c.relreplident, c.relkind, greatest(c.reltuples, 0)::bigint,
       pg_table_size(c.oid) / greatest(c.reltuples, 1)::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""
#: PG15+: the publication's column list for the table (NULL: every column).
_PUBLISHED_QUERY: Final = "SELECT attnames FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s"
_COLUMNS_QUERY: Final = """
SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""
#: The key columns (not INCLUDE columns) of the primary key, else of the replica identity
#: index, in index order: what pagination orders by.
_KEY_QUERY: Final = """
SELECT a.attname
FROM (SELECT i.indkey, i.indnkeyatts FROM pg_index i WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident)
      ORDER BY i.indisprimary DESC LIMIT 1) i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = %s AND a.attnum = k.attnum
WHERE k.ord <= i.indnkeyatts
ORDER BY k.ord
"""
#: The key columns of the replica identity index (``i``) or the primary key (``d``): what
#: pgoutput flags, and what a key-only old row holds.
_IDENTITY_QUERY: Final = """
SELECT a.attname
FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND k.ord <= i.indnkeyatts AND (CASE WHEN %s = 'i' THEN i.indisreplident ELSE i.indisprimary END)
"""


#: For :func:`wait_for_commits_in_flight`: an xid of our own (every xid below it was
#: assigned before now) and the snapshot: running now are its in-progress list and every
#: xid from its xmax up to ours (a snapshot does not list those).
_IN_PROGRESS: Final = "SELECT pg_current_xact_id()::text, pg_current_snapshot()::text"
_STILL_RUNNING: Final = """
SELECT count(*) FROM unnest(%s::text[]::xid8[]) AS x, pg_current_snapshot() AS s
WHERE x >= pg_snapshot_xmax(s) OR x = ANY(ARRAY(SELECT pg_snapshot_xip(s)))
"""
#: Beyond this many xids assigned since the last one completed, wait for them by count only.
_MAX_WATCHED: Final = 10_000


def wait_for_commits_in_flight(conn: psycopg.Connection[Any], timeout: float, pause: Callable[[float], bool]) -> bool:
    """Wait (at most ``timeout`` s) until every transaction running now has ended.

    Called right after a chunk's low watermark, before its ``SELECT``: a transaction whose
    commit record precedes the watermark in the WAL but that is not yet visible (between
    writing its commit record and leaving the process array; longer under synchronous
    replication) would otherwise be neither in the chunk nor in its window, and the read
    would carry the row's state before it, after it. Transactions that still run after
    ``timeout`` are long ones that had not reached their commit (or a commit stuck behind a
    standby for that long). ``pause(seconds)`` waits and returns True to give up (stopping).
    True when nothing was left running.
    """
    row = conn.execute(_IN_PROGRESS).fetchone()
    assert row is not None
    mine = int(row[0])
    _, xmax, xip = str(row[1]).split(":")
    running = [x for x in xip.split(",") if x] + [str(x) for x in range(int(xmax), min(mine, int(xmax) + _MAX_WATCHED))]
    if not running:
        return True
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        left = conn.execute(_STILL_RUNNING, [running]).fetchone()
        if not left or not left[0]:
            return True
        if time.monotonic() >= deadline or pause(delay):
            return False
        delay = min(delay * 2, 0.05)


class BackfillRefused(WalflowError):
    """This table cannot be backfilled as asked; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Rows of one chunk, with what the high watermark needs to emit them."""

    table: Table
    rows: list[RawRow]
    #: Per row, its key as :func:`core.ids.row_key` of the key columns' texts.
    keys: list[str]
    #: A row's estimated memory until acknowledged (:func:`~connectors.postgres.decoder.change_memory`
    #: of the chunk's average row).
    row_memory: int
    #: Where the next chunk starts (the last row's pagination texts); None if no rows.
    end: Cursor | None

    @property
    def memory(self) -> int:
        return self.row_memory * len(self.rows)


class TableReader:
    """Reads ``request``'s table in chunks on ``conn`` (autocommit, the pinned settings)."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        publication: str,
        request: BackfillRequest,
        settings: BackfillSettings,
        limit: int | None = None,
        database: str = "",
    ) -> None:
        """``limit``: the chunk size an earlier connection reached (else one sized from the
        table's average row on disk, within ``initial_chunk_rows`` and ``max_chunk_mb``);
        ``database``: the configured name of the database (its reads' tables carry it)."""
        self._conn = conn
        self.request = request
        self._settings = settings
        schema, _, name = request.table.partition(".")
        found = conn.execute(_TABLE_QUERY, [schema, name]).fetchone()
        if found is None:
            raise BackfillRefused(f"table {request.table} does not exist")
        relid, identity, relkind, estimate, row_bytes = found
        published = conn.execute(_PUBLISHED_QUERY, [publication, schema, name]).fetchone()
        if published is None:
            raise BackfillRefused(
                f"table {request.table} is not in publication {publication}: its changes are not streamed, "
                "so its rows could not be kept consistent with them. Add it to the publication first"
            )
        names = None if published[0] is None else set(published[0])
        rows = conn.execute(_COLUMNS_QUERY, [relid]).fetchall()
        columns = [(n, oid, mod, typ) for n, oid, mod, typ in rows if names is None or n in names]
        key = [n for (n,) in conn.execute(_KEY_QUERY, [relid, relid]).fetchall()]
        types = {n: typ for n, _, _, typ in columns}
        if not key:
            raise BackfillRefused(keyless_refusal(request.table))
        if any(k not in types for k in key):
            raise BackfillRefused(f"table {request.table}: its key ({', '.join(key)}) is not among its published columns")
        order = list(key)
        if request.sort_column is not None:
            if request.sort_column not in types:
                raise BackfillRefused(f"table {request.table} has no published column {request.sort_column}")
            order = [request.sort_column, *(k for k in key if k != request.sort_column)]
        flagged = self._identity(relid, identity, [c[0] for c in columns])
        relation = Relation(relid, schema, name, identity,
                            tuple(Column(n, oid, mod, n in flagged) for n, oid, mod, _ in columns))
        self.table: Table = Catalog(conn, database=database).describe(relation)
        self.estimate = int(estimate)
        positions = self.table.positions
        #: The columns that identify a row to the stream (the group key's: the replica
        #: identity's, or the primary key under FULL): every change carries them, a delete's
        #: key-only old row too, so a chunk's window matches changes by these.
        self.key_columns = self.table.key_columns
        if not self.key_columns:
            raise BackfillRefused(
                f"table {request.table} has REPLICA IDENTITY NOTHING: its updates and deletes carry no key, so its "
                "rows could not be matched with them. Set REPLICA IDENTITY DEFAULT (the primary key)"
            )
        self._key_at = [positions[k] for k in self.key_columns]
        self._order_at = [positions[c] for c in order]
        self._report = OversizedReport("max_change", None, "its row is larger than walflow.max_change_mb "
                                       f"({settings.max_change_bytes} bytes)")
        relation_sql = sql.SQL("{}{}.{}").format(
            sql.SQL("" if relkind == "p" else "ONLY "), sql.Identifier(schema), sql.Identifier(name)
        )
        select = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(n) for n, *_ in columns), relation_sql
        )
        ordered = sql.SQL(", ").join(sql.Identifier(c) for c in order)
        after = sql.SQL("({}) > ({})").format(
            ordered, sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(types[c])) for c in order)
        )
        tail = sql.SQL(" ORDER BY {} LIMIT %s").format(ordered)
        if request.sort_column is None:
            self._first = select + tail
        else:
            start = sql.SQL(" WHERE {} >= %s::{}").format(sql.Identifier(request.sort_column), sql.SQL(types[request.sort_column]))
            self._first = select + start + tail
        self._next = select + sql.SQL(" WHERE ") + after + tail
        first = int(settings.max_chunk_mb * 1024 * 1024 // change_memory(int(row_bytes or 0), len(columns)))
        self.limit = limit or max(1, min(settings.initial_chunk_rows, first))

    def _identity(self, relid: int, identity: str, columns: list[str]) -> set[str]:
        """Which columns pgoutput flags as the replica identity (what a key-only old row holds)."""
        if identity == "f":
            return set(columns)
        if identity == "n":
            return set()
        return {n for (n,) in self._conn.execute(_IDENTITY_QUERY, [relid, identity]).fetchall()}

    def read(self, after: Cursor | None) -> Chunk:
        """The next ``limit`` rows after ``after`` (None: from the start)."""
        if after is None:
            params: list[Any] = [] if self.request.sort_column is None else [self.request.start_position]
            query = self._first
        else:
            params, query = list(after), self._next
        with self._conn.cursor() as cur:
            cur.execute(query, [*params, self.limit], binary=False)
            result = cur.pgresult
            assert result is not None
            ntuples, nfields = result.ntuples, result.nfields
            get = result.get_value
            columns = range(nfields)
            rows: list[RawRow] = [tuple([get(r, c) for c in columns]) for r in range(ntuples)]
        key_at, width = self._key_at, len(self.table.columns)
        # every text of the chunk (None aside): the memory estimate's, and a bound on any row's
        text_bytes = sum(map(len, filter(None, chain.from_iterable(rows))))  # type: ignore[arg-type]  # texts
        if text_bytes > self._settings.max_change_bytes:  # a row may be over it: look at each
            sizes = [sum(map(len, filter(None, row))) for row in rows]  # type: ignore[arg-type]
            if max(sizes) > self._settings.max_change_bytes:
                self._fit(rows, sizes)
            text_bytes = sum(sizes)
        keys = [row_key([row[i] for i in key_at]) for row in rows]
        text_bytes //= max(1, len(rows))
        end: Cursor | None = None
        if rows:
            end = [None if (v := rows[-1][i]) is None else bytes(v).decode("utf-8", "surrogateescape")  # type: ignore[arg-type]
                   for i in self._order_at]
        return Chunk(self.table, rows, keys, change_memory(text_bytes, width), end)

    def _fit(self, rows: list[RawRow], sizes: list[int]) -> None:
        """Each row over ``walflow.max_change_mb`` with its largest values replaced (in place, with
        its size), its key and ordering columns kept (:mod:`core.sizes`)."""
        limit, columns = self._settings.max_change_bytes, self.table.columns
        kept = {*self._key_at, *self._order_at}
        for i, size in enumerate(sizes):
            if size > limit:
                places, removed = largest((rows[i],), kept, size - limit)
                rows[i] = replaced(rows[i], {c for _, c, _ in places})
                sizes[i] = size - removed
                for _, c, length in places:
                    self._report(self.table.qualified, columns[c], length, f"a read of backfill {self.request.id}")

    def adapt(self, rows: int, seconds: float, memory: int) -> None:
        """Size the next chunk from how long this one took and how much memory it holds."""
        settings = self._settings
        budget = settings.query_budget_ms / 1000
        limit = self.limit
        if rows >= limit:  # a short chunk says nothing about speed
            limit = int(limit * min(2.0, max(0.5, budget / max(seconds, 1e-3))))
        if rows and memory:
            limit = min(limit, int(settings.max_chunk_mb * 1024 * 1024 * rows / memory))
        self.limit = max(1, min(limit, settings.max_chunk_rows))

    def shrink(self) -> None:
        """The last ``SELECT`` ran past the statement timeout: half the rows next time."""
        self.limit = max(1, self.limit // 2)
