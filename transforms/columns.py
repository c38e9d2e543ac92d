"""Which columns a table's messages publish, under which names, and masked how (``Columns`` in ``config/shaping.py``).

One :class:`ColumnShaper` per table version and table config: it checks the config against
the table's real columns once, when the version is first seen, and turns it into a plan.
What runs per row is then a loop over that plan. The config's own checks cannot see the
table, so these can: a name the table does not have, a rename onto the name of another
published column (one of them would be lost), and a key column left out. A key column must
stay published: ``record_pks`` and a backfill's ids are built from it, so a left-out key
would still publish its value in clear there, and masking keeps rows identifiable without
showing it.

**Order**: include/exclude, then rename, then mask; the table's column order is kept. A row
without some columns (a key-only old row, a TOASTed column an update did not send) yields a
row without them. NULL, ``UNCHANGED_TOAST`` and an oversized value's marker are not masked:
they hold no data (the marker, a size only, is published as it is).

**A value's text** is what a mask works on (:func:`value_text`): a str as it is, else its JSON
text without the quotes of a JSON string, so a uuid's text is Postgres's, an integer's
``7`` is its ``record_pks`` text ``7``, and a hash of the key in ``record`` equals the hash in
``record_pks``. A numeric is written in positional digits (``0.00000001``), as Postgres
prints it and the envelope publishes it. For other key types Postgres's text (the one
``record_pks`` carries) can differ from the JSON text — ``t`` and ``true`` for a boolean, a
timestamp's space and ``+00`` — and so can their hashes. A json value held as its text (a
:class:`core.events.JsonText`: nested too deep for Python's values) is that text, as
Postgres printed it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

import orjson
from pydantic_core import PydanticSerializationError, to_json

from config.shaping import Columns, Mask
from core.errors import FatalError
from core.events import UNCHANGED_TOAST, JsonText, OversizedValue, Row, Table
from core.keyed_hash import KeyedHash

#: What a ``redact`` mask publishes in place of a value.
REDACTED: Final = "[redacted]"

#: A mask on a value's text.
TextMask = Callable[[str], str]


def value_text(value: Any) -> str:
    """``value``'s text (see the module docstring); not for None or ``UNCHANGED_TOAST``."""
    if isinstance(value, str):
        return value
    kind = type(value)
    if kind is UUID:
        return str(value)
    if kind is Decimal:
        return format(value, "f")
    if kind is JsonText:
        text: bytes = value.text
        return text.decode("utf-8", "replace")
    try:
        encoded = to_json(value, fallback=str)
    except PydanticSerializationError:
        # a json column's lone surrogate (json.loads keeps it; UTF-8 cannot hold it)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    if encoded[:1] != b'"':
        return encoded.decode()
    decoded: str = orjson.loads(encoded)
    return decoded


def _text_mask(mask: Mask, secret: str) -> TextMask:
    """The function ``mask`` applies to a value's text; ``secret`` keys a hash."""
    kind = mask.kind
    if kind == "hash":
        keyed = KeyedHash(secret.encode())

        def hashed(text: str) -> str:
            # surrogatepass: a lone surrogate (possible in a json column) hashes instead of raising
            return keyed.hexdigest(text.encode("utf-8", "surrogatepass"))

        return hashed
    if kind == "redact":
        return lambda _text: REDACTED
    if kind == "truncate":
        length = mask.truncate or 0
        return lambda text: text[:length]
    if kind == "keep_first":
        first = mask.keep_first or 0
        return lambda text: text[:first] + "*" * (len(text) - first)
    last = mask.keep_last or 0
    return lambda text: "*" * (len(text) - last) + text[max(len(text) - last, 0):]


def _value_mask(mask: TextMask) -> Callable[[Any], str]:
    return lambda value: mask(value if type(value) is str else value_text(value))


class ColumnShaper:
    """One table version's ``columns:``: what :meth:`row` and :meth:`pks` publish."""

    __slots__ = ("_by_name", "_key_masks", "_left_out", "_masks", "_plan", "_projects", "masks_key", "published")

    def __init__(self, columns: Columns, default_secret: str | None, table: Table, path: str) -> None:
        """``default_secret``: ``walflow.mask_secret``, the key of hashes without their own;
        ``path``: where ``columns`` is in the config (``sinks[0].tables[1].columns``), for errors.
        FatalError when the config does not fit ``table``."""
        names = table.columns
        listed = [(f"include[{i}]", name) for i, name in enumerate(columns.include or ())]
        listed += [(f"exclude[{i}]", name) for i, name in enumerate(columns.exclude)]
        listed += [(f"{key}.{name}", name) for key in ("rename", "mask") for name in getattr(columns, key)]
        for key, name in listed:
            if name not in table.positions:
                raise FatalError(f"{path}.{key}: table {table.qualified} has no column '{name}' (its columns: "
                                 f"{', '.join(names)}): correct the name, or remove it")
        include = None if columns.include is None else set(columns.include)
        exclude = set(columns.exclude)
        published = [name for name in names if (include is None or name in include) and name not in exclude]
        for name in table.key_columns:
            if name not in published:
                key = "exclude" if name in exclude else "include"
                raise FatalError(
                    f"{path}.{key}: '{name}' is a key column of table {table.qualified} (key: "
                    f"{', '.join(table.key_columns)}) and must be published: mask it instead (mask: {{{name}: hash}}); "
                    "record_pks and backfill ids must still identify rows, and a left-out key would still show its "
                    "value in record_pks in clear")
        renamed = [columns.rename.get(name, name) for name in published]
        for name, new in columns.rename.items():
            if renamed.count(new) > 1:
                raise FatalError(f"{path}.rename.{name}: '{new}' is also the published name of another column of "
                                 f"table {table.qualified}: choose another name, or leave that column out")
        text_masks: dict[str, TextMask] = {}
        for name, mask in columns.mask.items():
            secret = default_secret if mask.secret is None else mask.secret.get_secret_value()
            if secret is None and mask.kind == "hash":
                raise FatalError(f"{path}.mask.{name}: a hash needs a secret: set walflow.mask_secret (e.g. "
                                 "${WALFLOW_MASK_SECRET}) or the mask's secret:")
            text_masks[name] = _text_mask(mask, secret or "")
        masks = {name: _value_mask(mask) for name, mask in text_masks.items()}
        #: Per published column, in the table's order: its name, the name it is published under, its mask.
        self._plan = tuple((name, new, masks.get(name)) for name, new in zip(published, renamed, strict=True))
        #: Whether a row is rebuilt (columns left out or renamed), or only copied when a mask applies.
        self._projects = len(published) < len(names) or bool(columns.rename)
        self._masks = tuple((name, masks[name]) for name in published if name in masks)
        self._key_masks = tuple(text_masks.get(names[i]) for i in table.key_positions)
        #: Whether some key column is masked (``record_pks`` and a backfill's row ids then change too).
        self.masks_key = any(mask is not None for mask in self._key_masks)
        #: The names the published columns have (what templates and transforms see).
        self.published = tuple(renamed)
        self._by_name = masks
        self._left_out = frozenset(names) - set(published)

    def foreign(self, row: Row) -> Row:
        """A row of another source about this one (an enrichment query's result): its columns named
        like a masked column of the table masked the same way, like a left-out one left out — the
        query may select them again (it must select the key)."""
        if not row or not (self._by_name or self._left_out):
            return row
        out: Row = {}
        for name, value in row.items():
            if name in self._left_out:
                continue
            mask = self._by_name.get(name)
            out[name] = value if mask is None or value is None else mask(value)
        return out

    def row(self, row: Row) -> Row:
        """``row`` as published: ``record``, ``changes``, Debezium's ``before`` and ``after``. Never
        changes ``row``; returns ``row`` itself when nothing applies to it."""
        if not self._projects:
            out = row
            for name, mask in self._masks:
                value = row.get(name)
                if value is not None and value is not UNCHANGED_TOAST and type(value) is not OversizedValue:
                    if out is row:
                        out = row.copy()
                    out[name] = mask(value)
            return out
        shaped: Row = {}
        for name, new, masked in self._plan:
            if name in row:
                value = row[name]
                shaped[new] = (value if masked is None or value is None or value is UNCHANGED_TOAST
                               or type(value) is OversizedValue else masked(value))
        return shaped

    def pks(self, pks: tuple[str, ...]) -> tuple[str, ...]:
        """``record_pks`` as published (the key columns' texts, in column order): masked key columns masked."""
        if not self.masks_key or not pks:
            return pks
        return tuple(text if mask is None else mask(text) for text, mask in zip(pks, self._key_masks, strict=True))
