"""A change's ``record`` and ``changes``, as Sequin shows them, under a table's TOAST policy.

Shared by the envelope's shaped path, the row filters, transforms and routing
(``transforms/render.py``): every step that looks at a message's row sees the same one.
The envelope's unshaped path computes the same inline (the ``placeholder`` policy), on the
hot path.

- ``record``: the new row (insert, update, read) or the old row (delete).
- ``changes``: for an update whose old row Postgres sent, the old value of each column whose
  value differs (Sequin's comparison, :func:`differs`); ``{}`` for an update without it;
  None otherwise.
- **TOAST** (``config/shaping.py``, ``ToastPolicy``): an update that left a TOASTed column
  alone sends no new value for it. ``placeholder``: the old row's value where Postgres sent
  one (REPLICA IDENTITY FULL), else the marker; ``omit``: the column left out; ``old``: the
  old row's value where sent, else left out. ``changes`` never lists such a column (its
  new value is unknown).
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from config.shaping import ToastPolicy
from core.events import UNCHANGED_TOAST, Change, Row


def record_and_changes(change: Change, toast: ToastPolicy = "placeholder") -> tuple[Row, Row | None]:
    """``change``'s ``record`` and ``changes`` (see the module docstring)."""
    action = change.action
    if action == "delete":
        return change.old or {}, None
    if action != "update":
        return change.new or {}, None
    new, old = change.new or {}, change.old
    record = new
    if UNCHANGED_TOAST in new.values():
        if toast == "omit" or (toast == "old" and old is None):
            record = {name: value for name, value in new.items() if value is not UNCHANGED_TOAST}
        elif old is not None:
            record = {name: old[name] if value is UNCHANGED_TOAST and name in old else value
                      for name, value in new.items()}
            if toast == "old":
                record = {name: value for name, value in record.items() if value is not UNCHANGED_TOAST}
    return record, {} if old is None else changed_values(new, old)


def changed_values(new: Row, old: Row) -> Row:
    """The old values of the columns whose value differs; a TOASTed untouched column is unknown, left out."""
    return {
        name: before
        for name, before in old.items()
        if (after := new.get(name, UNCHANGED_TOAST)) is not UNCHANGED_TOAST and differs(before, after)
    }


def differs(before: Any, after: Any) -> bool:
    """Whether a column changed, as Sequin compares (Elixir's strict equality): the same type
    and value, recursively, so ``1`` → ``1.0`` in a jsonb, ``true`` → ``1`` and numeric
    ``1.0`` → ``1.00`` are changes; NaN stays NaN (Sequin compares the text "NaN")."""
    return not _same(before, after)


def _same(before: Any, after: Any) -> bool:
    kind = type(before)
    if kind is not type(after):
        return False
    if kind is list:
        return len(before) == len(after) and all(_same(b, a) for b, a in zip(before, after, strict=True))
    if kind is dict:
        return before.keys() == after.keys() and all(_same(value, after[key]) for key, value in before.items())
    if kind is Decimal:
        return bool(before.as_tuple() == after.as_tuple())  # digits and scale, as Postgres prints them
    if kind is float:
        return before == after or (math.isnan(before) and math.isnan(after))
    return bool(before == after)
