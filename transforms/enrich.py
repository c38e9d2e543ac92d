"""Enrichment, Sequin's enrichment function: a SQL query on the source database with a batch's
primary keys as parameters, whose row for each key becomes that message's ``metadata.enrichment``.

The contract, as Sequin's ``enrich_messages!``:

- **Parameters**: one array per primary-key column, ``$1``, ``$2``, … in alphabetical order of
  the column names, each the keys' texts as an untyped array literal: the server infers the
  type from the query (``id = ANY($1)``). Where the query leaves it open it must cast
  (``unnest($1::int[], $2::text[])``).
- **Matching**: a result row belongs to the key its key columns hold, compared as text (both
  printed with the pinned settings of :mod:`connectors.postgres.connection`); the whole row is
  the enrichment, no row gives None. Two rows for one key, a result without a key column or
  with one NULL are an :class:`EnrichmentError`; a row for a key not asked for is ignored.
- Keys are deduplicated, at most ``max_keys`` go into one query, and ``timeout_ms`` is its
  ``statement_timeout``. Values load as a record's do (:class:`connectors.postgres.types.Catalog`).
- **The connection**: one per :class:`Enricher` (not thread-safe: one per sink partition),
  opened at its first query, read-only, with no statement prepared on the server.
- **Failures**: what the query itself meets is an :class:`EnrichmentError`, not retried, whose
  text never holds a key or a value (a dead letter carries it). A lost connection is retried
  on a new one after capped, jittered backoff, as long as it takes, blocking the partition.

Where walflow differs from Sequin, and why: ``docs/design.md``, *transforms/enrich.py*.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

import psycopg
from psycopg.types.string import StrDumperUnknown

from config.schema import DatabaseConfig
from config.shaping import Enrichment
from connectors.postgres.connection import conninfo
from connectors.postgres.types import Catalog
from core.errors import ValueFree
from core.events import Loader, Table
from transforms.convert import as_text

log = logging.getLogger("walflow.enrichment")

_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 5.0

#: A key: its columns' texts in column order (Sequin's ``record_pks``).
Key = tuple[str, ...]
#: One query's result: column names, a loader per column, rows of texts.
_Result = tuple[list[str], list[Loader], list[tuple[bytes | None, ...]]]


#: SQLSTATE classes whose messages speak of the query, the schema or the server, never of a
#: value: syntax and access rules (a misspelt column), unsupported features, cardinality, a
#: read-only transaction, a missing schema, resources and limits, a timeout. Any other
#: class's (a data exception's ``invalid input syntax for type integer: "…"`` quotes the key
#: it met) is shown by its SQLSTATE and condition name only.
_QUERY_CLASSES: Final = frozenset({"0A", "21", "25", "3F", "42", "53", "54", "57"})


class EnrichmentError(ValueFree, ValueError):
    """The enrichment query cannot enrich this batch (the message says why, and names the
    sink, never a row's value or key); the sink's failure policy decides what happens to the batch."""


class _ArrayLiteral(str):
    """A parameter sent as text of no type (OID 0, :class:`StrDumperUnknown`): the server
    infers its type from the query and parses it."""


def _array_literal(texts: Iterable[str]) -> _ArrayLiteral:
    """``texts`` as a Postgres array literal, every element quoted (``{"7","a\\"b"}``): a
    quoted element is never NULL, and commas, braces and spaces in it are its own."""
    quoted = ('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"' for text in texts)
    return _ArrayLiteral("{" + ",".join(quoted) + "}")


class Enricher:
    """One sink partition's enrichment queries, on its own connection to the source database."""

    def __init__(self, spec: Enrichment, database: DatabaseConfig, label: str) -> None:
        """``label`` names the sink in error messages and logs (``sink 'orders'``)."""
        self._spec = spec
        self._database = database
        self._label = label
        self._conn: psycopg.Connection[Any] | None = None
        self._catalog: Catalog | None = None

    def lookup(self, table: Table, keys: Sequence[Key]) -> dict[Key, dict[str, Any] | None]:
        """The enrichment of each of ``keys`` of ``table`` (None: the query returned no row
        for it), each distinct key once. Blocks while the database cannot be reached.
        Raises :class:`EnrichmentError`."""
        names = tuple(table.columns[i] for i in table.key_positions)
        if not names:
            raise EnrichmentError(f"{self._label}: table {table.qualified} has no primary key, "
                                  "which enrichment needs to match its rows to messages")
        found: dict[Key, dict[str, Any] | None] = dict.fromkeys(keys)
        unique = list(found)
        alphabetical = sorted(range(len(names)), key=names.__getitem__)
        for start in range(0, len(unique), self._spec.max_keys):
            chunk = unique[start:start + self._spec.max_keys]
            params = [_array_literal(key[i] for key in chunk) for i in alphabetical]
            self._match(table, names, set(chunk), self._run(params), found)
        return found

    def close(self) -> None:
        """Close the connection (a later lookup opens a new one)."""
        if self._conn is not None:
            self._conn.close()
        self._conn = self._catalog = None

    def _match(self, table: Table, names: tuple[str, ...], asked: set[Key], result: _Result,
               found: dict[Key, dict[str, Any] | None]) -> None:
        """Each row of ``result`` as the enrichment of the key it holds, into ``found``."""
        columns, loaders, rows = result
        index = {name: i for i, name in enumerate(columns)}  # a name selected twice: its last, as Sequin's map keeps
        missing = [name for name in names if name not in index]
        if missing:
            raise EnrichmentError(
                f"{self._label}: the enrichment query must select every primary-key column of {table.qualified} "
                f"({', '.join(names)}) to match its rows to messages; it does not select {', '.join(missing)}")
        at = [index[name] for name in names]
        for raw in rows:
            texts: list[str] = []
            for name, i in zip(names, at, strict=True):
                text = raw[i]
                if text is None:
                    raise EnrichmentError(f"{self._label}: the enrichment query returned a row whose primary-key "
                                          f"column {name} is null: it cannot be matched to a message of "
                                          f"{table.qualified}")
                texts.append(text.decode("utf-8", "replace"))
            key = tuple(texts)
            if key not in asked:
                continue
            if found[key] is not None:
                count = sum(1 for other in rows if [other[i] for i in at] == [raw[i] for i in at])
                raise EnrichmentError(f"{self._label}: the enrichment query returned {count} rows for one key of "
                                      f"{table.qualified} ({', '.join(names)}): it must return at most one row per key")
            found[key] = self._loaded(columns, loaders, raw)

    def _run(self, params: list[_ArrayLiteral]) -> _Result:
        """The query's result for ``params``, on a new connection after a lost one (see the
        module's docstring)."""
        delay = _BACKOFF_MIN
        outage = False
        while True:
            try:
                result = self._execute(params)
            except psycopg.Error as exc:
                if not self._lost(exc):
                    raise self._failed(exc) from exc
                self.close()
                if not outage:
                    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    log.warning("enrichment of %s: database %s unreachable (%s); retrying until it answers",
                                self._label, self._database.name, first_line)
                    outage = True
                time.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, _BACKOFF_MAX)
                continue
            if outage:
                log.info("enrichment of %s: database %s reachable again", self._label, self._database.name)
            return result

    def _execute(self, params: list[_ArrayLiteral]) -> _Result:
        conn, catalog = self._connect()
        with psycopg.RawCursor(conn) as cur:  # $1 as the query writes it, no client-side placeholders
            cur.execute(self._spec.sql, params)
            result = cur.pgresult
            if cur.description is None or result is None:
                raise EnrichmentError(f"{self._label}: the enrichment query returns no rows: it must be a SELECT")
            columns = [column.name for column in cur.description]
            types = [column.type_code for column in cur.description]
            rows = [tuple(result.get_value(row, i) for i in range(len(columns))) for row in range(result.ntuples)]
        return columns, [catalog.loader(oid) for oid in types], rows

    def _connect(self) -> tuple[psycopg.Connection[Any], Catalog]:
        if self._conn is None or self._catalog is None:
            settings = {"statement_timeout": str(self._spec.timeout_ms), "default_transaction_read_only": "on"}
            info = conninfo(self._database, application_name=f"walflow enrichment {self._label}", settings=settings)
            conn = psycopg.connect(info, autocommit=True, prepare_threshold=None)
            conn.adapters.register_dumper(_ArrayLiteral, StrDumperUnknown)
            self._conn, self._catalog = conn, Catalog(conn, database=self._database.name)
        return self._conn, self._catalog

    def _lost(self, exc: psycopg.Error) -> bool:
        """Whether ``exc`` cost the connection (or there was none to be had), rather than
        being the query's own failure on a working one: a timeout, a syntax error."""
        if self._conn is None:
            return isinstance(exc, psycopg.OperationalError)  # connecting failed; a bad conninfo is not transient
        return self._conn.broken or self._conn.closed

    def _failed(self, exc: psycopg.Error) -> EnrichmentError:
        """What the query met, said without a value: the server's message where its SQLSTATE's
        class speaks of the query (:data:`_QUERY_CLASSES`), else the condition's name."""
        state = exc.sqlstate or ""
        if state[:2] in _QUERY_CLASSES:
            message = exc.diag.message_primary or type(exc).__name__
        else:  # the text may quote a key or a value the query met
            message = f"{type(exc).__name__} (the server's text is not shown: it may hold the row's values)"
        detail = f" (SQLSTATE {state})" if state else ""
        if isinstance(exc, psycopg.errors.QueryCanceled):
            detail += f"; timeout_ms is {self._spec.timeout_ms}"
        return EnrichmentError(f"{self._label}: the enrichment query failed: {message}{detail}")

    def _loaded(self, columns: list[str], loaders: list[Loader], raw: tuple[bytes | None, ...]) -> dict[str, Any]:
        """A result row by column name, its values loaded (see the module's docstring); a value
        its loader cannot convert stays its text, as a record's does (:func:`transforms.convert.as_text`)."""
        row: dict[str, Any] = {}
        for name, load, text in zip(columns, loaders, raw, strict=True):
            if text is None:
                row[name] = None
                continue
            try:
                row[name] = load(text)
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - not swallowed: the exact text, said once
                row[name] = as_text(text, f"{self._label}: the enrichment query's column {name}", exc)
        return row
