"""What pgoutput says about a table and a type, before any catalog lookup.

The decoder builds these from Relation (``R``) and Type (``Y``) messages and hands them to
the catalog (:class:`connectors.postgres.types.Catalog`), which turns a relation into a
:class:`core.events.Table` with a loader per column.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Column:
    """One published column. ``is_key``: part of the replica identity (every column under FULL)."""

    name: str
    type_oid: int
    typmod: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    """``R``: the shape the following changes to table ``relid`` use (replaces any earlier one)."""

    relid: int
    namespace: str
    name: str
    #: ``d`` default (primary key), ``n`` nothing, ``f`` full, ``i`` index.
    replica_identity: str
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class TypeName:
    """``Y``: a column type with an OID of 10000 or more; for a domain, its *base* type's name."""

    oid: int
    namespace: str
    name: str
