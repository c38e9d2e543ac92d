"""A sink's routing: a message's own subject and headers, rendered per message for ``transforms/render.py``.

A :class:`Router` is built per sink (or table) from its ``routing`` (``config/shaping.py``):

- a template: ``{prefix}``, ``{database}``, ``{schema}``, ``{table}``, ``{action}``, ``{sink}``,
  ``{record.COLUMN}``, ``{record.COLUMN.KEY…}`` (into a JSON value; a digit key indexes an
  array), ``{metadata.KEY…}``; ``{{`` and ``}}`` write a brace. Compiled once: an unknown
  placeholder, or a subject no row could make valid, is a :class:`core.errors.FatalError` naming
  the key. In a subject every name and value is one token (:func:`core.tokens.subject_token`);
  in a header a value is written as it is, without CR or LF. Only a text, a number, a UUID or a
  boolean routes: anything else, null above all, is an error, never a default.
- a function ``fn(action, record, changes, metadata)`` returning ``{"subject": …, "headers": {…}}``
  (no subject: the default one, as Sequin merges its defaults).

Every routed subject keeps NATS's rules (:func:`core.subjects.subject_problem`) and must be
captured by the sink's stream; with ``msg_id: sequin`` it stays under ``<prefix>.<database>.``.
``Nats-Msg-Id`` is always walflow's; ``key_header`` carries ``record_pks`` as compact JSON.

A message that cannot be routed raises :class:`RoutingError`: render applies the sink's
``on_error`` (stop, or its dead letter on :meth:`Router.dead_letter`). Its text names the
template or function and what was wrong by kind, never a row's value. The README's
*Shaping what is published* has the reasons.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final, NamedTuple, cast
from uuid import UUID

import orjson

from config.schema import SinkConfig
from config.shaping import RoutingFunction, SubjectRouting
from core.errors import FatalError, ValueFree
from core.events import UNCHANGED_TOAST, Row
from core.subjects import database_root, database_subjects, subject_problem, tokens_cover, too_long
from core.tokens import subject_token
from transforms.envelope import a_type

#: The subject a template writes when it writes Sequin's: such a router leaves the subject to the publisher.
DEFAULT_SUBJECT: Final = "{prefix}.{database}.{schema}.{table}.{action}"
#: The placeholders, as errors list them.
PLACEHOLDERS: Final = ("{prefix}", "{database}", "{schema}", "{table}", "{action}", "{sink}", "{record.COLUMN}",
                       "{record.COLUMN.KEY}", "{metadata.KEY}")
#: What a message's ``metadata`` is, built only when something asks for it (``transforms/render.py``).
Metadata = Callable[[], dict[str, Any]]
#: A routing function, as Sequin calls one: ``(action, record, changes, metadata)``.
Function = Callable[[str, Row, Row | None, dict[str, Any]], Any]

#: The names a template may hold, in the order of the tuple a template renders them from.
_NAMES: Final = ("prefix", "database", "schema", "table", "action", "sink")
#: Their positions known when a router is built (the others are a message's).
_BUILT: Final = frozenset({0, 1, 5})
_PART: Final = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# the kinds of a template's parts
_TEXT: Final = 0
_NAME: Final = 1
_RECORD: Final = 2
_METADATA: Final = 3
#: What a template renders where a message's value will be, to check it once at build time.
_SAMPLE: Final = "x"
#: What :func:`core.tokens.subject_token` escapes that a printable text may hold.
_UNSAFE: Final = re.compile(r"[.*>% ]")
_MISSING: Final = object()


#: A template's parts with a table's and action's names written in (:meth:`_Template.bind`).
_Bound = tuple[tuple[int, Any], ...]


class _Shared(NamedTuple):
    """What the messages of one table and action share (:meth:`Router._once`)."""

    #: Rendered once; None: the default subject, or one that holds a row's values.
    subject: bytes | None
    #: Rendered once, unless a header holds a row's values.
    headers: bytes
    #: A subject holding a row's values, bound; and whether its start proves it captured.
    bound: _Bound | None
    proven: bool
    #: Every header, bound, when one of them holds a row's values (else empty).
    row_headers: tuple[tuple[str, _Template, _Bound], ...]


class RoutingError(ValueFree, ValueError):
    """One message cannot be routed: names the template or function, and what was wrong (no row value)."""


class _Template:
    """One template, compiled: literal texts and placeholders. A router binds its names once per
    table and action (:meth:`bind`) and renders the bound parts with a row's values
    (:meth:`render`). ``escape``: each value becomes one subject token."""

    __slots__ = ("escape", "parts", "per_message", "per_row", "text", "where")

    def __init__(self, text: str, escape: bool, key: str, rows: bool = True) -> None:
        """``key``: the config key that holds it; ``rows``: whether row placeholders are allowed."""
        self.text = text
        self.escape = escape
        #: How errors name it.
        self.where = f"{key} '{text}'"
        parts: list[tuple[int, Any]] = []
        at = 0
        for found in _PART.finditer(text):
            parts.append((_TEXT, text[at : found.start()]))
            at = found.end()
            token = found.group(0)
            if token in ("{{", "}}"):
                parts.append((_TEXT, token[0]))
            elif found.group(1) is None:
                raise FatalError(f"{key}: '{text}' has a lone '{token}' at character {found.start()}: write "
                                 f"'{token * 2}' for a brace, or a placeholder: {', '.join(PLACEHOLDERS)}")
            else:
                parts.append(_placeholder(found.group(1), text, key, rows))
        parts.append((_TEXT, text[at:]))
        merged: list[tuple[int, Any]] = []
        for kind, value in parts:
            if kind == _TEXT and merged and merged[-1][0] == _TEXT:
                merged[-1] = (_TEXT, merged[-1][1] + value)
            elif kind != _TEXT or value:
                merged.append((kind, value))
        self.parts = tuple(merged)
        #: Whether it holds a row's values (else it renders once per table and action).
        self.per_row = any(kind in (_RECORD, _METADATA) for kind, _ in merged)
        #: Whether it holds anything a router does not know when it is built.
        self.per_message = any(kind != _TEXT and not (kind == _NAME and value in _BUILT) for kind, value in merged)

    def bind(self, names: tuple[str, ...]) -> _Bound:
        """Its parts with ``names`` (``_NAMES``' order, escaped for a subject) written in: texts and row values."""
        bound: list[tuple[int, Any]] = []
        for kind, value in self.parts:
            if kind == _NAME:
                kind, value = _TEXT, names[value]
            if kind == _TEXT and bound and bound[-1][0] == _TEXT:
                bound[-1] = (_TEXT, bound[-1][1] + value)
            else:
                bound.append((kind, value))
        return tuple(bound)

    def render(self, bound: _Bound, record: Row, metadata: Metadata) -> str:
        """Its :meth:`bind` parts with the record's and metadata's values."""
        out: list[str] = []
        meta: dict[str, Any] | None = None
        for kind, value in bound:
            if kind == _TEXT:
                out.append(value)
                continue
            if kind == _RECORD:
                found = _lookup(record, value, "record", self.where)
            else:
                if meta is None:
                    meta = metadata()
                found = _lookup(meta, value, "metadata", self.where)
            if type(found) is int:  # the usual key: its digits (and sign) need no escaping
                out.append(str(found))
                continue
            text = _text(found, value, "record" if kind == _RECORD else "metadata", self.where)
            out.append(_token(text) if self.escape else text)
        return "".join(out)

    def sample(self, names: tuple[str, ...]) -> str:
        """What it renders with the names a router knows when it is built, and :data:`_SAMPLE` for
        every other one: a message's names and values."""
        return "".join(value if kind == _TEXT else names[value] if kind == _NAME and value in _BUILT else _SAMPLE
                       for kind, value in self.parts)

    def lead(self, names: tuple[str, ...]) -> str:
        """What every subject it renders starts with: its text up to the first part known only per message."""
        out: list[str] = []
        for kind, value in self.parts:
            if kind != _TEXT and not (kind == _NAME and value in _BUILT):
                break
            out.append(value if kind == _TEXT else names[value])
        return "".join(out)


def _placeholder(name: str, text: str, key: str, rows: bool) -> tuple[int, Any]:
    if name in _NAMES:
        return _NAME, _NAMES.index(name)
    root, _, rest = name.partition(".")
    path = tuple(rest.split("."))
    if root in ("record", "metadata") and rest and all(path):
        if not rows:
            raise FatalError(f"{key}: '{text}' holds {{{name}}}, but it may not hold a row's values: use "
                             "{prefix}, {database}, {sink}, {schema}, {table}, {action}")
        return (_RECORD if root == "record" else _METADATA), path
    raise FatalError(f"{key}: '{text}' holds {{{name}}}, which is no placeholder; placeholders: "
                     f"{', '.join(PLACEHOLDERS)} (write '{{{{' and '}}}}' for a brace)")


def _lookup(row: Mapping[str, Any], path: tuple[str, ...], root: str, template: str) -> Any:
    """The value at ``path`` of ``row`` (``record`` or ``metadata``), into JSON objects and arrays;
    ``template`` names the template, for the error."""
    value: Any = row
    for depth, step in enumerate(path):
        if isinstance(value, (dict, Mapping)):  # a dict, as rows and JSON values are, without the ABC's check
            found = value.get(step, _MISSING)
            if found is _MISSING:
                column = root == "record" and not depth
                where = "the published record has no column" if column else (
                    f"{'.'.join((root, *path[:depth]))} has no key")
                # the names of a row's columns or of metadata's keys; a JSON value's keys may be the row's data
                known = f" (it has {', '.join(map(str, value)) or 'none'})" if not depth and len(value) <= 20 else ""
                raise RoutingError(f"{template}: {{{'.'.join((root, *path))}}}: {where} '{step}'{known}")
            value = found
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            raise RoutingError(f"{template}: {{{'.'.join((root, *path))}}}: {'.'.join((root, *path[:depth]))} is "
                               f"{_described(value)}, which has no '{step}'")
    return value


def _text(value: Any, path: tuple[str, ...], root: str, template: str) -> str:
    """A value's text in a subject or header; RoutingError for one that has none (null above all)."""
    if isinstance(value, str):
        return value
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is UUID:
        return str(value)
    if kind is Decimal:
        return format(value, "f")  # positional, as the payload writes numerics
    if kind is float and math.isfinite(value):
        return repr(value)
    where = f"{template}: {{{'.'.join((root, *path))}}}"
    if value is None:
        raise RoutingError(f"{where} is null: a row without the value cannot be routed (give the column a value, "
                           "or route by another)")
    if value is UNCHANGED_TOAST:
        raise RoutingError(f"{where} is a TOASTed value the update did not change, which Postgres did not send "
                           "(REPLICA IDENTITY FULL sends it)")
    raise RoutingError(f"{where} is {_described(value)}: only a text, a number, a UUID or a boolean can be routed by")


def _token(text: str) -> str:
    """:func:`core.tokens.subject_token` of a value, without its Python call per character when
    nothing needs escaping (the only printable whitespace is the space: tests hold it)."""
    if text and text.isprintable() and _UNSAFE.search(text) is None:
        return text
    return subject_token(text)


def _described(value: Any) -> str:
    """What ``value`` is, for an error: its type, never the value (it may be a row's)."""
    return a_type(value)


class Router:
    """One routing of one sink (the sink's, or a table's in its place): a message's subject and headers.

    Called per message: ``router(action, schema, table, record, changes, metadata, pks)`` →
    ``(subject, headers)``, subject None for the default one (the envelope's), headers the
    lines after ``Nats-Msg-Id`` (:attr:`core.message.Message.headers`). A
    :class:`RoutingError` when the message cannot be routed.
    """

    def __init__(self, routing: SubjectRouting | RoutingFunction | None, function: Function | None,
                 sink: SinkConfig, database: str, stream_subjects: Sequence[str], *, key: str = "routing",
                 dead_letter_key: str = "dead_letter_subject") -> None:
        """``function``: ``routing``'s callable, loaded (``transforms/functions.py``); ``database``: its
        configured name; ``stream_subjects``: what the sink's stream captures
        (:meth:`connectors.nats.sink.JetStreamSink.stream_subjects`); ``key`` and
        ``dead_letter_key``: the config keys that errors name (``sinks[0].tables[1].routing``)."""
        dest = sink.destination
        prefix, escaped = dest.subject_prefix, subject_token(database)
        #: The names a template renders, in _NAMES' order: escaped for subjects, as they are for headers.
        self._names = (prefix, escaped, "", "", "", subject_token(sink.name))
        self._raw_names = (prefix, database, "", "", "", sink.name)
        self._stream_subjects = tuple(stream_subjects)
        self._patterns = [pattern.split(".") for pattern in stream_subjects]
        #: With Sequin's ids: what every subject must start with.
        self._inside = database_root(prefix, database) if dest.msg_id == "sequin" else ""
        self._function: Function | None = None
        self._subject: _Template | None = None
        self._headers: tuple[tuple[str, _Template], ...] = ()
        self._what = key
        if isinstance(routing, RoutingFunction):
            if function is None:
                raise TypeError(f"{key}: the routing function {routing.python} is not loaded")
            self._function, self._what = function, f"{key}: routing function {routing.python}"
        elif routing is not None:
            if routing.subject != DEFAULT_SUBJECT:
                self._subject = self._compiled(routing.subject, f"{key}.subject")
            self._headers = tuple((name, _Template(value, False, f"{key}.headers.{name}"))
                                  for name, value in routing.headers.items())
        key_header = None if routing is None else routing.key_header
        if key_header is not None and key_header.lower() in (name.lower() for name, _ in self._headers):
            raise FatalError(f"{key}: key_header '{key_header}' is one of headers too: give it once")
        self._key_header = key_header
        self._key_line = b"" if key_header is None else f"{key_header}: ".encode()
        #: Whether the headers hold a row's values (else they render once per table and action).
        self._row_headers = any(template.per_row for _, template in self._headers)
        #: (schema, table, action) -> what its messages share (:meth:`_once`).
        self._shared: dict[tuple[str, str, str], _Shared] = {}
        # checked at startup only where every failed step uses it: an unused key must not keep the
        # sink from starting (under on_error: stop only a message too large for the server, which
        # fits no other way, uses it: :meth:`dead_letter` checks it then)
        self._dead = (self._compiled(sink.dead_letter_subject, dead_letter_key, rows=False)
                      if sink.on_error == "dead_letter" else _Template(sink.dead_letter_subject, True, dead_letter_key,
                                                                       rows=False))
        self._dead_subjects: dict[tuple[str, str, str], bytes] = {}

    def _compiled(self, text: str, key: str, rows: bool = True) -> _Template:
        """A subject template, checked as far as a router can before any message: its tokens,
        and what it must start with or be captured by when that does not depend on the message."""
        template = _Template(text, True, key, rows)
        sample = template.sample(self._names)
        problem = subject_problem(sample)
        if problem is None and not template.per_message:  # its one subject
            problem = self._rendered_problem(sample)
        elif problem is None and self._inside:
            lead = template.lead(self._names)
            if not (lead.startswith(self._inside) or self._inside.startswith(lead)):
                problem = self._outside(lead)
        if problem is not None:
            raise FatalError(f"{key}: '{text}' cannot be published on: {problem}")
        return template

    def __call__(self, action: str, schema: str, table: str, record: Row, changes: Row | None, metadata: Metadata,
                 pks: tuple[str, ...]) -> tuple[bytes | None, bytes]:
        function = self._function
        if function is not None:
            return self._called(function, action, record, changes, metadata, pks)
        key = (schema, table, action)
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = self._once(schema, table, action)
        subject, headers, bound, proven, row_headers = shared
        if bound is not None:
            template = cast(_Template, self._subject)
            text = template.render(bound, record, metadata)
            problem = self._rendered_problem(text, proven)
            if problem is not None:
                raise RoutingError(f"{template.where} gave a subject (not shown: it holds the row's values) that cannot "
                                   f"be published on: {problem}")
            subject = text.encode()
        if row_headers:
            headers = self._header_lines(row_headers, record, metadata)
        if self._key_header is not None:
            headers += self._key_line + orjson.dumps(pks) + b"\r\n"
        return subject, headers

    def _once(self, schema: str, table: str, action: str) -> _Shared:
        """What a table's and action's messages share: the subject and headers rendered, or bound to
        their names when they hold a row's values."""
        names = (self._names[0], self._names[1], subject_token(schema), subject_token(table), subject_token(action),
                 self._names[5])
        raw = (*self._raw_names[:2], schema, table, action, self._raw_names[5])
        subject, bound, proven = None, None, False
        template = self._subject
        if template is not None:
            parts = template.bind(names)
            if template.per_row:
                bound, proven = parts, self._proves(parts[0][1] if parts[0][0] == _TEXT else "")
            else:
                text = template.render(parts, {}, dict)
                problem = self._rendered_problem(text)
                if problem is not None:
                    raise RoutingError(f"{template.where} gave subject '{text}' for {schema}.{table} {action}: "
                                       f"{problem}")
                subject = text.encode()
        headers = tuple((name, header, header.bind(raw)) for name, header in self._headers)
        if self._row_headers:
            return _Shared(subject, b"", bound, proven, headers)
        return _Shared(subject, self._header_lines(headers, {}, dict), bound, proven, ())

    def _header_lines(self, headers: tuple[tuple[str, _Template, _Bound], ...], record: Row,
                      metadata: Metadata) -> bytes:
        lines: list[str] = []
        for name, template, bound in headers:
            value = template.render(bound, record, metadata)
            if "\r" in value or "\n" in value:
                raise RoutingError(f"{template.where} gave a value holding a line break, which a header cannot hold")
            lines.append(f"{name}: {value}\r\n")
        return _encoded("".join(lines), self._what)

    def _called(self, function: Function, action: str, record: Row, changes: Row | None, metadata: Metadata,
                pks: tuple[str, ...]) -> tuple[bytes | None, bytes]:
        what = self._what
        try:
            result = function(action, record, changes, metadata())
        except Exception as exc:
            raise RoutingError(f"{what} raised {type(exc).__name__}") from exc  # never its text: it may quote the row
        if not isinstance(result, Mapping) or set(result) - {"subject", "headers"}:
            wanted = "a mapping of 'subject' (a str) and, optionally, 'headers' (str -> str), nothing else"
            raise RoutingError(f"{what} returned {_described(result)}, not {wanted}")
        subject = result.get("subject")  # left out: the default subject, as Sequin merges its defaults
        if subject is not None and type(subject) is not str:
            raise RoutingError(f"{what} returned 'subject' {_described(subject)}, not a str")
        problem = None if subject is None else subject_problem(subject) or self._rendered_problem(subject)
        if problem is not None:
            raise RoutingError(f"{what} returned a subject (not shown: it may hold the row's values) that cannot be "
                               f"published on: {problem}")
        headers = result.get("headers")
        if headers is None:
            headers = {}
        elif not isinstance(headers, Mapping):
            raise RoutingError(f"{what} returned 'headers' {_described(headers)}, not a mapping of str to str")
        lines: list[str] = []
        for name, value in headers.items():
            if type(name) is not str or not _HEADER_NAME.fullmatch(name):
                raise RoutingError(f"{what} returned a header name ({_described(name)}) that is not letters, digits "
                                   "and -")
            if name.lower().startswith("nats-"):
                raise RoutingError(f"{what} returned a Nats-* header: they are JetStream's (walflow always sets "
                                   "Nats-Msg-Id itself)")
            if self._key_header is not None and name.lower() == self._key_header.lower():
                raise RoutingError(f"{what} returned header {name}, which is the key_header: leave it to walflow")
            if type(value) is not str or "\r" in value or "\n" in value:
                shown = _described(value) if type(value) is not str else "a str holding a line break"
                raise RoutingError(f"{what} returned a header value that is {shown}: a header value is a str of one "
                                   "line")
            lines.append(f"{name}: {value}\r\n")
        out = _encoded("".join(lines), what)
        if self._key_header is not None:
            out += self._key_line + orjson.dumps(pks) + b"\r\n"
        return None if subject is None else subject.encode(), out

    def dead_letter(self, action: str, schema: str, table: str) -> bytes:
        """The subject of a message's dead letter (``dead_letter_subject``); a FatalError when it
        cannot be published on, since the dead letter then could not be either."""
        key = (schema, table, action)
        found = self._dead_subjects.get(key)
        if found is None:
            names = (self._names[0], self._names[1], subject_token(schema), subject_token(table),
                     subject_token(action), self._names[5])
            text = self._dead.render(self._dead.bind(names), {}, dict)
            problem = self._rendered_problem(text)
            if problem is not None:
                raise FatalError(f"{self._dead.where} gives '{text}' for {schema}.{table} {action}, which cannot be "
                                 f"published on, nor its dead letter: {problem}")
            found = self._dead_subjects[key] = text.encode()
        return found

    def _rendered_problem(self, subject: str, proven: bool = False) -> str | None:
        """Why a subject of valid tokens cannot be this sink's: too long, not in its stream, or
        (Sequin's ids) outside its database's subjects; None when it can. ``proven``: its
        template's start already says it is in the stream (:meth:`_proves`)."""
        if (long := too_long(subject)) is not None:
            return long
        if proven:
            return None
        if self._inside and not subject.startswith(self._inside):
            return self._outside(None)  # a rendered subject may hold the row's values: not quoted
        if not self._captured(subject):
            return self._uncaptured()
        return None

    def _proves(self, lead: str) -> bool:
        """Whether every subject made of ``lead`` and a row's values is captured by the stream (and,
        with Sequin's ids, under the database's subjects), so that no row needs checking: a value
        adds one token at least (never empty, never a '.'), after the tokens ``lead`` holds whole."""
        if self._inside and not lead.startswith(self._inside):
            return False
        whole = lead.split(".")[:-1]
        return any(pattern[-1] == ">" and len(pattern) - 1 <= len(whole)
                   and all(token in ("*", held) for token, held in zip(pattern[:-1], whole, strict=False))
                   for pattern in self._patterns)

    def _captured(self, subject: str) -> bool:
        tokens = subject.split(".")
        for pattern in self._patterns:
            if tokens_cover(pattern, tokens):
                return True
        return False

    def _uncaptured(self) -> str:
        return (f"the sink's stream does not capture it (its subjects: {', '.join(self._stream_subjects)}), so "
                "JetStream would never store it: add it to the stream's subjects (destination.stream.subjects for a "
                "stream walflow creates), or route within them")

    def _outside(self, subject: str | None) -> str:
        """Why a subject outside the database's subjects cannot be published with Sequin's ids
        (``subject`` quoted when it is a template's, written in the config; None for a rendered one)."""
        quoted = "" if subject is None else f" ('{subject}' does not)"
        return (f"with destination.msg_id: sequin every subject must start with '{self._inside}'{quoted}: Sequin's ids "
                "name no sink, and the replay scan tells this sink's messages by those subjects; route under it, or "
                "set msg_id: walflow")


def _encoded(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise RoutingError(f"{what}: a header is not UTF-8 ({exc.reason})") from None


def publishes_outside(sink: SinkConfig, database: str) -> bool:
    """Whether ``sink`` (of ``database``) may publish outside ``<prefix>.<database>.>``, where its
    replay scan reads otherwise: a routing function may, and so may a template (the sink's, a
    table's, the dead letter's: a message too large is one whatever ``on_error`` says) that does
    not start there."""
    inside = database_root(sink.destination.subject_prefix, database)
    names = (sink.destination.subject_prefix, subject_token(database), "", "", "", subject_token(sink.name))
    templates: list[str] = [sink.dead_letter_subject]
    for routing in (sink.routing, *(table.routing for table in sink.tables)):
        if isinstance(routing, RoutingFunction):
            return True
        if isinstance(routing, SubjectRouting):
            templates.append(routing.subject)
    for text in templates:
        try:
            lead = _Template(text, True, "").lead(names)
        except FatalError:
            return True  # the router refuses it when it is built; until then, assume the worst
        if not lead.startswith(inside):
            return True
    return False


def replay_subjects(sink: SinkConfig, database: str) -> str:
    """What ``sink``'s replay scan and late re-sends read (``connectors/nats/target.py``): its
    database's subjects, ``<prefix>.<database>.>``, or the whole stream, ``>``, when it may publish
    outside them with walflow's ids (which name database and sink, so the stream's other messages
    are told apart by id). With Sequin's ids the router keeps every subject under the database's,
    so those subjects still hold all of the sink's messages."""
    if sink.destination.msg_id == "walflow" and publishes_outside(sink, database):
        return ">"
    return database_subjects(sink.destination.subject_prefix, database)
