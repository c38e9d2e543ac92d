"""Conversion: a change's column texts to Python values, through the loaders its table carries.

A stage of its own so that it can run wherever the flow puts it: the source's worker does
everything that must be serial (framing, positions, the group key) on texts, and this —
with the envelope, the CPU-heavy part — can follow the exchange to the worker that owns
the key. It needs nothing but the change: the :class:`core.events.Table` the change refers
to holds a loader per column.

- A value a loader cannot represent (``infinity`` dates, BC or year-10000 timestamps)
  falls back to its text, exactly: nothing is lost and the pipeline does not stop. So does
  a value whose loader fails in a way nobody foresaw (a value is anyone's to write): any
  exception but MemoryError (the process is short of memory, not the value unreadable; it
  stops, nothing past the change is confirmed, and a restart loses nothing). One warning
  per table and column and process says so (:func:`core.once.warn_once`), naming the exception's
  type, never the value: conversion never stops the flow, nor fills the log. The text is
  exact for a UTF-8 database (a ``SQL_ASCII`` one's bytes that are not UTF-8 are replaced).
- ``None`` (NULL) and ``UNCHANGED_TOAST`` pass as they are.
- A key-only old row (``old_is_key``, under REPLICA IDENTITY DEFAULT): a delete's has
  every column, those Postgres did not send as None (Sequin's ``record`` of a delete); an
  update that changed the key reports the replica identity's columns only, since the
  others' old values are unknown, not NULL.
- ``pks``: the key columns' texts (Sequin's ``record_pks``) from the new row, or a
  delete's old row.
"""

from __future__ import annotations

import logging
from datetime import datetime

from core.events import (
    UNCHANGED_TOAST,
    UNCHANGED_TOAST_MARKER,
    Action,
    Change,
    RawChange,
    RawRow,
    ReadOf,
    Row,
    Table,
    new_tuple,
)
from core.once import warn_once

log = logging.getLogger("walflow.transforms.convert")


def as_text(value: bytes, column: str, exc: Exception) -> str:
    """``value``, which its loader could not convert (``exc``), as its Postgres text, with
    :func:`warn_once`'s line for ``column`` (``public.orders.day``, an enrichment's column)."""
    warn_once(log, ("column", column), "%s: a value could not be converted (%s): published as its Postgres text",
              column, type(exc).__name__)
    return value.decode("utf-8", "replace")


def convert_row(table: Table, raw: RawRow) -> Row:
    """``raw`` (column texts in the table's column order) as ``{column: value}``."""
    out: Row = {}
    # zip without strict=: the decoder made ``raw`` with exactly the table's columns
    for name, load, value in zip(table.columns, table.loaders, raw):  # noqa: B905
        if type(value) is bytes:
            try:
                out[name] = load(value)
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - not swallowed: the exact text is published, and said once
                out[name] = as_text(value, f"{table.qualified}.{name}", exc)
        else:
            out[name] = value
    return out


def _key_row(table: Table, raw: RawRow) -> Row:
    row = convert_row(table, raw)
    keys = table.identity_columns
    return {name: value for name, value in row.items() if name in keys}


def _pks(table: Table, raw: RawRow, old: RawRow | None) -> tuple[str, ...]:
    texts = []
    for i in table.key_positions:
        value = raw[i]
        if value is UNCHANGED_TOAST and old is not None:
            value = old[i]
        if type(value) is bytes:
            texts.append(value.decode("utf-8", "replace"))
        else:  # Sequin's to_string: nil is ""
            texts.append(UNCHANGED_TOAST_MARKER if value is UNCHANGED_TOAST else "")
    return tuple(texts)


def convert(change: RawChange) -> Change:
    """``change`` with its values converted."""
    return convert_fields(*change)


def convert_fields(action: Action, table: Table, raw_new: RawRow | None, raw_old: RawRow | None, old_is_key: bool,
                   commit_lsn: int, commit_idx: int, commit_ts: datetime, xid: int, read: ReadOf | None = None,
                   annotations: bytes | None = None) -> Change:
    """A :class:`RawChange`'s fields (in its order) converted: what a sink partition calls
    with the fields of a packed change (``transforms/render.py``), without building the
    ``RawChange`` between."""
    new = None if raw_new is None else convert_row(table, raw_new)
    if raw_old is None:
        old = None
    elif old_is_key and action == "update":
        old = _key_row(table, raw_old)
    else:
        old = convert_row(table, raw_old)
    keyed = raw_new if raw_new is not None else raw_old
    pks = () if keyed is None or not table.key_positions else _pks(table, keyed, raw_old)
    return new_tuple(Change, (action, table.schema, table.name, table.key_columns, new, old, commit_lsn, commit_idx,
                              commit_ts, xid, read, annotations, pks))
