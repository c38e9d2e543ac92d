"""Reading a config file: parse YAML, drop Sequin-only keys, interpolate, validate.

Every error names the key path (``sinks[0].destination.port: …``) and says what is
expected, so a user can fix the file without reading walflow's code. Keys are dropped before
references are resolved, so a variable that only a dropped key uses (``users:`` …) need
not be set.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from config.interpolate import InterpolationError, Marked
from config.schema import Config, Section
from core.errors import FatalError

log = logging.getLogger("walflow.config")

DEFAULT_PATH = "config/walflow.yaml"

Location = Sequence[str | int]


class ConfigError(FatalError):
    """The config cannot be used; ``problems`` holds one ``path: message`` line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"invalid walflow config {source}:\n" + "\n".join(f"  {p}" for p in problems))


def config_path(env: Mapping[str, str] | None = None) -> str:
    """The file named by ``WALFLOW_CONFIG``, else ``config/walflow.yaml``."""
    return (env if env is not None else os.environ).get("WALFLOW_CONFIG") or DEFAULT_PATH


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Load and validate the config file at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read the file: {exc.strerror or exc}"]) from None
    return parse_config(text, source=str(path), env=env)


def parse_config(text: str, *, source: str = "<string>", env: Mapping[str, str] | None = None) -> Config:
    """Validate config ``text``; warnings go to the ``walflow.config`` logger."""
    try:
        marked = Marked(text)
    except InterpolationError as exc:
        raise ConfigError(source, [f"(top level): {exc}"]) from None
    try:
        data = yaml.safe_load(marked.text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [_yaml_problem(exc, marked)]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping with databases: and sinks:"])
    restore_keys(marked, data)
    if isinstance(data.get("transforms"), list):  # an older Sequin's name of functions: (its path transforms)
        data["functions"] = [*(data.get("functions") or []), *data.pop("transforms")]
    warnings = drop_ignored(Config, data, ())
    problems = resolve_references(marked, data, os.environ if env is None else env)
    warnings += replace_values(Config, data, ())
    warnings += masked_secrets(data, ())
    for warning in warnings:
        log.warning(warning)
    if problems:
        raise ConfigError(source, problems)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [describe(error) for error in exc.errors()]) from None


# -- secrets ---------------------------------------------------------------------------------


def fields_below(model: type[BaseModel]) -> Iterator[tuple[type[BaseModel], str, FieldInfo]]:
    """(model, name, field) of every field of ``model`` and of each model its fields hold
    (alone, optional, in a list …), each model once: the one walk over the config's models."""
    seen: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, field in current.model_fields.items():
            yield current, name, field
            todo += [t for t in _types_in(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]


def holds_secret(field: FieldInfo) -> bool:
    """Whether ``field`` is of a ``SecretStr`` type (alone, optional, in a list …)."""
    return SecretStr in _types_in(field.annotation)


def secret_keys(model: type[Section]) -> frozenset[str]:
    """The names of the keys that hold secrets in ``model`` and every model below it: fields
    of a ``SecretStr`` type, fields that are ``repr=False`` (URLs that may carry credentials)
    and each model's ``secret_keys``. Found by walking the models, so that a secret field
    added anywhere is kept out of every error without being listed here."""
    found: set[str] = set()
    for owner, name, field in fields_below(model):
        found |= getattr(owner, "secret_keys", frozenset())
        if field.repr is False or holds_secret(field):
            found.add(name)
    return frozenset(found)


def _types_in(annotation: Any) -> Iterator[Any]:
    """``annotation`` and everything it is made of (``X | None``, ``list[X]``, ``dict[str, X]``,
    ``Annotated[X, …]``, recursively)."""
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _types_in(arg)


#: Every key of the config that may hold a secret: errors never repeat what it was given.
_SECRET_KEYS: frozenset[str] = secret_keys(Config)


def _is_secret(loc: Location) -> bool:
    """Whether the value at ``loc`` is (or is inside) a key that may hold a secret; by name, so
    that it holds for a path the models cannot follow (an unknown form, a reference not yet
    resolved in a ``type:``): a column named ``password`` hides no more than its mask's inputs."""
    return any(part in _SECRET_KEYS for part in loc)


# -- secrets an export masked ---------------------------------------------------------------

#: Sequin.String.obfuscate's output: all stars (up to 5 characters), one character, stars and
#: one (6-9), three, 2-20 stars and one (longer).
_MASKED = re.compile(r"\*{1,5}|.\*{4,7}.|.{3}\*{2,20}.", re.DOTALL)


def masked_secrets(data: Any, loc: Location) -> list[str]:
    """One warning per secret that looks as ``sequin config export`` writes it without
    ``--show-sensitive``: used as it is, it would only fail later, as a failed login."""
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key in _SECRET_KEYS and isinstance(value, str) and _MASKED.fullmatch(value):
                found.append(f"{format_path([*loc, str(key)])} looks masked, as `sequin config export` writes "
                             "secrets without --show-sensitive: export again with it, or write the secret")
            else:
                found += masked_secrets(value, [*loc, str(key)])
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += masked_secrets(value, [*loc, i])
    return found


# -- ignored keys --------------------------------------------------------------------------


def drop_ignored(model: type[Section], data: Any, loc: Location) -> list[str]:
    """Remove the keys that ``model`` (and the models below it) ignore; return one warning each."""
    warnings = []
    for section, values, where in _sections_in(model, data, loc):
        for key, reason in section.ignored.items():
            if key in values:
                del values[key]
                warnings.append(f"{format_path([*where, key])} is ignored: {reason}")
        if section.unknown_keys is not None:
            for key in [key for key in values if key not in section.model_fields]:
                del values[key]
                # closer than for errors: a YAML anchor's base is no typo of "databases"
                close = difflib.get_close_matches(str(key), [*section.model_fields, *section.ignored], n=1, cutoff=0.8)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                warnings.append(f"{format_path([*where, str(key)])} is ignored: {section.unknown_keys}{hint}")
    return warnings


def replace_values(model: type[Section], data: Any, loc: Location) -> list[str]:
    """Put walflow's value where ``model`` (or a model below it) replaces Sequin's; one warning each."""
    warnings = []
    for section, values, where in _sections_in(model, data, loc):
        for key, replacements in section.replaced.items():
            value = values.get(key)
            if isinstance(value, str) and value in replacements:
                values[key], reason = replacements[value]
                warnings.append(f"{format_path([*where, key])}: {value} is run as {values[key]}: {reason}")
    return warnings


def _sections_in(
    model: type[Section], data: Any, loc: Location
) -> Iterator[tuple[type[Section], dict[Any, Any], Location]]:
    """Each mapping in ``data`` that a Section validates, with its model and path, parents first
    (a parent's keys may be changed before its children are looked up)."""
    if not isinstance(data, dict):
        return
    yield model, data, loc
    for name, field in model.model_fields.items():
        if name not in data:
            continue
        value = data[name]
        if isinstance(value, list):
            for i, item in enumerate(value):
                if (child := _section_for(field, item)) is not None:
                    yield from _sections_in(child, item, [*loc, name, i])
        elif (child := _section_for(field, value)) is not None:
            yield from _sections_in(child, value, [*loc, name])


def _sections(annotation: Any) -> list[type[Section]]:
    """The Section models inside ``X``, ``list[X]``, ``X | None`` or a union of them (annotated or not)."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return [annotation]
    if typing.get_origin(annotation) is typing.Annotated:
        return _sections(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in _sections(arg)]
    return []


def _discriminator(field: FieldInfo) -> str | None:
    return field.discriminator if isinstance(field.discriminator, str) else None


def _tagged(field: FieldInfo, tag: object) -> type[Section] | None:
    """The member of ``field``'s discriminated union whose tag is ``tag``."""
    discriminator = _discriminator(field)
    for model in _sections(field.annotation):
        member = model.model_fields.get(discriminator or "")
        if member is not None and tag in typing.get_args(member.annotation):
            return model
    return None


def _section_for(field: FieldInfo, data: Any) -> type[Section] | None:
    """The model ``data`` is validated with: in a discriminated union, the member its tag names."""
    if _discriminator(field) is not None:
        return _tagged(field, data.get(_discriminator(field)) if isinstance(data, dict) else None)
    models = _sections(field.annotation)
    return models[0] if models else None


# -- references ------------------------------------------------------------------------------


def restore_keys(marked: Marked, data: Any) -> None:
    """Give ``data``'s keys their text back: keys are not interpolated (as in Sequin)."""
    for container, _ in _containers(data, []):
        if isinstance(container, dict):
            items = [(marked.restore(key) if isinstance(key, str) else key, value) for key, value in container.items()]
            container.clear()
            container.update(items)


def resolve_references(marked: Marked, data: Any, env: Mapping[str, str]) -> list[str]:
    """Resolve the references in ``data``'s strings in place; one problem per value that cannot be resolved."""
    problems = []
    for container, loc in _containers(data, []):
        for key in range(len(container)) if isinstance(container, list) else list(container):
            if isinstance(value := container[key], str):
                where = [*loc, _part(container, key)]
                try:
                    container[key] = marked.resolve(value, env, secret=_is_secret(where))
                except InterpolationError as exc:
                    problems.append(f"{format_path(where)}: {exc}")
    return problems


def _containers(data: Any, loc: list[str | int]) -> Iterator[tuple[dict[Any, Any] | list[Any], list[str | int]]]:
    """Every mapping and list in ``data`` once (YAML aliases share them), with its path, parents first."""
    seen: set[int] = set()
    stack: list[tuple[Any, list[str | int]]] = [(data, loc)]
    while stack:
        container, where = stack.pop()
        if not isinstance(container, dict | list) or id(container) in seen:
            continue
        seen.add(id(container))
        yield container, where
        items = enumerate(container) if isinstance(container, list) else container.items()
        stack.extend((value, [*where, _part(container, key)]) for key, value in reversed(list(items)))


def _part(container: dict[Any, Any] | list[Any], key: Any) -> str | int:
    """``key`` as a part of a path: an index in a list, a name in a mapping (whatever YAML made of it)."""
    return key if isinstance(container, list) else str(key)


# -- error messages --------------------------------------------------------------------------


def format_path(loc: Location) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def describe(error: ErrorDetails) -> str:
    """One line for one pydantic error: the key path, then what is wrong and what is expected."""
    raw = [part for part in error["loc"] if not _is_tag(part)]
    loc, _ = _walk(raw)
    path = format_path(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{path}: unknown key{_suggestion(list(error['loc']))}"
    if kind == "missing":
        return f"{path}: required key is missing"
    context = error.get("ctx") or {}
    if kind == "union_tag_not_found":
        return f"{path}.{context['discriminator'].strip(chr(39))}: required key is missing"
    if kind == "union_tag_invalid":
        return (f"{path}.{context['discriminator'].strip(chr(39))}: Input should be {context['expected_tags']} "
                f"(got {context['tag']!r})")
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if not loc and ":" in message.split(" ")[0]:
        return message  # a cross-reference check that names its own path
    if kind not in ("value_error", "assertion_error") and not _is_secret(loc):
        message += f" (got {_show(error.get('input'))})"
    return f"{path}: {message}"


def _is_tag(part: str | int) -> bool:
    """Pydantic adds a union member's name to the location (``str``, ``list[str]``)."""
    return isinstance(part, str) and (part in ("str", "int", "bool", "null") or "[" in part
                                      or part.startswith(("function-", "form:")))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _suggestion(loc: Location) -> str:
    """Which keys are known where ``loc`` (as pydantic gives it, tags included) ends."""
    _, model = _walk(loc[:-1])
    if model is None:
        return ""
    known = sorted(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{hint}; expected one of: {', '.join(known)}"


def _walk(loc: Location) -> tuple[list[str | int], type[BaseModel] | None]:
    """``loc`` without the tags pydantic puts after a discriminated union's key, and the model
    the last part of it is validated with (None below a plain value)."""
    model: type[BaseModel] | None = Config
    out: list[str | int] = []
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if _is_tag(part):
            continue
        out.append(part)
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            model = None
        elif _discriminator(field) is not None:
            while parts and isinstance(parts[0], int):  # a list of tagged sections
                out.append(parts.pop(0))
            model = _tagged(field, parts.pop(0)) if parts else None
        else:
            sections = _sections(field.annotation)
            if len(sections) > 1 and parts and isinstance(parts[0], str) and parts[0].startswith("form:"):
                python = parts[0] == "form:python"  # a function key's form (config/schema.py, _form_of)
                sections = [m for m in sections if (getattr(m, "form", None) == "python") == python]
            model = sections[0] if sections else None
    return out, model


def _yaml_problem(exc: yaml.YAMLError, marked: Marked) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = "line {}, column {}".format(*marked.position(mark.index)) if mark is not None else "(somewhere)"
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}: not valid YAML: {problem}"
