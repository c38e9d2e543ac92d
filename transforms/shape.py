"""A sink's shaping config, as the steps that run for each table version (``config/shaping.py``).

:class:`Shaping` is built once per sink and process: it imports the config's Python
callables (startup, so an import error stops walflow before it reads anything). For each
table version that reaches a sink partition it makes a :class:`Plan` — the steps that
table's messages go through, built against the table's real columns, so a key naming a
column the table does not have is an error that names the key (the first time the table
is seen). A table with nothing to shape gets no plan: its messages take the envelope's
unshaped path, which costs what it cost before shaping existed.

Where a table's key and the sink's both exist: ``where`` and ``filters`` and the two
``filter`` callables all apply (AND); the table's ``routing``, ``enrichment`` and ``toast``
replace the sink's; ``columns`` exist per table only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from config.schema import DatabaseConfig, SinkConfig, TableConfig
from config.shaping import (
    Enrichment,
    FilterFunction,
    PathTransform,
    RoutingFunction,
    SubjectRouting,
    ToastPolicy,
    TransformFunction,
)
from core.errors import FatalError
from core.events import Table
from core.keyed_hash import KeyedHash
from transforms.columns import ColumnShaper
from transforms.conditions import RowFilter
from transforms.filter import SinkFilter
from transforms.functions import Function, load_function
from transforms.payload import Transformer
from transforms.route import Router

log = logging.getLogger("walflow.shaping")


@dataclass(frozen=True, slots=True)
class Plan:
    """The steps one table version's messages take, in the order ``transforms/render.py`` runs them."""

    toast: ToastPolicy
    enrichment: Enrichment | None
    rows: RowFilter | None
    #: Python filters (the sink's, then the table's), each with the key that names it.
    filters: tuple[tuple[str, Function], ...]
    columns: ColumnShaper | None
    transform: Transformer | None
    router: Router
    #: The keyed hash that hides a backfill read's row key in its id, when a key column is
    #: masked (None: none is masked).
    id_hash: KeyedHash | None
    #: Whether the payload is the envelope's unshaped one (only filters and routing apply):
    #: the envelope's own path then makes it.
    plain: bool


class Shaping:
    """One sink's shaping: its callables, and a plan per table version."""

    def __init__(self, sink: SinkConfig, database: DatabaseConfig, index: int, beside: Path | None,
                 mask_secret: str | None, stream_subjects: tuple[str, ...]) -> None:
        """``index``: the sink's place in ``sinks:`` (error messages name ``sinks[i]…``);
        ``beside``: the config's directory (callables are imported from there too);
        ``stream_subjects``: what the sink's stream captures (routed subjects must be in it)."""
        self.sink = sink
        self.database = database
        self._path = f"sinks[{index}]"
        self._secret = mask_secret
        self._beside = beside
        self._stream_subjects = stream_subjects
        self._tables: dict[str, tuple[int, TableConfig]] = {t.name: (i, t) for i, t in enumerate(sink.tables)}
        reads = SinkFilter(sink)
        for i, table in enumerate(sink.tables):
            if not reads.receives(table.name.partition(".")[0], table.name):
                log.warning("%s.tables[%d]: the sink does not read %s (its source or table rules leave it out): "
                            "its settings apply to nothing", self._path, i, table.name)
        self._functions: dict[str, Function] = {}
        self._filter = self._load(sink.filter, f"{self._path}.filter")
        transform = sink.transform if isinstance(sink.transform, (PathTransform, TransformFunction)) else None
        self._transform = (None if transform is None else Transformer(
            transform, self._load(transform, f"{self._path}.transform"), sink.timestamp_format))
        for i, table in enumerate(sink.tables):
            self._load(table.filter, f"{self._path}.tables[{i}].filter")
            self._load(table.routing, f"{self._path}.tables[{i}].routing")
        self._load(sink.routing, f"{self._path}.routing")
        #: Where an unshaped table's dead letters go (a message too large for the server is one,
        #: whatever ``on_error`` says: ``transforms/render.py``).
        self.dead_letters = Router(None, None, sink, database.name, stream_subjects,
                                   dead_letter_key=f"{self._path}.dead_letter_subject")
        #: Whether any table of this sink may need a plan: without, every message is unshaped.
        self.active = bool(
            self._filter or self._transform or _given(sink.routing) or _given(sink.enrichment) or sink.filters
            or sink.toast != "placeholder" or sink.envelope != "sequin" or sink.tables and any(
                t.filters or t.where or _given(t.filter) or t.columns or t.toast not in (None, "placeholder")
                or _given(t.routing) or _given(t.enrichment) for t in sink.tables))

    def _load(self, spec: object, key: str) -> Function | None:
        """Import the callable of a ``{python: …}`` spec (once per import path)."""
        if not isinstance(spec, (FilterFunction, TransformFunction, RoutingFunction)):
            return None
        found = self._functions.get(spec.python)
        if found is None:
            found = self._functions[spec.python] = load_function(spec.python, key, self._beside)
        return found

    def plan(self, table: Table) -> Plan | None:
        """The steps of ``table``'s messages; None when it has nothing to shape."""
        if not self.active:
            return None
        sink = self.sink
        index, config = self._tables.get(table.qualified, (-1, None))
        if config is None and sink.table == table.qualified:
            config = TableConfig(name=table.qualified)  # the older single-table form: its filters
        where = f"{self._path}.tables[{index}]" if index >= 0 else self._path
        filters = [*(sink.filters if sink.table == table.qualified else ()), *(config.filters if config else ())]
        conditions = list(config.where) if config else []
        rows = RowFilter(conditions, filters, table, where) if conditions or filters else None
        callables: list[tuple[str, Function]] = []
        if self._filter is not None and isinstance(sink.filter, FilterFunction):
            callables.append((sink.filter.python, self._filter))
        if config is not None and isinstance(config.filter, FilterFunction):
            callables.append((config.filter.python, self._functions[config.filter.python]))
        columns = (ColumnShaper(config.columns, self._secret, table, f"{where}.columns")
                   if config is not None and config.columns is not None else None)
        routing = config.routing if config is not None and config.routing is not None else sink.routing
        enrichment = config.enrichment if config is not None and config.enrichment is not None else sink.enrichment
        toast = config.toast if config is not None and config.toast is not None else sink.toast
        if not (rows or callables or columns or self._transform or _given(routing) or _given(enrichment)
                or toast != "placeholder" or sink.envelope != "sequin"):
            return None
        route_spec = routing if isinstance(routing, (SubjectRouting, RoutingFunction)) else None
        route_key = (f"{where}.routing" if config is not None and config.routing is not None
                     else f"{self._path}.routing")
        if isinstance(route_spec, SubjectRouting):
            _check_templates(route_spec, route_key, table,
                             table.columns if columns is None else columns.published)
        id_hash = None
        if columns is not None and columns.masks_key:
            if self._secret is None:
                raise FatalError(
                    f"{where}.columns: a key column of table {table.qualified} is masked, so a backfill's read ids "
                    "(which name the row's key) hide it with a keyed hash: set walflow.mask_secret")
            id_hash = KeyedHash(self._secret.encode())
        router = Router(route_spec, self._load(route_spec, route_key), sink, self.database.name,
                        self._stream_subjects, key=route_key, dead_letter_key=f"{self._path}.dead_letter_subject")
        enriched = enrichment if isinstance(enrichment, Enrichment) else None
        plain = (columns is None and self._transform is None and enriched is None and toast == "placeholder"
                 and sink.envelope == "sequin")
        return Plan(toast, enriched, rows, tuple(callables), columns, self._transform, router, id_hash, plain)


#: A template's placeholder of a row's column: ``{record.COLUMN}`` or ``{record.COLUMN.KEY…}``.
_RECORD = re.compile(r"\{record\.([^.}]+)")


def _check_templates(routing: SubjectRouting, key: str, table: Table, published: tuple[str, ...]) -> None:
    """A template naming a column the table does not publish could route no row: stop, naming
    the key, whatever ``on_error`` says (every row would be a dead letter)."""
    for where, template in ((f"{key}.subject", routing.subject),
                            *((f"{key}.headers.{name}", value) for name, value in routing.headers.items())):
        for column in _RECORD.findall(template):
            if column not in published:
                raise FatalError(f"{where}: '{{record.{column}}}' names no published column of table "
                                 f"{table.qualified} (published: {', '.join(published)})")


def _given(spec: object) -> bool:
    return spec is not None and spec != "none"
