"""Row filters: whether a change is published, by ``where`` conditions and by Sequin's column filters.

A :class:`RowFilter` is built once per table version (``transforms/shape.py``): it checks every
column a condition names against the table's columns (a misspelt column would otherwise filter
out every row, silently) and precompiles what it can (regular expressions, each literal in the
forms a value may need). Per change it runs one closure per condition; a change is published
when all of them hold.

The contract:

- Both kinds see the row as the database has it, before ``columns:`` leaves out, renames or
  masks anything: ``record`` and ``changes`` as ``transforms/record.py`` makes them, and the
  change's old row.
- **Unknown makes every operator false** (a column the row does not hold, ``UNCHANGED_TOAST``,
  a value too large to publish, ``old:`` without an old row), and so does a comparison that
  cannot be made (ordering against NULL, a literal that does not read as the value's type).
- **A literal is read as the value's type**; ``matches`` is an RE2 search on the value's text
  (:func:`transforms.columns.value_text`), linear in the text whatever the pattern.
- **Sequin's column filters** (``filters``) run as Sequin's ``column_filters_match_message?``,
  their literal cast as Sequin casts it: one Sequin refuses to load is a FatalError here.
- A ``path``/``field_path`` into a json value held as its text (:class:`core.events.JsonText`)
  raises :class:`RowFilterError`; the change then follows the sink's ``on_error``.

Each operator's rules, and where Python's comparison differs from Elixir's term ordering:
``docs/design.md``, *transforms/conditions.py*.
"""

from __future__ import annotations

import operator as op
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

from config.shaping import ColumnFilter, Condition, matches_pattern
from connectors.postgres.types import MAX_JSON_DEPTH
from core.errors import FatalError, ValueFree
from core.events import UNCHANGED_TOAST, UNCHANGED_TOAST_MARKER, JsonText, OversizedValue, Row, Table
from transforms.columns import value_text
from transforms.record import differs

#: One condition on a change: ``(action, record, changes, old) -> holds``.
Check = Callable[[str, Row, Row | None, Row | None], bool]
#: A condition's operator on the value it read (never an unknown one).
_Test = Callable[[Any], bool]
_Compare = Callable[[Any, Any], Any]

#: A value the change does not tell (see the module docstring): every operator is false on it.
_UNKNOWN: Final = object()
#: A literal Sequin would refuse as the type it is cast to.
_FAIL: Final = object()

_ORDERINGS: Final[dict[str, _Compare]] = {"gt": op.gt, "gte": op.ge, "lt": op.lt, "lte": op.le}
_COMPARISONS: Final[dict[str, _Compare]] = {"eq": op.eq, "ne": op.ne, **_ORDERINGS}


class RowFilterError(ValueFree, ValueError):
    """A condition cannot be decided for one change (a path into a json value held as its
    text): the sink's ``on_error`` applies. Names the condition's key and column, never a value."""


def _opaque(key: str, column: str) -> RowFilterError:
    return RowFilterError(f"{key}: column {column} holds a json value nested deeper than {MAX_JSON_DEPTH} levels (or "
                          "holding a number beyond a double, or a lone surrogate escape), which is published as its "
                          "text and which a path cannot look into")


class RowFilter:
    """One table version's ``where`` conditions and Sequin column filters: true for the changes published."""

    __slots__ = ("_checks",)

    def __init__(self, where: list[Condition], filters: list[ColumnFilter], table: Table, path: str) -> None:
        """``path``: where the conditions are in the config (``sinks[0].tables[0]``), for errors.
        FatalError when a condition names a column ``table`` does not have, or a filter's
        literal is one Sequin refuses."""
        checks = [_condition(condition, table, f"{path}.where[{i}]") for i, condition in enumerate(where)]
        checks += [_column_filter(spec, table, f"{path}.filters[{i}]") for i, spec in enumerate(filters)]
        self._checks = tuple(checks)

    def __call__(self, action: str, record: Row, changes: Row | None, old: Row | None) -> bool:
        """Whether the change is published: ``record`` and ``changes`` as Sequin shows them, ``old``
        the change's old row."""
        for check in self._checks:
            if not check(action, record, changes, old):
                return False
        return True


def _no_column(key: str, column: str, table: Table) -> FatalError:
    return FatalError(f"{key}: table {table.qualified} has no column '{column}' (its columns: "
                      f"{', '.join(table.columns)}): correct the name (a condition on a column the table does not "
                      "have would drop every row)")


# -- conditions ------------------------------------------------------------------------------


def _condition(condition: Condition, table: Table, key: str) -> Check:
    if condition.any is not None:
        alternatives = tuple(_condition(each, table, f"{key}.any[{i}]") for i, each in enumerate(condition.any))

        def any_of(action: str, record: Row, changes: Row | None, old: Row | None) -> bool:
            return any(check(action, record, changes, old) for check in alternatives)

        return any_of
    column = condition.column
    if column is None or column not in table.positions:
        raise _no_column(f"{key}.column", str(column), table)
    operator = condition.operator
    if operator == "changed":
        return _changed(column, bool(condition.changed))
    test = _test(operator, getattr(condition, operator))
    keys = tuple(condition.path.split(".")) if condition.path else ()
    if condition.old:

        def before(action: str, record: Row, changes: Row | None, old: Row | None) -> bool:
            row = old if action == "update" else record if action == "delete" else None
            if row is None:
                return False
            value = _value(row, column, keys, key)
            return value is not _UNKNOWN and test(value)

        return before

    def after(action: str, record: Row, changes: Row | None, old: Row | None) -> bool:
        value = _value(record, column, keys, key)
        return value is not _UNKNOWN and test(value)

    return after


def _value(row: Row, column: str, keys: tuple[str, ...], key: str) -> Any:
    """The value a condition tests (``key`` names it, for the error a path into a JsonText raises)."""
    value = row.get(column, _UNKNOWN)
    if value is _UNKNOWN or value is UNCHANGED_TOAST or type(value) is OversizedValue:
        return _UNKNOWN
    if keys and type(value) is JsonText:
        raise _opaque(key, column)
    for step in keys:
        value = value.get(step) if type(value) is dict else None
    return value


def _changed(column: str, want: bool) -> Check:
    if want:

        def changed(action: str, record: Row, changes: Row | None, old: Row | None) -> bool:
            return action == "update" and changes is not None and column in changes

        return changed

    def unchanged(action: str, record: Row, changes: Row | None, old: Row | None) -> bool:
        return (action == "update" and changes is not None and old is not None and column in old
                and column not in changes)

    return unchanged


def _test(operator: str, operand: Any) -> _Test:
    if operator == "is_null":
        null = bool(operand)
        return lambda value: (value is None) is null
    if operator == "matches":
        search = matches_pattern(operand).search  # bytes: RE2 finds no str offsets to map back
        return lambda value: value is not None and search(
            (value if type(value) is str else value_text(value)).encode("utf-8", "surrogatepass")) is not None
    if operator in ("in_", "not_in"):
        return _membership(operator == "in_", [_Literal(item) for item in operand])
    if operand is None:
        if operator == "eq":
            return lambda value: value is None
        if operator == "ne":
            return lambda value: value is not None
        return lambda value: False
    literal = _Literal(operand)
    compare = _COMPARISONS[operator]
    if operator == "ne":
        return lambda value: value is None or literal.compare(value, compare)
    return lambda value: value is not None and literal.compare(value, compare)


def _membership(inside: bool, literals: list[_Literal]) -> _Test:
    null = any(literal.raw is None for literal in literals)
    given = [literal for literal in literals if literal.raw is not None]
    texts = frozenset(literal.text for literal in given)  # what a text value equals (the common case)

    def member(value: Any) -> bool:
        if value is None:
            return null
        if type(value) is str:
            return value in texts
        return any(literal.compare(value, op.eq) for literal in given)

    if inside:
        return member
    return lambda value: not member(value)


class _Literal:
    """A condition's literal, read once in every form a value may need (None where it does not read so)."""

    __slots__ = ("aware", "boolean", "date", "decimal", "naive", "number", "raw", "text", "time", "uuid")

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.text = value_text(raw)
        number = _number(raw)
        self.number = number
        self.decimal = None if number is None else Decimal(repr(number)) if type(number) is float else Decimal(number)
        self.boolean = raw if type(raw) is bool else {"true": True, "false": False}.get(
            raw.lower()) if type(raw) is str else None
        moment = (raw if type(raw) is datetime else datetime(raw.year, raw.month, raw.day) if type(raw) is date
                  else _read(datetime.fromisoformat, raw))
        self.aware = None if moment is None else moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
        self.naive = (None if moment is None else moment if moment.tzinfo is None
                      else moment.astimezone(UTC).replace(tzinfo=None))
        self.date = raw if type(raw) is date else _read(date.fromisoformat, raw)
        self.time = raw if type(raw) is time else _read(time.fromisoformat, raw)
        self.uuid = raw if type(raw) is UUID else _read(UUID, raw)

    def compare(self, value: Any, compare: _Compare) -> bool:
        """``compare(value, literal)``, the literal read as ``value``'s type; false when it cannot be."""
        operands = self._operands(value)
        if operands is None:
            return False
        try:
            return bool(compare(*operands))
        except (TypeError, ArithmeticError):  # an aware and a naive time; a numeric NaN ordered
            return False

    def _operands(self, value: Any) -> tuple[Any, Any] | None:
        kind = type(value)
        literal: Any
        if kind is str:
            return value, self.text
        if kind is bool:
            literal = self.boolean
        elif kind is int:
            literal = self.number
        elif kind is float:
            literal = self.number
            if type(literal) is Decimal:
                return Decimal(repr(value)), literal
        elif kind is Decimal:
            literal = self.decimal
        elif kind is datetime:
            literal = self.naive if value.tzinfo is None else self.aware
        elif kind is date:
            literal = self.date
        elif kind is time:
            literal = self.time
            if literal is not None and value.tzinfo is not None and literal.tzinfo is None:
                literal = literal.replace(tzinfo=UTC)
        elif kind is UUID:
            return (value, self.uuid) if self.uuid is not None else (str(value), self.text)
        elif kind is type(self.raw):
            return value, self.raw
        else:
            return value_text(value), self.text
        return None if literal is None else (value, literal)


def _number(raw: Any) -> int | float | Decimal | None:
    kind = type(raw)
    if kind is int or kind is float or kind is Decimal:
        number: int | float | Decimal = raw
        return number
    if kind is str:
        try:
            return Decimal(raw)
        except ArithmeticError:  # decimal.InvalidOperation: not a number
            return None
    return None


def _read(parse: Callable[[str], Any], raw: Any) -> Any:
    if type(raw) is not str:
        return None
    try:
        return parse(raw)
    except ValueError:
        return None


# -- Sequin's column filters -----------------------------------------------------------------

#: Sequin's operators (``ColumnFilter.from_external_operator``), by walflow's names.
_SEQUIN_OPERATORS: Final = {
    "=": "eq", "==": "eq", "!=": "ne", ">": "gt", "<": "lt", ">=": "gte", "<=": "lte",
    "in": "in", "not in": "not_in", "not_in": "not_in",
    "is null": "is_null", "is_null": "is_null",
    "not null": "not_null", "is not null": "not_null", "not_null": "not_null", "is_not_null": "not_null",
}
#: The literal's type without ``field_type``, by the type of the column's value (``determine_value_type``).
_SEQUIN_TYPES: Final[dict[type, str]] = {bool: "boolean", int: "number", float: "number", Decimal: "number",
                                         datetime: "datetime", date: "datetime"}
#: What Elixir's ``==`` and ordering treat as one kind of term (numbers across int and float).
_SEQUIN_KINDS: Final[dict[type, type]] = {int: float, float: float, Decimal: float}
#: An Elixir ``Float.parse`` of the whole text (Ecto's ``:float`` cast of a string).
_FLOAT: Final = re.compile(r"[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
#: What to write, per ``field_type``, when Sequin would refuse the literal.
_WRITE: Final = {
    "string": "a string (quoted, '12', for a number's digits)",
    "cistring": "a string (quoted, '12', for a number's digits)",
    "number": "a number (12, 12.5)",
    "boolean": "true or false",
    "datetime": "an ISO 8601 timestamp with its offset (2023-04-13T14:30:00Z)",
    "list": "a list ([a, b]) or a comma-separated string ('a, b')",
}


def _column_filter(spec: ColumnFilter, table: Table, key: str) -> Check:
    column = spec.column_name
    if column not in table.positions:
        raise _no_column(f"{key}.column_name", column, table)
    operator = _SEQUIN_OPERATORS[spec.operator]
    test: Callable[[Any, Any], bool]
    if operator in ("is_null", "not_null"):
        null = operator == "is_null"

        def test(column_value: Any, value: Any) -> bool:
            return (value is None) is null

    elif operator in ("in", "not_in"):
        test = _sequin_membership(operator == "in", _sequin_literal("list", spec, key))
    else:
        test = _sequin_comparison(operator, spec, key)
    lower = spec.field_type == "cistring" and operator in _COMPARISONS
    keys = tuple(spec.field_path.split(".")) if spec.field_path else ()

    def check(action: str, record: Row, changes: Row | None, old: Row | None) -> bool:
        fields = old if action == "delete" else record
        if fields is None:
            return False
        column_value = fields.get(column, _UNKNOWN)
        if column_value is _UNKNOWN:
            return False
        if type(column_value) is OversizedValue:  # compared as the text published in its place
            column_value = column_value.text
        value = column_value
        if type(value) is UUID:
            value = str(value)
        if type(value) is str:
            if lower:
                value = value.lower()
        elif keys and type(value) is dict:
            for step in keys:
                value = value.get(step) if type(value) is dict else None
        elif keys and type(value) is JsonText:
            raise _opaque(key, column)
        return test(column_value, value)

    return check


def _sequin_literal(kind: str, spec: ColumnFilter, key: str) -> Any:
    """``spec``'s literal cast as ``kind``; FatalError where Sequin refuses it."""
    literal = _sequin_cast(kind, spec.comparison_value)
    if literal is _FAIL:
        raise FatalError(f"{key}.comparison_value: {spec.comparison_value!r} is not a {kind} for operator "
                         f"'{spec.operator}' (Sequin refuses it too): write {_WRITE[kind]}")
    return literal


def _sequin_cast(kind: str, raw: Any) -> Any:
    """Sequin's literal of ``kind`` (its ``*Value`` schemas, through Ecto's casts), or _FAIL."""
    if kind in ("string", "cistring"):
        if type(raw) is not str:
            return _FAIL
        return raw.lower() if kind == "cistring" else raw
    if kind == "number":
        if type(raw) in (int, float) or (type(raw) is str and _FLOAT.fullmatch(raw)):
            try:
                return float(raw)
            except OverflowError:  # an integer beyond a float
                return _FAIL
        return _FAIL
    if kind == "boolean":
        if type(raw) is bool:
            return raw
        return raw.lower() == "true" if type(raw) is str and raw.lower() in ("true", "false") else _FAIL
    if kind == "datetime":
        moment = raw if type(raw) is datetime else _read(datetime.fromisoformat, raw)
        if moment is None or moment.tzinfo is None:
            return _FAIL
        return moment.astimezone(UTC).replace(microsecond=0)
    if type(raw) is str:  # "list", as from_external splits a string
        text = raw.strip().lstrip("[").lstrip("{").rstrip("]").rstrip("}")
        return [item.strip() for item in text.split(",")]
    return list(raw) if type(raw) is list else _FAIL


def _sequin_comparison(operator: str, spec: ColumnFilter, key: str) -> Callable[[Any, Any], bool]:
    compare = _COMPARISONS[operator]
    if spec.comparison_value is None:
        raise FatalError(f"{key}.comparison_value: operator '{spec.operator}' needs a comparison_value (Sequin "
                         "refuses it too)")
    if spec.field_type == "datetime":
        moment = _sequin_literal("datetime", spec, key)
        return lambda column_value, value: _sequin_moment(value, moment, compare)
    ne = operator == "ne"
    if spec.field_type is not None:
        literal = _sequin_literal(spec.field_type, spec, key)
        decimal = Decimal(repr(literal)) if type(literal) is float else None
        return lambda column_value, value: (ne if value is None or value is UNCHANGED_TOAST
                                            else _sequin_compare(value, literal, decimal, compare, ne))
    casts = {kind: _sequin_cast(kind, spec.comparison_value) for kind in ("string", "number", "boolean", "datetime")}
    if all(cast is _FAIL for cast in casts.values()):
        raise FatalError(f"{key}.comparison_value: {spec.comparison_value!r} fits no column type (Sequin refuses it "
                         "too): write a string, a number, true or false, or an ISO 8601 timestamp with its offset")
    literals = {kind: (cast, Decimal(repr(cast)) if type(cast) is float else None) for kind, cast in casts.items()}

    def inferred(column_value: Any, value: Any) -> bool:
        if value is None or value is UNCHANGED_TOAST:
            return ne
        literal, decimal = literals[_SEQUIN_TYPES.get(type(column_value), "string")]
        if literal is _FAIL:
            return False
        if type(literal) is datetime:
            return _sequin_moment(value, literal, compare)
        return _sequin_compare(value, literal, decimal, compare, ne)

    return inferred


def _sequin_compare(value: Any, literal: Any, decimal: Decimal | None, compare: _Compare, ne: bool) -> bool:
    kind = type(value)
    if _SEQUIN_KINDS.get(kind, kind) is not _SEQUIN_KINDS.get(type(literal), type(literal)):
        return ne  # Elixir: never equal; ordered by kind, which is not followed here (module docstring)
    try:
        return bool(compare(value, decimal if kind is Decimal else literal))
    except (TypeError, ArithmeticError):  # maps ordered; a numeric NaN ordered
        return False


def _sequin_moment(value: Any, literal: datetime, compare: _Compare) -> bool:
    kind = type(value)
    if kind is date:
        value = datetime(value.year, value.month, value.day, tzinfo=UTC)
    elif kind is datetime:
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
    else:
        return False  # Sequin raises (DateTime.compare of another term)
    return bool(compare(value, literal))


def _sequin_membership(inside: bool, items: list[Any]) -> Callable[[Any, Any], bool]:
    texts = frozenset(text for item in items if (text := _elixir_text(item)) is not None)

    def member(column_value: Any, value: Any) -> bool:
        text = _elixir_text(value)
        if text is not None:
            return text in texts
        return any(not differs(value, item) for item in items)  # Elixir's `in`: strict equality

    if inside:
        return member
    return lambda column_value, value: not member(column_value, value)


def _elixir_text(value: Any) -> str | None:
    """Elixir's ``to_string`` of Sequin's form of ``value``; None where it raises (maps, lists)."""
    kind = type(value)
    if kind is str:
        text: str = value
        return text
    if value is None:
        return ""
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is Decimal:
        return str(value)  # Python's and Elixir's Decimal both write the spec's scientific string
    if kind is float:
        return repr(value)
    if value is UNCHANGED_TOAST:
        return UNCHANGED_TOAST_MARKER
    if kind is datetime:  # Sequin's are Ecto's *_usec types: six digits; timestamptz in UTC
        if value.tzinfo is None:
            return str(value.isoformat(" ", "microseconds"))
        return str(value.astimezone(UTC).isoformat(" ", "microseconds")[:-6]) + "Z"
    if kind is date:
        return str(value.isoformat())
    if kind is time:  # Ecto's :time: whole seconds
        return str(value.replace(microsecond=0, tzinfo=None).isoformat())
    return None
