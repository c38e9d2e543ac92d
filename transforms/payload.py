"""A sink's transform: the payload published in place of the envelope (``transform:``, ``config/shaping.py``).

Two kinds, as Sequin's ``to_external``:

- **a path transform** (Sequin's path function): the value at a dotted path of the message
  (``record``, ``record.address.city``, ``metadata.table_name``), found as Sequin's
  ``traverse_path`` finds it (:func:`path_value`);
- **a Python transform**: ``fn(action, record, changes, metadata)`` (Sequin's Elixir transform,
  rewritten), whose return value is the payload.

**The payload** is the value as JSON, as Sequin's NATS sink publishes it: a string as a JSON
string (quoted), None as ``null``, values written as the envelope writes them
(:func:`transforms.envelope.encode_json`). Datetimes follow ``timestamp_format`` as Sequin
applies it: a path into ``metadata`` writes them ISO, one into ``record`` or ``changes`` as
``timestamp_format`` says; a Python transform's value as ``timestamp_format`` says throughout
(where that differs from Sequin: ``docs/design.md``, *transforms/payload.py*).

**Failures** raise :class:`TransformError`, its cause chained; render applies the sink's
``on_error``. Messages name the transform and the kind of value, never a row's value: a dead
letter carries the message and must carry no row values.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, Final, Literal

from config.shaping import PathTransform, TransformFunction
from connectors.postgres.types import MAX_JSON_DEPTH
from core.errors import ValueFree
from core.events import JsonText, Row
from transforms.envelope import NotJSON, a_type, encode_json

#: What a Python transform is: Sequin's ``(action, record, changes, metadata)``, any JSON value back.
TransformCallable = Callable[[str, Row, Row | None, dict[str, Any]], Any]

#: Where a key looked up gives None, not an error: a list (Sequin does not index lists), and
#: the values that are Elixir structs in Sequin's message (DateTime, NaiveDateTime, Date,
#: Time, Decimal): maps there, without such keys.
_NO_KEY_IS_NONE: Final = (list, datetime, date, time, Decimal)


class TransformError(ValueFree, ValueError):
    """A transform failed for one message: its function raised, it returned a value that is not
    JSON, or its path went through a value that has no keys. The cause is chained. Its text is
    walflow's, from names and types only (never a value, nor a key of a returned value, nor
    the function's own message): dead letters say it as it is."""


def path_value(path: str, action: str, record: Row, changes: Row | None, metadata: dict[str, Any]) -> Any:
    """The value at ``path`` of the message, as Sequin's ``PathFunction.apply`` finds it: each
    dot-separated key is looked up in the value so far; a key that is missing or holds null
    gives None, and so does a key looked up in a list (Sequin does not index lists) or in a
    timestamp, date, time or decimal (structs, maps without such keys, in Sequin). A key looked
    up in any other value (a string, a number, a bool, the action) raises TypeError: Sequin's
    function has no clause for it and fails the message too; so does one looked up in a json
    value held as its text (a JsonText, nested too deep for Python's values), which Sequin
    would look into: the message follows ``on_error`` rather than publish a wrong null."""
    keys = path.split(".")
    value: Any = {"record": record, "changes": changes, "action": action, "metadata": metadata}
    for i, key in enumerate(keys):
        if isinstance(value, dict):
            value = value.get(key)
            if value is None:
                return None
        elif isinstance(value, _NO_KEY_IS_NONE):
            return None
        elif type(value) is JsonText:
            raise TypeError(f"path {path}: {'.'.join(keys[:i])} is a json value nested deeper than {MAX_JSON_DEPTH} "
                            "levels (or holding a number beyond a double), held as its text: a path cannot look into it")
        else:  # not the value: it may be a row's, and the message can end in a dead letter
            raise TypeError(f"path {path}: {'.'.join(keys[:i])} is {a_type(value)}, which has no keys "
                             "(Sequin's path function fails on it too)")
    return value


class Transformer:
    """A sink's transform, from its config and (for ``python:``) the callable render loaded:
    called as ``(action, record, changes, metadata)``, it returns the payload's bytes."""

    __slots__ = ("_function", "_path", "_unix", "name")

    def __init__(self, spec: PathTransform | TransformFunction, function: TransformCallable | None,
                 timestamp_format: Literal["iso8601", "unix_microsecond"]) -> None:
        """``function``: the callable ``spec.python`` names (None for a path transform);
        ``timestamp_format``: the sink's."""
        unix = timestamp_format == "unix_microsecond"
        if isinstance(spec, PathTransform):
            if function is not None:
                raise ValueError(f"transform path {spec.path}: a path transform takes no function")
            #: The path (a Python transform has none).
            self._path = spec.path
            self._unix = unix and spec.path.split(".")[0] != "metadata"  # see the module's docstring
            #: How errors name it: ``path record.id``, or the import path.
            self.name = f"path {spec.path}"
        else:
            if function is None:
                raise ValueError(f"transform {spec.python}: its function was not given")
            self._path = ""
            self._unix = unix
            self.name = spec.python
        self._function = function

    def __call__(self, action: str, record: Row, changes: Row | None, metadata: dict[str, Any]) -> bytes:
        """The payload of one message; :class:`TransformError` if the transform fails for it."""
        function = self._function
        if function is None:
            try:
                value = path_value(self._path, action, record, changes, metadata)
            except TypeError as exc:
                raise TransformError(f"transform {exc}") from exc
        else:
            try:
                value = function(action, record, changes, metadata)
            except Exception as exc:  # whatever the user's function raises fails this message only
                raise TransformError(f"transform {self.name} raised {type(exc).__name__}") from exc
        try:
            return encode_json(value, self._unix)
        except NotJSON as exc:  # where in the value is not said: its keys may be the row's values
            raise TransformError(f"transform {self.name} returned {exc.what}, which is not JSON") from exc
