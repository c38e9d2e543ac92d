"""The configuration reference, ``docs/configuration.md``, generated from the schema.

``python -m config.reference`` writes it; ``tests/config/test_reference.py`` fails when the
file differs from what the schema generates now, so it cannot go stale.

Everything it says comes from ``config/schema.py`` itself, so a new key is documented by the
one line (and comment) that adds it: sections, keys, types, constraints, allowed values and
defaults from :class:`~config.schema.Config`'s models and pydantic's field information; a key's
description from ``Field(description=…)``, else the ``#:`` comment above it (read with
:mod:`ast`), then the ``#:`` comment of each type alias it is declared with; each model's
``ignored`` and ``replaced`` mappings, its validators' plain ``raise ValueError("…")`` rules
and docstrings; and what is refused, by loading each entry of :data:`REFUSED` and quoting the
loader's error.

The examples (:data:`EXAMPLES`) are the only text written here: each is loaded in place of its
section of a minimal config, and generation fails if one does not load or warns. How the
sections of a union or a mapping of models are titled, and why comments are read from the
source: ``docs/design.md``, *config/reference.py*.
"""

from __future__ import annotations

import ast
import copy
import inspect
import logging
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

import annotated_types
import yaml
from pydantic import AfterValidator, SecretStr
from pydantic.fields import FieldInfo

from config.loader import ConfigError, _sections, parse_config
from config.schema import Config, Section

OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
COMMAND = "python -m config.reference"


class GenerationError(Exception):
    """The reference cannot be generated as it stands: an example or a refusal is out of date."""


# -- what is written here, not read from the schema ---------------------------------------------

#: The smallest config that loads: an example, or a refused key, takes the place of its section in it.
BASE: dict[str, Any] = {
    "databases": [{
        "name": "app", "hostname": "db.internal", "database": "app",
        "slot": {"name": "walflow_slot"}, "publication": {"name": "walflow_pub"},
    }],
    "sinks": [{"name": "app-to-nats", "database": "app", "destination": {"type": "nats", "host": "nats.internal"}}],
}

#: The environment the examples' references are resolved in.
_ENV = {"PGPASSWORD": "example", "NATS_PASSWORD": "example", "WALFLOW_MASK_SECRET": "example", "WALFLOW_HEALTH_TOKEN": "example",
        "TAX_ID_MASK_SECRET": "example"}

#: One example per section (by :attr:`_Section.key`), as YAML from the top of the file; checked in place of
#: that section of :data:`BASE`, with the example's other keys merged in.
EXAMPLES: dict[str, str] = {
    "": """\
databases:
  - name: app
    hostname: db.internal
    database: app
    slot: {name: walflow_slot, create_if_not_exists: true}
    publication: {name: walflow_pub, create_if_not_exists: true}
sinks:
  - name: app-to-nats
    database: app
    destination: {type: nats, host: nats.internal}
walflow:
  log_format: json
""",
    "databases[]": """\
databases:
  - name: app                      # in every subject: <prefix>.app.<schema>.<table>.<action>
    hostname: db.internal
    port: 5432
    database: app
    username: walflow
    password: ${PGPASSWORD}
    sslmode: verify-full             # TLS, and the server must be db.internal by its certificate
    sslrootcert: system              # the system's trusted CAs; else the path of your CA's PEM file
    slot: {name: walflow_slot, create_if_not_exists: true}
    publication: {name: walflow_pub, create_if_not_exists: true}
""",
    "databases[].slot": """\
databases:
  - slot:
      name: walflow_slot
      create_if_not_exists: true
""",
    "databases[].publication": """\
databases:
  - publication:
      name: walflow_pub
      create_if_not_exists: true
      init_sql: CREATE PUBLICATION walflow_pub FOR TABLES IN SCHEMA public
""",
    "databases[].await_database": """\
databases:
  - await_database: {timeout_ms: 60000, interval_ms: 5000}
""",
    "functions[]": """\
functions:
  - name: row-only                 # Sequin's path function, run as it is: transform: row-only
    type: path                     # publishes the row alone
    path: record
  - name: order-totals             # Sequin's enrichment function (SQL), run as it is
    type: enrichment
    code: |-
      SELECT c.id, count(o.id) AS orders, coalesce(sum(o.total), 0) AS lifetime_total
      FROM customers c LEFT JOIN orders o ON o.customer_id = c.id
      WHERE c.id = ANY($1)
      GROUP BY c.id
  - name: only-vip                 # Sequin's Elixir filter: walflow calls python: instead
    type: filter
    code: |-
      def filter(action, record, changes, metadata) do
        record["tier"] == "vip"
      end
    python: shaping:only_vip       # shaping.py beside this file:
                                   #   def only_vip(action, record, changes, metadata):
                                   #       return record["tier"] == "vip"
sinks:
  - name: vip-customers
    database: app
    source: {include_tables: [public.customers]}
    filter: only-vip
    enrichment: order-totals       # metadata.enrichment: {id, orders, lifetime_total}
    destination: {type: nats, host: nats.internal}
""",
    "sinks[]": """\
sinks:
  - name: app-to-nats
    database: app
    status: active
    actions: [insert, update, delete]
    source:
      include_schemas: [public]
      exclude_tables: [public.json_web_tokens]
    tables:
      - name: public.order_items
        group_column_names: [order_id]
    initial_backfill: true
    envelope: debezium             # before, after, op, source, ts_ms (Sequin's: record, changes, action, metadata)
    destination: {type: nats, host: nats.internal}
  - name: order-events
    database: app
    source: {include_tables: [public.orders]}
    transform: {python: "shaping:order_event"}   # the payload: what order_event(action, record, changes, metadata) returns
    on_error: dead_letter          # a row order_event fails on: a dead letter in its place, not a stop
    dead_letter_subject: "{prefix}.{database}.dead_letter.{table}"   # order-events.app.dead_letter.orders
    destination: {type: nats, host: nats.internal, subject_prefix: order-events}
""",
    "sinks[].source": """\
sinks:
  - source:
      include_schemas: [public, sales]
      exclude_tables: [public.json_web_tokens, audit_log]   # a bare name is public.<name>
""",
    "sinks[].tables[]": """\
sinks:
  - tables:
      - name: public.order_items
        group_column_names: [order_id]   # all of an order's items in one ordered partition
      - name: public.orders              # grouped by its primary key
        where:                           # walflow's conditions: all must hold
          - {column: status, in: [paid, shipped]}
        filters:                         # and Sequin's column filters: all must hold too
          - {column_name: total, operator: ">=", comparison_value: 100}
      - name: public.customers
        columns:
          exclude: [password_hash]
          mask: {ssn: redact, email: hash, card_number: {keep_last: 4}}
        routing:                         # from the published values: after exclude and mask
          subject: "{prefix}.{database}.customers.{record.tenant_id}.{action}"
          key_header: Walflow-Key
      - name: public.documents
        toast: old                       # an update that left body alone: the old row's body, else no body
walflow:
  mask_secret: ${WALFLOW_MASK_SECRET}    # the key of email's hash
""",
    "sinks[].tables[].filters[]": """\
sinks:
  - tables:
      - name: public.orders
        filters:                         # Sequin's column filters: all must hold
          - column_name: status
            operator: "="
            comparison_value: paid
          - column_name: total
            operator: ">="
            comparison_value: 100
          - column_name: details         # a jsonb column
            field_path: shipping.country
            field_type: string
            operator: "="
            comparison_value: NL
""",
    "sinks[].tables[].where[]": """\
sinks:
  - tables:
      - name: public.orders
        where:                                       # all must hold
          - {column: status, in: [paid, shipped]}
          - {column: total, gte: 100}
          - {column: cancelled_at, is_null: true}
          - any:                                     # one of them
              - {column: country, eq: NL}
              - {column: details, path: shipping.country, eq: NL}   # a key inside a jsonb column
""",
    "sinks[].tables[].filter (python: form)": """\
sinks:
  - tables:
      - name: public.customers
        filter: {python: "shaping:only_vip"}   # shaping.py beside this file:
                                               #   def only_vip(action, record, changes, metadata):
                                               #       return record["tier"] == "vip"
""",
    "sinks[].tables[].columns": """\
sinks:
  - tables:
      - name: public.customers
        columns:
          exclude: [password_hash, reset_token]
          rename: {full_name: name}
          mask: {ssn: redact, card_number: {keep_last: 4}}
""",
    "sinks[].tables[].columns.mask.<column>": """\
sinks:
  - tables:
      - name: public.customers
        columns:
          mask:
            ssn: redact                  # "[redacted]"
            email: hash                  # HMAC-SHA256 keyed by walflow.mask_secret: still joins and counts
            card_number: {keep_last: 4}  # ************4242
            name: {keep_first: 1}        # A**
            notes: {truncate: 80}
            tax_id:
              hash: true
              secret: ${TAX_ID_MASK_SECRET}   # this column's own key
walflow:
  mask_secret: ${WALFLOW_MASK_SECRET}
""",
    "sinks[].tables[].routing (subject: form)": """\
sinks:
  - tables:
      - name: public.orders
        routing:
          subject: "{prefix}.{database}.orders.{record.tenant_id}.{action}"   # sequin.app.orders.acme.insert
          headers: {Tenant-Id: "{record.tenant_id}"}
          key_header: Walflow-Key        # ["42"]: the order's primary key
""",
    "sinks[].tables[].routing (python: form)": """\
sinks:
  - tables:
      - name: public.orders
        # shaping.py beside this file: def route_order(action, record, changes, metadata) returns
        # {"subject": ..., "headers": {...}}; the subject must be one the sink's stream captures
        # (<prefix>.<database>.> unless destination.stream.subjects says otherwise)
        routing: {python: "shaping:route_order", key_header: Walflow-Key}
""",
    "sinks[].tables[].enrichment": """\
sinks:
  - tables:
      - name: public.orders
        enrichment:                      # metadata.enrichment: {id, customer, tier}
          sql: |-
            SELECT o.id, c.name AS customer, c.tier
            FROM orders o JOIN customers c ON c.id = o.customer_id
            WHERE o.id = ANY($1)
          timeout_ms: 2000
""",
    "sinks[].initial_backfill[]": """\
sinks:
  - initial_backfill:
      - table: public.users
      - table: public.orders
        type: partial
        sort_column: updated_at
        start_position: "2025-01-01T00:00:00Z"
""",
    "sinks[].filter (python: form)": """\
sinks:
  - source: {include_tables: [public.customers]}
    filter: {python: "shaping:only_vip"}   # shaping.py beside this file:
                                           #   def only_vip(action, record, changes, metadata):
                                           #       return record["tier"] == "vip"
""",
    "sinks[].transform (path: form)": """\
sinks:
  - transform: {path: record}      # the payload: the row alone (no changes, action or metadata)
""",
    "sinks[].transform (python: form)": """\
sinks:
  - source: {include_tables: [public.orders]}
    # shaping.py beside this file:
    #   def order_event(action, record, changes, metadata):
    #       return {"order": record["id"], "status": record["status"], "event": action}
    transform: {python: "shaping:order_event"}
""",
    "sinks[].routing (subject: form)": """\
sinks:
  - routing:                       # every table of this sink has a tenant_id column
      subject: "{prefix}.{database}.{record.tenant_id}.{table}.{action}"   # sequin.app.acme.orders.insert
      headers: {Tenant-Id: "{record.tenant_id}", Source-Table: "{schema}.{table}"}
      key_header: Walflow-Key      # ["42"]: the row's primary key
""",
    "sinks[].routing (python: form)": """\
sinks:
  # shaping.py beside this file: def route(action, record, changes, metadata) returns
  # {"subject": ..., "headers": {...}}; the subject must be one the sink's stream captures
  # (<prefix>.<database>.> unless destination.stream.subjects says otherwise)
  - routing: {python: "shaping:route", key_header: Walflow-Key}
""",
    "sinks[].enrichment": """\
sinks:
  - source: {include_tables: [public.orders]}   # the query is the orders table's
    enrichment:                    # metadata.enrichment: {id, customer, tier}
      sql: |-
        SELECT o.id, c.name AS customer, c.tier
        FROM orders o JOIN customers c ON c.id = o.customer_id
        WHERE o.id = ANY($1)
      max_keys: 500
      timeout_ms: 2000
""",
    "sinks[].filters[]": """\
sinks:
  - table: public.orders           # Sequin's older one-table sink
    filters:
      - {column_name: status, operator: "=", comparison_value: paid}
""",
    "sinks[].destination (type: nats)": """\
sinks:
  - destination:
      type: nats
      servers: [nats://nats-a:4222, nats://nats-b:4222]
      username: walflow
      password: ${NATS_PASSWORD}
      tls: true
      subject_prefix: walflow
      max_in_flight: 1024
""",
    "sinks[].destination.stream": """\
sinks:
  - destination:
      stream:
        name: WALFLOW
        storage: file
        replicas: 3
        duplicate_window_ms: 3600000   # an hour: room for a cutover from Sequin
        max_age_ms: 604800000          # a week
""",
    "walflow": """\
walflow:
  log_level: info
  log_format: json
  max_memory_mb: 256
  mask_secret: ${WALFLOW_MASK_SECRET}
  recovery_partitions: 8
""",
    "walflow.replication": """\
walflow:
  replication:
    wal_sender_timeout_ms: 15000
    status_interval_ms: 2000
    buffer_mb: 64
    heartbeat_interval_ms: 5000
""",
    "walflow.backfill": """\
walflow:
  backfill:
    max_concurrent: 4
    query_budget_ms: 1000
    max_chunk_rows: 20000
""",
    "walflow.health": """\
walflow:
  health:
    host: 0.0.0.0                   # beyond loopback: give it credentials
    port: 9187
    token: ${WALFLOW_HEALTH_TOKEN}  # or username and password (HTTP basic)
""",
}


class Refusal(NamedTuple):
    """``key: value`` in a section, which the loader refuses; ``beside``: what else the file
    needs for the refusal to be the one shown (a function it names), merged into :data:`BASE`."""

    key: str
    value: Any
    beside: Mapping[str, Any] | None = None


def _function(name: str, kind: str, code: str) -> dict[str, Any]:
    return {"functions": [{"name": name, "type": kind, "code": code}]}


_ELIXIR_FILTER = 'def filter(action, record, changes, metadata) do\n  record["tier"] == "vip"\nend'

#: Keys (or values) walflow refuses, per section (by :attr:`_Section.key`): checked by loading each, quoted with the
#: error it gives.
REFUSED: dict[str, list[Refusal]] = {
    "databases[]": [Refusal("primary", {"hostname": "primary.internal"}), Refusal("use_local_tunnel", True)],
    "sinks[]": [
        Refusal("filters", [{"column_name": "status", "operator": "=", "comparison_value": "paid"}]),
        Refusal("filter", "only-vip", _function("only-vip", "filter", _ELIXIR_FILTER)),
        Refusal("transform", "order-event", _function(
            "order-event", "transform",
            'def transform(action, record, changes, metadata) do\n  %{order: record["id"], event: action}\nend')),
        Refusal("routing", "by-tenant", _function(
            "by-tenant", "routing",
            'def route(action, record, changes, metadata) do\n'
            '  %{subject: "sequin.app.#{record["tenant_id"]}.#{metadata.table_name}"}\nend')),
        Refusal("enrichment", "order-total", _function(
            "order-totals", "enrichment", "SELECT id, total FROM orders WHERE id = ANY($1)")),
        Refusal("transform", "only-vip", _function("only-vip", "filter", _ELIXIR_FILTER)),
    ],
    "sinks[].tables[].columns": [
        Refusal("mask", {"email": "hash"}, {"sinks": [{"tables": [{"name": "public.customers"}]}]}),
    ],
}

# -- reading the schema ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Section:
    """One place in the file a model validates: ``sinks[].destination`` and the model."""

    path: str
    model: type[Section]
    #: The discriminator value of a union member (``type: nats``), if the section is one.
    tag: str | None = None

    @property
    def key(self) -> str:
        """What :data:`EXAMPLES` and :data:`REFUSED` name the section by: its path, and its tag
        or form when it has one (``sinks[].routing (subject: form)``)."""
        if self.tag:
            return f"{self.path} (type: {self.tag})"
        return f"{self.path} ({self.model.form}: form)" if self.model.form else self.path

    @property
    def anchor(self) -> str:
        form = f" {self.model.form} form" if self.model.form and not self.tag else ""
        return re.sub(r"[^a-z0-9]+", "-", (self.path or "top-level").lower() + form).strip("-")

    @property
    def title(self) -> str:
        name = f"`{self.path}`" if self.path else "Top level"
        if self.tag:
            return f"{name} (`type: {self.tag}`)"
        return f"{name} (`{self.model.form}:` form)" if self.model.form else name

    @property
    def depth(self) -> int:
        """How many sections it is below the top (``mask.<column>`` is one below ``columns``)."""
        return self.path.count(".") - self.path.count(".<")


def _is_list_of_sections(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        return _is_list_of_sections(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_list_of_sections(arg) for arg in typing.get_args(annotation))
    return typing.get_origin(annotation) is list and bool(_sections(annotation))


def _mapped_sections(annotation: Any) -> list[type[Section]]:
    """The Section models that a mapping ``dict[str, X]`` (optional, annotated) holds as values.
    Not the loader's ``_sections``: it looks for ignored keys in sections, and a mapping's keys are names."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _mapped_sections(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in _mapped_sections(arg)]
    if origin is dict:
        return _sections(typing.get_args(annotation)[1])
    return []


def _placed(model: type[Section], path: str, name: str) -> tuple[str, list[type[Section]]]:
    """Where ``model``'s (at ``path``) field ``name`` puts the sections it holds, and their models:
    ``sinks[].tables[]``, ``sinks[].tables[].columns.mask.<column>``."""
    annotation = model.model_fields[name].annotation
    child = f"{path}.{name}" if path else name
    if mapped := _mapped_sections(annotation):
        return f"{child}.<{model.keyed_by.get(name, 'name')}>", mapped
    return (f"{child}[]" if _is_list_of_sections(annotation) else child), _sections(annotation)


def sections(model: type[Section] = Config, path: str = "", tag: str | None = None,
             within: tuple[type[Section], ...] = ()) -> Iterator[_Section]:
    """Every section of the file, parents first, in the order of the schema's fields; a model
    inside itself (a condition's ``any:``) once."""
    yield _Section(path, model, tag)
    if model in within:
        return
    for name, field in model.model_fields.items():
        child, members = _placed(model, path, name)
        discriminator = field.discriminator if isinstance(field.discriminator, str) else None
        for member in members:
            member_tag = None
            if discriminator is not None:
                member_tag = str(typing.get_args(member.model_fields[discriminator].annotation)[0])
            if member not in within and member is not model:
                yield from sections(member, child, member_tag, (*within, model))


def _links(found: list[_Section], section: _Section, name: str) -> dict[type[Section], str]:
    """The sections field ``name`` of ``section`` holds, each as a link: the one at the field's
    place, else (a model inside itself) the model's first section."""
    child, members = _placed(section.model, section.path, name)
    out = {}
    for member in members:
        here = [s for s in found if s.model is member and s.path == child] or [s for s in found if s.model is member]
        out[member] = f"section [{here[0].title}](#{here[0].anchor})"
    return out


@cache
def _comments(module: types.ModuleType) -> dict[tuple[str, str], str]:
    """The ``#:`` comments of ``module``'s source: (class name, field) for fields and ("", name)
    for module-level names, each the comment lines right above the assignment."""
    lines = inspect.getsource(module).splitlines()

    def above(lineno: int) -> str:
        found: list[str] = []
        i = lineno - 2
        while i >= 0 and lines[i].strip().startswith("#:"):
            found.insert(0, lines[i].strip().removeprefix("#:").strip())
            i -= 1
        return " ".join(found)

    out: dict[tuple[str, str], str] = {}
    tree = ast.parse("\n".join(lines))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and above(item.lineno):
                    out[node.name, item.target.id] = above(item.lineno)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and above(node.lineno):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    out["", target.id] = above(node.lineno)
    return out


@cache
def _annotation_names(model: type[Section]) -> dict[str, list[str]]:
    """The names each field's annotation is written with in the source (``NoFunction | None``)."""
    (definition,) = ast.parse(textwrap.dedent(inspect.getsource(model))).body
    assert isinstance(definition, ast.ClassDef)
    out: dict[str, list[str]] = {}
    for item in definition.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out[item.target.id] = [node.id for node in ast.walk(item.annotation) if isinstance(node, ast.Name)]
    return out


def description(model: type[Section], name: str) -> str:
    """What the schema says about ``model``'s field ``name`` (see the module's docstring)."""
    field = model.model_fields[name]
    module = sys.modules[model.__module__]
    comments = _comments(module)
    own = field.description or next(
        (comments[owner.__name__, name] for owner in model.__mro__ if (owner.__name__, name) in comments), "")
    return " ".join(text for text in [own, *(_alias_comment(module, alias)
                                             for alias in dict.fromkeys(_annotation_names(model).get(name, [])))]
                    if text)


def _alias_comment(module: types.ModuleType, alias: str) -> str:
    """The ``#:`` comment of type alias ``alias`` as ``module`` names it, from the module that defines it
    (``ToastPolicy``, imported into the schema from ``config.shaping``)."""
    value = getattr(module, alias, None)
    package = module.__name__.partition(".")[0]
    for other in [module, *(m for n, m in sorted(sys.modules.items()) if n.startswith(f"{package}.") and m)]:
        if ("", alias) in _comments(other) and getattr(other, alias, None) is value:
            return _comments(other)["", alias]
    return ""


def _rst(text: str) -> str:
    """The docstrings' and comments' ``code`` as Markdown's `code` (a Sphinx role's :class:`~a.B` as `B`), and
    Python's None as YAML's null."""
    text = re.sub(r":[a-z]+:`~?(?:[\w]+\.)*([^`]+)`", r"`\1`", text)
    return re.sub(r"\bNone\b", "`null`", re.sub(r"``(.+?)``", r"`\1`", text))


def _xrefs(text: str, section: _Section, found: list[_Section]) -> str:
    """A comment's :class:`Model`, of a model with a section, as a link to that section: the one at
    ``section``'s path (a sibling form), else the model's first."""

    def link(match: re.Match[str]) -> str:
        named = [s for s in found if s.path and s.model.__name__ == match.group(1).rpartition(".")[2]]
        if not named:
            return match.group(0)
        target = ([s for s in named if s.path == section.path] or named)[0]
        return f"section [{target.title}](#{target.anchor})"

    return re.sub(r":class:`~?([\w.]+)`", link, text)


def _cell(text: str) -> str:
    return _rst(text).replace("|", "\\|").replace("\n", " ")


# -- types, constraints, defaults ---------------------------------------------------------------


def _validator_text(validator: AfterValidator) -> str:
    """What a name validator accepts: the ``expected`` a ``_matching`` check names in its
    error, else its docstring's first line."""
    func = validator.func
    expected = inspect.getclosurevars(func).nonlocals.get("expected")
    text = expected if isinstance(expected, str) else (inspect.getdoc(func) or "").partition("\n")[0]
    return text.rstrip(".")


def _constraints(metadata: list[Any], *, sized: str) -> list[str]:
    out = []
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            out.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Gt):
            out.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Le):
            out.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.Lt):
            out.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.MinLen) and item.min_length == 1:
            out.append("not empty")
        elif isinstance(item, annotated_types.MinLen):
            out.append(f"at least {item.min_length} {sized}")
        elif isinstance(item, annotated_types.MaxLen):
            out.append(f"at most {item.max_length} {sized}")
        elif isinstance(item, AfterValidator) and _validator_text(item):
            out.append(_validator_text(item))
    return out


def _unwrapped(annotation: Any) -> Any:
    """``X`` of ``Annotated[X, …]`` (a tagged union's member), else ``annotation``."""
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation


def type_text(annotation: Any, metadata: list[Any], links: Mapping[type[Section], str], keys: str | None = None) -> str:
    """``annotation`` in words: `string`, `integer ≥ 1`, `list of [section](#…)`, `one of …`; ``keys``: what
    a mapping's keys are (``column name``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        return type_text(inner, [*extra, *metadata], links, keys)
    if origin in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if _unwrapped(arg) is not type(None)]
        text = " or ".join(type_text(arg, metadata if len(args) == 1 else [], links, keys) for arg in args)
        return f"{text}, or null" if len(args) < len(typing.get_args(annotation)) else text
    if origin is Literal:
        values = [f"`{value}`" for value in typing.get_args(annotation)]
        return f"one of {', '.join(values)}" if len(values) > 1 else values[0]
    if origin is list:
        (item,) = typing.get_args(annotation)
        each = type_text(item, [], links)
        base = ("list" if item is Any else f"list, each {each}" if typing.get_origin(item) is Literal
                else f"list of {each}")
        sized = "items"
    elif origin is dict:
        key, value = typing.get_args(annotation)
        sized = "keys"
        base = ("mapping" if value is Any
                else f"mapping of {keys or type_text(key, [], links)} to {type_text(value, [], links)}")
    elif annotation is Any:
        base, sized = "any value", "characters"
    elif isinstance(annotation, type) and annotation in links:
        return links[annotation]
    elif annotation is SecretStr:
        base, sized = "string, secret (never shown in logs or errors)", "characters"
    elif annotation is Path:
        kinds = [item.path_type for item in metadata if type(item).__name__ == "PathType"]
        base, sized = f"path to an existing {kinds[0] if kinds else 'path'}", "characters"
    else:
        names = {bool: "boolean", int: "integer", str: "string", float: "number"}
        base = names.get(annotation, getattr(annotation, "__name__", str(annotation)))
        sized = "characters"
    constraints = _constraints(metadata, sized=sized)
    return f"{base} ({', '.join(constraints)})" if constraints else base


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, Section):
        return "(its defaults)"
    if isinstance(value, SecretStr):
        return "(secret)"
    flow = yaml.safe_dump(value, default_flow_style=True, width=1_000).strip()
    return f"`{flow.removesuffix('...').strip()}`"


# -- validators: rules and notes ----------------------------------------------------------------


def _decorated(model: type[Section]) -> list[Any]:
    """The functions of ``model``'s own validators, in the order they are declared."""
    decorators: Any = model.__pydantic_decorators__  # pydantic's DecoratorInfos: public, typed loosely
    found = [*decorators.field_validators.values(), *decorators.model_validators.values()]
    own = [d.func for d in found if d.cls_var_name in vars(model)]
    return sorted(own, key=lambda func: inspect.getsourcelines(func)[1])


def rules(model: type[Section]) -> list[str]:
    """The messages of ``model``'s validators' plain ``raise ValueError("…")``: each a rule."""
    out = []
    for func in _decorated(model):
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id == "ValueError"
                    and node.exc.args and isinstance(node.exc.args[0], ast.Constant)
                    and isinstance(node.exc.args[0].value, str)):
                out.append(node.exc.args[0].value)
    return out


def notes(model: type[Section]) -> list[str]:
    """The docstrings of ``model``'s validators: what they accept besides the keys above."""
    docs = [inspect.getdoc(func) for func in _decorated(model)]
    return [" ".join(doc.split()) for doc in docs if doc]


# -- checking examples and refusals ------------------------------------------------------------


def _parts(path: str) -> list[str | int]:
    """``sinks[].destination`` as keys and indexes into the file: ``["sinks", 0, "destination"]``."""
    out: list[str | int] = []
    for part in filter(None, path.split(".")):
        if part.startswith("<"):
            raise GenerationError(f"'{path}' names no one place in the file: check the mapping that holds it")
        out += [part.removesuffix("[]"), 0] if part.endswith("[]") else [part]
    return out


def _merged(base: Any, extra: Any) -> Any:
    """``base`` with ``extra`` merged in: mappings key by key, lists entry by entry, else ``extra``."""
    if isinstance(base, dict) and isinstance(extra, dict):
        return {**base, **{key: _merged(base.get(key), value) for key, value in extra.items()}}
    if isinstance(base, list) and isinstance(extra, list):
        return [_merged(b, e) for b, e in zip(base, extra, strict=False)] + base[len(extra):] + extra[len(base):]
    return copy.deepcopy(extra)


def _with(path: str, value: Any, base: Any = None) -> Any:
    """``base`` (default :data:`BASE`) with ``value`` in place of the section at ``path`` (made if missing)."""
    keys = _parts(path)
    if not keys:
        return copy.deepcopy(value)
    data = copy.deepcopy(BASE if base is None else base)
    here: Any = data
    for key, below in zip(keys, [*keys[1:], None], strict=True):
        if isinstance(here, list):
            here.extend({} for _ in range(int(key) + 1 - len(here)))
        elif key not in here:
            here[key] = [] if isinstance(below, int) else {}
        if below is None:
            here[key] = value
        else:
            here = here[key]
    return data


def _section_of(path: str, data: Any) -> Any:
    """The section at ``path`` in ``data`` (an example written from the top of the file); None if missing."""
    for part in _parts(path):
        found = (isinstance(data, list) and isinstance(part, int) and part < len(data)
                 or isinstance(data, dict) and part in data)
        if not found:
            return None
        data = data[part]
    return data


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _load(data: dict[str, Any]) -> list[str]:
    """Load ``data`` as a config file; return its warnings."""
    logger = logging.getLogger("walflow.config")
    collect = _Collect()
    logger.addHandler(collect)
    try:
        parse_config(yaml.safe_dump(data), source="the example", env=_ENV)
    finally:
        logger.removeHandler(collect)
    return collect.messages


def _example(section: _Section) -> dict[str, Any]:
    """The config an example is checked as: :data:`BASE` with the example's keys merged in, and
    the section's whole list or mapping (``sinks[].tables[]``: ``tables``) the example's."""
    example = yaml.safe_load(EXAMPLES[section.key])
    checked = re.sub(r"(\[\]|\.<[^.]+>)$", "", section.path)
    if _section_of(checked, example) is None:
        raise GenerationError(f"the example of section '{section.key}' in config/reference.py EXAMPLES does not "
                              f"hold {checked or 'a file'}")
    data: dict[str, Any] = _with(checked, _section_of(checked, example), _merged(BASE, example))
    return data


def check_example(section: _Section) -> None:
    """The example of ``section`` loads, in place of that section of :data:`BASE`, without a warning."""
    where = f"the example of section '{section.key}' in config/reference.py EXAMPLES"
    try:
        warnings = _load(_example(section))
    except ConfigError as exc:
        raise GenerationError(f"{where} does not load: {exc}") from None
    if warnings:
        raise GenerationError(f"{where} warns: {'; '.join(warnings)}")


def refusal(path: str, refused: Refusal) -> str:
    """What the loader says to ``refused`` in section ``path``."""
    key, value = refused.key, refused.value
    base = _merged(BASE, refused.beside or {})
    section = re.sub(r"\[\]", "[0]", path)
    where = f"{section}.{key}"
    try:
        _load(_with(path, {**(_section_of(path, base) or {}), key: value}, base))
    except ConfigError as exc:
        for problem in exc.problems:  # at the key or below it, or at its section by a validator that names the key
            if (problem.startswith((f"{where}: ", f"{where}.", f"{where}["))
                    or (problem.startswith(f"{section}: ") and key in problem)):
                return problem.partition(": ")[2]
        raise GenerationError(f"{where} is refused, but not by name: {exc}") from None
    raise GenerationError(f"{where}: {value!r} is no longer refused: update config/reference.py REFUSED")


# -- the page ----------------------------------------------------------------------------------

_INTRO = f"""\
# Configuration reference

<!-- Generated from config/schema.py by `{COMMAND}`; tests/config/test_reference.py keeps it current. Do not edit. -->

walflow reads Sequin's YAML for a Postgres source and NATS sinks, plus a `walflow:` section
for its own tunables. Every section below lists its keys (type, allowed values, default,
what the key does), the Sequin keys walflow accepts and ignores with one warning each, the
ones it refuses with the error it gives, and an example. An unknown key is an error that
names its path (`sinks[0].destination.prot: unknown key (did you mean 'port'?)`), except at
the top level, where it is ignored with a warning, as Sequin does.

Values may use `${{VAR}}`, `${{VAR:-default}}` and the shell's other forms (the README's
*Configuration* section has the rules). `[]` in a path marks a list: `databases[]` is each
entry of `databases:`; `<column>` a mapping's keys: `columns.mask.<column>` is each entry of
`mask:`. A key that takes several forms (`routing: {{subject: …}}` or `routing: {{python: …}}`)
has a section for each form, titled by the key that tells it apart.
"""


def _section_text(section: _Section, found: list[_Section]) -> list[str]:
    model = section.model
    out = [f'<a id="{section.anchor}"></a>', "", f"## {section.title}", ""]
    if model.__doc__:
        out += [" ".join(_rst(inspect.getdoc(model) or "").split()), ""]
    out += ["| key | type | default | |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        keys = f"{model.keyed_by[name]} name" if name in model.keyed_by else None
        kind = type_text(field.annotation, list(field.metadata), _links(found, section, name), keys)
        out.append(f"| `{field.alias or name}` | {_cell(kind)} | {_cell(default_text(field))} "
                   f"| {_cell(_xrefs(description(model, name), section, found))} |")
    out.append("")
    if rules(model):
        out += ["Rules (each broken one is an error saying so):", ""]
        out += [f"- {_rst(rule)}" for rule in rules(model)] + [""]
    if notes(model):
        out += ["Also accepted:", ""] + [f"- {_rst(note)}" for note in notes(model)] + [""]
    if model.unknown_keys is not None:
        out += [f"Any other key here is ignored with a warning: {model.unknown_keys}.", ""]
    if model.ignored:
        out += ["Sequin keys ignored, with one warning each:", "", "| key | why |", "|---|---|"]
        out += [f"| `{key}` | {_cell(why)} |" for key, why in model.ignored.items()] + [""]
    if model.replaced:
        out += ["Sequin values run as another, with one warning each:", "", "| key | Sequin's | runs as | why |",
                "|---|---|---|---|"]
        out += [f"| `{key}` | `{value}` | `{runs_as}` | {_cell(why)} |"
                for key, values in model.replaced.items() for value, (runs_as, why) in values.items()] + [""]
    if REFUSED.get(section.key):
        out += ["Refused (the file does not load), with walflow's error:", "", "| given | error |", "|---|---|"]
        for refused in REFUSED[section.key]:
            given = yaml.safe_dump({refused.key: refused.value}, default_flow_style=True, width=1_000,
                                   sort_keys=False).strip()[1:-1]
            out.append(f"| `{given}` | {_cell(refusal(section.path, refused))} |")
        out.append("")
    if section.key not in EXAMPLES:
        raise GenerationError(f"section '{section.key}' has no example: add one to config/reference.py EXAMPLES")
    check_example(section)
    out += ["```yaml", EXAMPLES[section.key].rstrip(), "```", ""]
    return out


def render() -> str:
    """The whole page, for the schema as it is now."""
    found = list(sections())
    keys = [s.key for s in found]
    if len(set(keys)) != len(keys):
        twice = sorted({key for key in keys if keys.count(key) > 1})
        raise GenerationError(f"sections {twice} are found twice: give their models distinct forms (Section.form)")
    for key in [*EXAMPLES, *REFUSED]:
        if key not in keys:
            raise GenerationError(f"config/reference.py names section '{key}', which the schema no longer has")
    out = [_INTRO, "Sections:", ""]
    out += [f"{'  ' * s.depth}- [{s.title}](#{s.anchor})" for s in found] + [""]
    for section in found:
        out += _section_text(section, found)
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    """Write :data:`OUTPUT` (``python -m config.reference``)."""
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
