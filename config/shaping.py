"""The config of what a sink publishes: columns, row filters, transforms, routing, enrichment, envelope, failures.

YAML first, a Python callable where YAML is not enough. Sequin's forms are kept where they
exist: a sink's ``filter``, ``transform``, ``routing`` and ``enrichment`` name a function of
the top-level ``functions:`` list (resolved by :class:`config.schema.Config`), or ``none``;
a table's (or an older single-table sink's) ``filters`` are Sequin's column filters. Each
key may instead hold walflow's form in place, a mapping (``transform: {path: record}``,
``routing: {subject: "..."}``, ``filter: {python: "module:function"}``).

A Sequin function written in Elixir cannot run here: the error names the Python
equivalent (:func:`elixir_refused`). A Sequin path function and an enrichment function
(SQL) run as they are.

The steps these configure live in ``transforms/`` (one module each); the order they run in,
and which values each one sees, is ``transforms/render.py``'s docstring.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

import re2
from pydantic import AfterValidator, ConfigDict, Field, SecretStr, field_validator, model_validator

from config.section import Section

#: ``module:function`` (or ``package.module:function``): a callable found by importing the module.
ImportPath = Annotated[
    str,
    AfterValidator(lambda value: _import_path(value)),
]

_IMPORT_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def _import_path(value: str) -> str:
    if not _IMPORT_PATH.fullmatch(value):
        raise ValueError(f"'{value}' is not an import path: write module:function (the module is looked up on "
                         "Python's path and beside the config file)")
    return value


# -- columns -------------------------------------------------------------------------------


class Mask(Section):
    """How one column's values are masked. Exactly one of the keys; ``redact`` and ``hash`` may
    also be written as a bare word (``ssn: redact``). NULL stays null; a TOASTed value the
    update did not send stays its placeholder (it holds no data)."""

    #: A keyed hash of the value (HMAC-SHA256, hex): equal values give equal hashes, so rows can
    #: still be joined and counted, but the value cannot be read back without the secret.
    hash: bool = False
    #: The hash's key; default: ``walflow.mask_secret``. Keep it out of the file: ``${MASK_SECRET}``.
    secret: SecretStr | None = None
    #: The value replaced by ``"[redacted]"``.
    redact: bool = False
    #: The value's text cut to its first N characters.
    truncate: int | None = Field(default=None, ge=0)
    #: The first N characters kept, every other one replaced by ``*``.
    keep_first: int | None = Field(default=None, ge=0)
    #: The last N characters kept, every other one replaced by ``*`` (``************1234``).
    keep_last: int | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _bare_word(cls, data: Any) -> Any:
        if data in ("hash", "redact"):
            return {data: True}
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> Mask:
        kinds = [name for name in ("hash", "redact", "truncate", "keep_first", "keep_last") if self._given(name)]
        if len(kinds) != 1:
            raise ValueError("give exactly one of hash, redact, truncate, keep_first, keep_last "
                             f"(got {', '.join(kinds) or 'none'})")
        if self.secret is not None and not self.hash:
            raise ValueError("secret belongs to hash: remove it, or set hash: true")
        return self

    def _given(self, name: str) -> bool:
        value = getattr(self, name)
        return value is True if isinstance(value, bool) else value is not None  # truncate: 0 is given

    @property
    def kind(self) -> Literal["hash", "redact", "truncate", "keep_first", "keep_last"]:
        for name in ("hash", "redact", "truncate", "keep_first", "keep_last"):
            if self._given(name):
                return name
        raise AssertionError("validated: one kind")


class Columns(Section):
    """Which columns a table's messages carry, under which names, and which are masked: in
    ``record`` and ``changes`` (Debezium's ``before`` and ``after``), in ``record_pks`` and in
    every subject and header rendered from the row. Row filters see the database's columns as
    they are; transforms and routing see what is published."""

    keyed_by: ClassVar[Mapping[str, str]] = {"mask": "column"}

    #: Only these columns (None: every column).
    include: list[str] | None = Field(default=None, min_length=1)
    #: Every column but these.
    exclude: list[str] = []
    #: Column -> the name it is published under.
    rename: dict[str, str] = {}
    #: Column -> its mask.
    mask: dict[str, Mask] = {}

    @model_validator(mode="after")
    def _consistent(self) -> Columns:
        if self.include is not None and self.exclude:
            raise ValueError("give include or exclude, not both")
        for key in ("rename", "mask"):
            for column in getattr(self, key):
                if column in self.exclude or (self.include is not None and column not in self.include):
                    raise ValueError(f"{key}.{column}: the column is not published (include/exclude): remove it "
                                     f"from {key}, or publish the column")
        names = list(self.rename.values())
        if len(set(names)) != len(names):
            raise ValueError("rename gives two columns the same name")
        return self


# -- row filters -----------------------------------------------------------------------------


class Condition(Section):
    """One condition on a column's value: exactly one operator. Values are compared as the
    column's type (a number with a number, a timestamp with an ISO 8601 text, …)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True, populate_by_name=True)

    #: The column tested (its name in the database: filters run before ``columns`` renames).
    column: str | None = None
    #: Test the row before the change (an update's old row, when Postgres sent it: REPLICA
    #: IDENTITY FULL; a delete's row), not after it. Without an old row the condition is false.
    old: bool = False
    #: A key inside a JSON column's value, dot-separated (``address.city``).
    path: str | None = None
    #: The value equals this one.
    eq: Any = None
    #: The value differs from this one.
    ne: Any = None
    #: The value is greater than this one.
    gt: Any = None
    #: The value is greater than or equal to this one.
    gte: Any = None
    #: The value is less than this one.
    lt: Any = None
    #: The value is less than or equal to this one.
    lte: Any = None
    #: The value is one of these.
    in_: list[Any] | None = Field(default=None, alias="in")
    #: The value is none of these.
    not_in: list[Any] | None = None
    #: true: the value is NULL; false: it is not.
    is_null: bool | None = None
    #: true: an update changed the column (known only when Postgres sent the old row); false: it did not.
    changed: bool | None = None
    #: A regular expression the value's text must contain a match of, in RE2's syntax (matched in
    #: time linear in the text: a pattern can never hang the sink). As Python's ``re`` but without
    #: backreferences, look-arounds, possessive or atomic groups, ``(?x)`` and comments; ``\z``
    #: for Python's ``\Z``; ``$`` only at the end of the text; ``\d``, ``\w``, ``\s``, ``\b`` are
    #: ASCII (``\p{Nd}``, ``\p{L}`` for Unicode's); counts up to 1000.
    matches: str | None = None
    #: Any one of these conditions (in place of ``column`` and an operator).
    any: list[Condition] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_operator(self) -> Condition:
        given = [name for name in _OPERATORS if name in self.model_fields_set]
        if self.any is not None:
            if given or self.column is not None or self.old or self.path is not None:
                raise ValueError("any: takes a list of conditions, with no column or operator beside it")
            return self
        if self.column is None:
            raise ValueError("a condition needs column: (or any: [conditions])")
        if len(given) != 1:
            raise ValueError("give exactly one operator of eq, ne, gt, gte, lt, lte, in, not_in, is_null, changed, "
                             f"matches (got {', '.join(given) or 'none'})")
        return self

    @field_validator("matches")
    @classmethod
    def _re2(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            matches_pattern(pattern)  # compiled once here, and the same object used per row
        return pattern

    @property
    def operator(self) -> str:
        return next(name for name in _OPERATORS if name in self.model_fields_set)


_OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in_", "not_in", "is_null", "changed", "matches")

#: RE2's options for ``matches``: no capture groups (a condition only asks whether there is a
#: match), and a refused pattern reported in the config error, not logged by RE2 itself.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.never_capture = True
_RE2_OPTIONS.log_errors = False


@functools.cache
def matches_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (google-re2), once per process; ValueError, saying what to
    write instead, for one RE2 refuses. RE2 runs in time linear in the text it searches,
    where Python's ``re`` backtracks: ``(a+)+$`` on 30 ``a`` and a ``!`` would hang the sink
    partition for ever."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(
            f"RE2 cannot read {pattern!r} ({reason}): walflow matches with RE2, which never backtracks, so write it "
            "without backreferences, look-arounds, possessive or atomic groups, (?x) or (?#...); \\z for \\Z; "
            "counts up to 1000") from None


class ColumnFilter(Section):
    """Sequin's column filter (``filters:``), evaluated as Sequin does: on the new row, a
    delete's on the old row; ``field_path`` reaches into a JSON column."""

    #: The column tested (its name in the database).
    column_name: str
    #: How the value is compared with ``comparison_value`` (``in``/``not in`` against a list;
    #: the null tests take no ``comparison_value``); any case.
    operator: Literal["=", "==", "!=", ">", "<", ">=", "<=", "in", "not in", "not_in", "is null", "is_null",
                      "not null", "is not null", "not_null", "is_not_null"]
    #: The value the column's value is compared with.
    comparison_value: Any = None
    #: A key inside a JSON column's value, dot-separated (``address.city``).
    field_path: str | None = None
    #: The type ``comparison_value`` is read as, for ``=`` … ``<=`` (default: the type of the row's value);
    #: ``cistring``: a text, compared ignoring case.
    field_type: Literal["string", "cistring", "number", "boolean", "datetime", "list"] | None = None

    @field_validator("operator", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


# -- functions -------------------------------------------------------------------------------


class PythonFunction(Section):
    """A Python callable, by import path: ``python: module:function``, called as Sequin calls
    its functions: ``f(action, record, changes, metadata)``."""

    form: ClassVar[str | None] = "python"

    #: The callable, ``module:function``: the module is looked up on Python's path and beside
    #: the config file, and imported at startup.
    python: ImportPath


class FilterFunction(PythonFunction):
    """A row filter in Python: ``def filter(action, record, changes, metadata) -> bool``; the
    message is published when it returns True (it must return a bool)."""


class PathTransform(Section):
    """Sequin's path transform: the payload is the value at this path of the message
    (``record``, ``record.id``, ``metadata.table_name``, …)."""

    form: ClassVar[str | None] = "path"

    #: ``record``, ``changes``, ``action`` or ``metadata``, then keys inside it, dot-separated.
    path: Annotated[str, Field(pattern=r"^(record|changes|action|metadata)(\.[A-Za-z0-9_\-]+)*$", max_length=2000)]


class TransformFunction(PythonFunction):
    """A transform in Python: ``def transform(action, record, changes, metadata)`` returns the
    payload, any JSON value (encoded as the envelope encodes values)."""



class SubjectRouting(Section):
    """A subject template, and headers: what a message is published as.

    Placeholders: ``{prefix}`` (the destination's ``subject_prefix``), ``{database}``,
    ``{schema}``, ``{table}``, ``{action}``, ``{sink}``, ``{record.COLUMN}`` (a published column:
    renamed, masked), ``{record.COLUMN.KEY}`` inside a JSON column, ``{metadata.KEY}``. Each
    value becomes one subject token, escaped as subject names are (README, *What lands in JetStream*)."""

    form: ClassVar[str | None] = "subject"

    #: Default: ``{prefix}.{database}.{schema}.{table}.{action}``, as Sequin.
    subject: str = "{prefix}.{database}.{schema}.{table}.{action}"
    #: Header name -> value template (same placeholders, values not escaped). ``Nats-*`` names
    #: are JetStream's and refused; ``Nats-Msg-Id`` is always walflow's id.
    headers: dict[str, str] = {}
    #: A header carrying the row's primary key (``record_pks`` as a JSON array), e.g.
    #: ``Walflow-Key``; None: none.
    key_header: str | None = None

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            _header_name(name)
        return value

    @field_validator("key_header")
    @classmethod
    def _key_header(cls, value: str | None) -> str | None:
        return None if value is None else _header_name(value)


class RoutingFunction(PythonFunction):
    """Routing in Python: ``def route(action, record, changes, metadata)`` returns
    ``{"subject": str, "headers": {str: str}}`` (headers optional), as Sequin's NATS routing."""

    #: As in :class:`SubjectRouting`.
    key_header: str | None = None

    @field_validator("key_header")
    @classmethod
    def _key_header(cls, value: str | None) -> str | None:
        return None if value is None else _header_name(value)



def _header_name(name: str) -> str:
    if not re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
        raise ValueError(f"'{name}' is not a header name: use letters, digits and -")
    if name.lower().startswith("nats-"):
        raise ValueError(f"'{name}': Nats-* headers are JetStream's (walflow always sets Nats-Msg-Id itself)")
    return name


class Enrichment(Section):
    """Sequin's enrichment: a SQL query on the source database, run once per batch of messages
    with the primary keys as parameters (``WHERE id = ANY($1)``; a composite key gives one
    array per key column, ``$1``, ``$2``, … in alphabetical order of the column names: with
    untyped arrays, join them as ``JOIN unnest($1::int[], $2::text[]) AS k(a, b) USING (a, b)``).
    It must return the key columns and at most one row per key; the whole row lands in
    ``metadata.enrichment`` (null when it returns none). It reads the database as it is when
    it runs, not as it was at the change (Sequin's caveat)."""

    #: The query, with ``$1`` (and ``$2``, … for a composite key) for the batch's primary keys.
    sql: str = Field(min_length=1)
    #: Keys per query at most (a larger batch runs several queries).
    max_keys: int = Field(default=1000, ge=1)
    #: A query running longer is cancelled, and counts as a failure (``on_error``).
    timeout_ms: int = Field(default=5000, gt=0)

    @field_validator("sql")
    @classmethod
    def _parameter(cls, value: str) -> str:
        if "$1" not in value:
            raise ValueError("the query must use $1 for the primary keys: ... WHERE id = ANY($1)")
        return value


# -- the TOAST policy ------------------------------------------------------------------------

#: An update that left a TOASTed column alone does not send its value: ``placeholder``
#: publishes the old row's value when Postgres sent one (REPLICA IDENTITY FULL), else
#: ``"unchanged_toast"`` (Sequin's behaviour); ``omit`` leaves the column out of ``record``
#: whenever the update did not send it; ``old`` publishes the old row's value when Postgres
#: sent one and otherwise leaves the column out (never a placeholder).
ToastPolicy = Literal["placeholder", "omit", "old"]


# -- Sequin's functions ----------------------------------------------------------------------


class FunctionConfig(Section):
    """One of Sequin's ``functions:``, which sinks name in ``filter``, ``transform``, ``routing``
    and ``enrichment``. ``path`` and ``enrichment`` (SQL) functions run as they are; for the
    Elixir kinds (``filter``, ``transform``, ``routing``) give walflow a Python callable with
    ``python:``, the same arguments in the same order (Elixir's ``code``/``file`` is then
    ignored)."""

    ignored: ClassVar[Mapping[str, str]] = {
        "sink_type": "walflow has NATS sinks only",
    }

    #: What sinks name it by.
    name: str = Field(min_length=1)
    #: Which key of a sink may name it: ``path`` functions go in ``transform``.
    type: Literal["filter", "transform", "path", "routing", "enrichment"]
    #: For people reading the file; not used.
    description: str | None = None
    #: Elixir (filter, transform, routing) or SQL (enrichment).
    code: str | None = None
    #: Sequin's file holding ``code``, relative to the config file.
    file: str | None = None
    #: A ``path`` function's path.
    path: str | None = None
    #: walflow: the Python callable that replaces an Elixir function.
    python: ImportPath | None = None
    #: walflow, for ``routing``: a subject template instead of a callable (see ``routing``).
    subject: str | None = None
    #: walflow, for ``routing``: with ``subject``, header templates (see ``routing``).
    headers: dict[str, str] | None = None
    #: walflow, for ``routing``: a header carrying the row's primary key (see ``routing``).
    key_header: str | None = None


#: The Python equivalent of each kind of Sequin Elixir function: what the error says to write.
PYTHON_EQUIVALENT = {
    "filter": ("def filter(action, record, changes, metadata) -> bool",
               "or, for conditions on column values, tables[].where (or Sequin's column filters:)"),
    "transform": ("def transform(action, record, changes, metadata) -> payload",
                  "or, to publish one part of the message, a path transform: transform: {path: record}"),
    "routing": ("def route(action, record, changes, metadata) -> {'subject': ..., 'headers': {...}}",
                "or a subject template: routing: {subject: '{prefix}.{database}.{table}.{record.tenant_id}'}"),
}


def elixir_refused(kind: str, name: str) -> str:
    """The error for a sink naming Sequin function ``name`` of ``kind`` that is Elixir code."""
    signature, alternative = PYTHON_EQUIVALENT[kind]
    return (f"function '{name}' is Elixir code, which walflow cannot run: write it in Python, {signature}, in a "
            f"module beside the config (or on Python's path), and add python: module:function to the function "
            f"'{name}' in functions: ({alternative})")


def function_spec(function: FunctionConfig, kind: str) -> dict[str, Any]:
    """The inline form (what a sink's ``kind`` key may hold) of Sequin function ``function``;
    ValueError with the fix when walflow cannot run it."""
    expected = ("transform", "path") if kind == "transform" else (kind,)
    if function.type not in expected:
        raise ValueError(f"function '{function.name}' is a {function.type} function, not a {kind} function")
    if function.type == "path":
        if function.path is None:
            raise ValueError(f"function '{function.name}': a path function needs path:")
        return {"path": function.path}
    if function.type == "enrichment":
        if function.code is None:
            raise ValueError(f"function '{function.name}': an enrichment function needs code: (its SQL)")
        return {"sql": function.code}
    if function.type == "routing" and function.python is None and function.subject is not None:
        spec: dict[str, Any] = {"subject": function.subject}
        if function.headers:
            spec["headers"] = function.headers
        if function.key_header:
            spec["key_header"] = function.key_header
        return spec
    if function.python is None:
        raise ValueError(elixir_refused(kind, function.name))
    spec = {"python": function.python}
    if function.type == "routing" and function.key_header:
        spec["key_header"] = function.key_header
    return spec


# -- failures ----------------------------------------------------------------------------------

#: What happens when a step fails for one message (a callable raises or returns the wrong
#: kind of value, a template renders an invalid subject, a transform's value is not JSON, an
#: enrichment query fails): ``stop`` — walflow stops (exit 2) with the row's position and
#: the error, and nothing at or after it is confirmed, so a restart after the fix publishes
#: it; ``dead_letter`` — a message with the error, the row's position and key (no row values)
#: is published on ``dead_letter_subject`` in its place, under the row's own ``Nats-Msg-Id``.
OnError = Literal["stop", "dead_letter"]
