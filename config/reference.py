"""The configuration reference, ``docs/configuration.md``, generated from the schema.

``python -m config.reference`` writes it; ``tests/config/test_reference.py`` fails when the
file differs from what the schema generates now, so it cannot go stale.

Everything it says comes from ``config/schema.py`` itself, so a new key is documented by
the one line (and comment) that adds it:

- sections and keys by walking :class:`~config.schema.Config`'s models, their types,
  constraints, allowed values and defaults from pydantic's field information;
- a key's description from ``Field(description=…)`` when given, else from the ``#:``
  comment above it in the source (the schema's convention, Sphinx's too), else from the
  ``#:`` comment of the type alias it is declared with (``NoFunction``). The comments are
  read with :mod:`ast` from the module's source rather than moved into ``Field(…)``:
  the schema stays as it is written and read, and a comment is found by the line of the
  field it sits above, which no reformatting of the field itself can break;
- each model's ``ignored`` and ``replaced`` mappings, the messages of its validators'
  plain ``raise ValueError("…")`` rules, and their docstrings (the other Sequin spellings
  a validator maps);
- what is refused, by loading each entry of :data:`REFUSED` and quoting the error the
  loader gives.

The examples (:data:`EXAMPLES`) are the only text written here: each is loaded in place of
its section of a minimal config, and generation fails if one does not load or warns.
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
from typing import Any, Literal

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
_ENV = {"PGPASSWORD": "example", "NATS_PASSWORD": "example"}

#: One example per section, as YAML from the top of the file; checked in place of that section of :data:`BASE`.
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
    ssl: true
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
    destination: {type: nats, host: nats.internal}
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
      - name: public.customers           # grouped by its primary key
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
    "sinks[].destination": """\
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
  health: {enabled: true, host: 0.0.0.0, port: 9187}
""",
}

#: Sequin keys (or values) walflow refuses, per section: checked by loading each, quoted with the error it gives.
REFUSED: dict[str, list[tuple[str, Any]]] = {
    "databases[]": [("primary", {"hostname": "primary.internal"}), ("use_local_tunnel", True)],
    "sinks[]": [
        ("filters", [{"column_name": "status", "operator": "=", "comparison_value": "paid"}]),
        *[(key, "my_function") for key in ("filter", "transform", "routing", "enrichment")],
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
    def anchor(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", (self.path or "top-level").lower()).strip("-")

    @property
    def title(self) -> str:
        name = f"`{self.path}`" if self.path else "Top level"
        return f"{name} (`type: {self.tag}`)" if self.tag else name


def _is_list_of_sections(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        return _is_list_of_sections(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_list_of_sections(arg) for arg in typing.get_args(annotation))
    return typing.get_origin(annotation) is list and bool(_sections(annotation))


def sections(model: type[Section] = Config, path: str = "", tag: str | None = None,
             within: tuple[type[Section], ...] = ()) -> Iterator[_Section]:
    """Every section of the file, parents first, in the order of the schema's fields; a model
    inside itself (a condition's ``any:``) once."""
    yield _Section(path, model, tag)
    if model in within:
        return
    for name, field in model.model_fields.items():
        child = f"{path}.{name}" if path else name
        if _is_list_of_sections(field.annotation):
            child += "[]"
        discriminator = field.discriminator if isinstance(field.discriminator, str) else None
        for member in _sections(field.annotation):
            member_tag = None
            if discriminator is not None:
                member_tag = str(typing.get_args(member.model_fields[discriminator].annotation)[0])
            if member not in within and member is not model:
                yield from sections(member, child, member_tag, (*within, model))


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
    if field.description:
        return field.description
    module = sys.modules[model.__module__]
    comments = _comments(module)
    for owner in model.__mro__:
        if (owner.__name__, name) in comments:
            return comments[owner.__name__, name]
    for alias in _annotation_names(model).get(name, []):
        if ("", alias) in comments:
            return comments["", alias]
    return ""


def _rst(text: str) -> str:
    """The docstrings' and comments' ``code`` as Markdown's `code`, and Python's None as YAML's null."""
    return re.sub(r"\bNone\b", "`null`", re.sub(r"``(.+?)``", r"`\1`", text))


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


def type_text(annotation: Any, metadata: list[Any], links: Mapping[type[Section], str]) -> str:
    """``annotation`` in words: `string`, `integer ≥ 1`, `list of [section](#…)`, `one of …`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        return type_text(inner, [*extra, *metadata], links)
    if origin in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        text = " or ".join(type_text(arg, metadata if len(args) == 1 else [], links) for arg in args)
        return f"{text}, or null" if len(args) < len(typing.get_args(annotation)) else text
    if origin is Literal:
        values = [f"`{value}`" for value in typing.get_args(annotation)]
        return f"one of {', '.join(values)}" if len(values) > 1 else values[0]
    if origin is list:
        (item,) = typing.get_args(annotation)
        each = type_text(item, [], links)
        base = f"list, each {each}" if typing.get_origin(item) is Literal else f"list of {each}"
        sized = "items"
    elif origin is dict:
        base, sized = "mapping", "keys"
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
        out += [part.removesuffix("[]"), 0] if part.endswith("[]") else [part]
    return out


def _with(path: str, value: Any) -> Any:
    """:data:`BASE` with ``value`` in place of the section at ``path`` (made if missing)."""
    keys = _parts(path)
    if not keys:
        return copy.deepcopy(value)
    data = copy.deepcopy(BASE)
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
    """The section at ``path`` in ``data`` (an example written from the top of the file)."""
    for part in _parts(path):
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


def check_example(path: str) -> None:
    """The example of section ``path`` loads, in place of that section of :data:`BASE`, without a warning."""
    try:
        warnings = _load(_with(path, _section_of(path, yaml.safe_load(EXAMPLES[path]))))
    except ConfigError as exc:
        raise GenerationError(f"the example of section '{path}' in config/reference.py EXAMPLES does not load: {exc}") from None
    if warnings:
        raise GenerationError(f"the example of section '{path}' in config/reference.py EXAMPLES warns: {'; '.join(warnings)}")


def refusal(path: str, key: str, value: Any) -> str:
    """What the loader says to ``key: value`` in section ``path``."""
    section = re.sub(r"\[\]", "[0]", path)
    where = f"{section}.{key}"
    try:
        _load(_with(path, {**_section_of(path, BASE), key: value}))
    except ConfigError as exc:
        for problem in exc.problems:  # at the key, or at its section by a validator that names the key
            if problem.startswith(f"{where}: ") or (problem.startswith(f"{section}: ") and key in problem):
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
entry of `databases:`.
"""


def _section_text(section: _Section, links: Mapping[type[Section], str]) -> list[str]:
    model = section.model
    out = [f'<a id="{section.anchor}"></a>', "", f"## {section.title}", ""]
    if model.__doc__:
        out += [" ".join(_rst(inspect.getdoc(model) or "").split()), ""]
    out += ["| key | type | default | |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        kind = type_text(field.annotation, list(field.metadata), links)
        out.append(f"| `{name}` | {_cell(kind)} | {_cell(default_text(field))} | {_cell(description(model, name))} |")
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
    if REFUSED.get(section.path):
        out += ["Sequin keys refused (the file does not load), with walflow's error:", "", "| key | error |",
                "|---|---|"]
        for key, value in REFUSED[section.path]:
            given = yaml.safe_dump({key: value}, default_flow_style=True, width=1_000, sort_keys=False).strip()[1:-1]
            out.append(f"| `{given}` | {_cell(refusal(section.path, key, value))} |")
        out.append("")
    if section.path not in EXAMPLES:
        raise GenerationError(f"section '{section.path}' has no example: add one to config/reference.py EXAMPLES")
    check_example(section.path)
    out += ["```yaml", EXAMPLES[section.path].rstrip(), "```", ""]
    return out


def render() -> str:
    """The whole page, for the schema as it is now."""
    found = list(sections())
    links = {s.model: f"section [{s.path}](#{s.anchor})" for s in found}
    known = {s.path for s in found}
    for path in [*EXAMPLES, *REFUSED]:
        if path not in known:
            raise GenerationError(f"config/reference.py names section '{path}', which the schema no longer has")
    out = [_INTRO, "Sections:", ""]
    out += [f"{'  ' * s.path.count('.')}- [{s.title}](#{s.anchor})" for s in found] + [""]
    for section in found:
        out += _section_text(section, links)
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    """Write :data:`OUTPUT` (``python -m config.reference``)."""
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
