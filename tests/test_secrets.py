"""Secrets never show: a canary in every secret a config can hold, and every byte walflow writes searched for each.

The secret fields are found by walking the config's models (every ``SecretStr``, and the
``repr=False`` URLs that may carry credentials), not listed here: a config that validates is
filled in, wherever a secret field of it is still empty, with a canary of its own (a JWT and
an nkey seed too: nats-py uses them only when the server asks for a signature, which this
one, with its user and password, does not). A secret field that no config of this file reaches fails
:func:`test_every_secret_field_gets_a_canary`, naming it.

The pipeline runs for real (its own PostgreSQL, whose roles have canaries for passwords,
and its own NATS, whose user has one), in both log formats, a row going to the dead
letters; beside it ``walflow check`` and ``walflow status``, text and ``--json``, and
``/readyz`` and ``/metrics``. Then a NATS that refuses the credentials (the fatal line on
exit), and configs with every secret of the wrong type or with a ``$`` that does not
resolve. stdout, stderr, the logs, the HTTP bodies and every stored message are searched.
"""

from __future__ import annotations

import secrets
import textwrap
import typing
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from config.loader import fields_below, format_path, holds_secret, parse_config
from config.schema import Config, HealthSettings
from embedded import NatsServer, PostgresServer, wait_for
from embedded._process import free_port
from tests.backfill.helpers import log_text, walflow
from tests.pipeline import assert_running, pipeline, run_to_exit, stored

# it runs the pipeline (python -m bytewax.run) on a PostgreSQL and a NATS of its own
pytestmark = [pytest.mark.slow, pytest.mark.servers]


def canary(what: str) -> str:
    """A value found nowhere else: letters and digits only, so no encoding (JSON, a URL) changes it."""
    return f"cAnArY{what}{secrets.token_hex(6)}"


NATS_USER = "canary"
NATS_PASSWORD = canary("natspw")
#: The roles the pipeline logs in as: one given by a ``url:``, one by ``password:``.
HEALTH_PASSWORD = canary("healthpassword")
PG_ROLES = {"url": ("canary_url", canary("pgurl")), "fields": ("canary_fields", canary("pgpw"))}
DATABASE, TABLE = "canaries", "public.accounts"


def stream_of(form: str) -> str:
    """Each form's runs publish to a stream (and subjects, ``<form>.>``) of their own."""
    return f"CANARIES_{form.upper()}"


# -- the secret fields, found by walking the models ------------------------------------------


def secret_fields(model: type[BaseModel] = Config) -> set[tuple[str, str]]:
    """(model, field) of every ``SecretStr`` field in ``model`` and the models below it."""
    return {(owner.__name__, name) for owner, name, field in fields_below(model) if holds_secret(field)}


def _empty_secrets(value: Any, path: list[str | int]) -> Iterator[tuple[str, str, list[str | int]]]:
    """(model, field, path) of each ``SecretStr`` field that is None in the validated ``value``."""
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            child = getattr(value, name)
            if child is None and holds_secret(field):
                yield type(value).__name__, name, [*path, name]
            else:
                yield from _empty_secrets(child, [*path, name])
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _empty_secrets(item, [*path, i])
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _empty_secrets(item, [*path, key])


def _given_secrets(value: Any) -> set[tuple[str, str]]:
    if isinstance(value, BaseModel):
        given = {(type(value).__name__, name) for name, field in type(value).model_fields.items()
                 if holds_secret(field) and getattr(value, name) is not None}
        return given.union(*(_given_secrets(getattr(value, name)) for name in type(value).model_fields))
    if isinstance(value, list | tuple | dict):
        return set().union(*(_given_secrets(item) for item in (value.values() if isinstance(value, dict) else value)))
    return set()


def _valid(data: dict[str, Any]) -> bool:
    try:
        Config.model_validate(data)
    except ValidationError:
        return False
    return True


def fill_secrets(data: dict[str, Any], canaries: list[str]) -> set[tuple[str, str]]:
    """Put a canary (also appended to ``canaries``) in every secret field the validated ``data``
    leaves empty, as long as the config stays valid (a key that needs another, or excludes one
    already given, is tried again once others are filled: a JWT after its seed); the (model,
    field) pairs set. What no config can take is named by the test of the coverage."""
    filled: set[tuple[str, str]] = set()
    progress = True
    while progress:
        progress = False
        for model, name, path in _empty_secrets(Config.model_validate(data), []):
            value = canary(name.replace("_", ""))
            where: Any = data
            for part in path[:-1]:
                where = where[part] if isinstance(part, int) else where.setdefault(part, {})
            where[path[-1]] = value
            if _valid(data):
                canaries.append(value)
                filled.add((model, name))
                progress = True
            else:
                del where[path[-1]]
    return filled


# -- the configs ------------------------------------------------------------------------------


class Setup(typing.NamedTuple):
    pg_port: int
    nats_port: int
    nats_http_port: int
    directory: Path


def _config(setup: Setup, form: str, *, log_format: str = "text", health_port: int = 0,
            nats_password: str = NATS_PASSWORD, pg_password: str | None = None,
            nats_port: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """The config of a pipeline on ``setup``'s servers with a canary in every secret (``form``:
    the database given by ``url`` or by its ``fields``), and every canary in it; a password
    the server refuses, or another NATS port, if given."""
    role, password = PG_ROLES[form]
    password = pg_password or password
    nats_port = nats_port or setup.nats_port
    url_password, monitor_password = canary("serverurl"), canary("monitorurl")
    mask_secret = canary("masksecret")  # a hash needs a key for the config to validate at all
    signed = canary("jwt"), canary("nkeyseed")  # a JWT needs its seed
    canaries = [password, nats_password, url_password, monitor_password, mask_secret, *signed]
    key, cert = setup.directory / "client.key", setup.directory / "client.crt"
    for path in (key, cert):  # never read: the server offers no TLS, and libpq loads them only under TLS
        path.write_text("not read\n")
        path.chmod(0o600)
    where = ({"url": f"postgres://{role}:{password}@127.0.0.1:{setup.pg_port}/{DATABASE}"} if form == "url" else
             {"hostname": "127.0.0.1", "port": setup.pg_port, "database": DATABASE, "username": role,
              "password": password})
    data: dict[str, Any] = {
        "databases": [{"name": "shop", **where, "sslcert": str(cert), "sslkey": str(key),
                       "await_database": {"timeout_ms": 2_000, "interval_ms": 500},
                       "slot": {"name": f"canary_{form}", "create_if_not_exists": True},
                       "publication": {"name": f"canary_{form}", "create_if_not_exists": True}}],
        "sinks": [{
            "name": "accounts", "database": "shop", "partition_count": 1, "on_error": "dead_letter",
            "transform": {"python": "fragile:shape"},
            "tables": [{"name": TABLE, "columns": {"mask": {"ssn": {"hash": True, "secret": mask_secret}}}}],
            "destination": {
                "type": "nats", "username": NATS_USER, "password": nats_password, "confirm_delay_ms": 0,
                "servers": [f"nats://{NATS_USER}:{url_password}@127.0.0.1:{nats_port}"],
                "monitoring_urls": [f"http://monitor:{monitor_password}@127.0.0.1:{setup.nats_http_port}"],
                "subject_prefix": form, "stream": {"name": stream_of(form), "subjects": [f"{form}.>"]},
            },
        }, *({  # disabled, so never connected: for the secrets that are another way to log in
            "name": f"accounts-{way}", "database": "shop", "status": "disabled",
            "destination": {"type": "nats", "servers": [f"nats://127.0.0.1:{nats_port}"], **keys},
        } for way, keys in (("signed", {"jwt": signed[0], "nkey_seed": signed[1]}), ("other", {})))],
        "walflow": {"log_level": "debug", "log_format": log_format,
                    # basic credentials beside the url form, a bearer token (filled by the walk) beside the other
                    "health": {"enabled": bool(health_port), "port": health_port or 9187,
                               **({"username": "prom", "password": HEALTH_PASSWORD} if form == "url" else {})}},
    }
    if form == "url":
        canaries.append(HEALTH_PASSWORD)  # given, not filled: a password needs its username beside it
    fill_secrets(data, canaries)
    return data, canaries


def _write(setup: Setup, name: str, data: dict[str, Any]) -> Path:
    path = setup.directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# -- the servers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def canary_pg() -> Iterator[PostgresServer]:
    """PostgreSQL whose two login roles have canaries for passwords, and the table the sink reads."""
    with PostgresServer() as server:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            for role, password in PG_ROLES.values():  # superusers: they create the publication FOR ALL TABLES
                conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'")
            conn.execute(f"CREATE DATABASE {DATABASE}")
        with psycopg.connect(server.dsn(DATABASE), autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, ssn text, name text)")
        yield server


@pytest.fixture(scope="module")
def canary_nats() -> Iterator[NatsServer]:
    auth = f'authorization {{\n  user: {NATS_USER}\n  password: "{NATS_PASSWORD}"\n}}'
    with NatsServer(extra_config=auth) as server:
        yield server


@pytest.fixture
def setup(canary_pg: PostgresServer, canary_nats: NatsServer, tmp_path: Path) -> Setup:
    (tmp_path / "fragile.py").write_text(textwrap.dedent("""
        def shape(action, record, changes, metadata):
            if record["name"] == "grace":
                raise KeyError(record["ssn"])
            return record
        """))
    return Setup(canary_pg.port, canary_nats.port, canary_nats.http_port, tmp_path)


# -- searching ----------------------------------------------------------------------------------


def assert_no_canary(canaries: list[str], outputs: dict[str, str | bytes]) -> None:
    """No canary (nor the random tail that makes it one) in any of ``outputs`` (what -> its bytes)."""
    found = []
    for what, output in outputs.items():
        text = output.decode(errors="replace") if isinstance(output, bytes) else output
        for value in canaries:
            if value in text or value[-12:] in text:
                found.append(f"{value} in {what}:\n{text}")
    assert not found, "\n\n".join(found)


def _commands(config: Path) -> dict[str, str]:
    """``walflow check`` and ``status``, text and ``--json``: all each wrote."""
    out: dict[str, str] = {}
    for command in (["check"], ["check", "--json"], ["status", "--sample", "0"], ["status", "--sample", "0", "--json"]):
        done = walflow(*command, config, timeout=90)
        out[f"walflow {' '.join(command)} (stdout)"] = done.stdout
        out[f"walflow {' '.join(command)} (stderr)"] = done.stderr
    return out


def _get(port: int, path: str, authorization: str | None = None) -> tuple[int, str]:
    """A health endpoint's status and body (0 and "" while nothing listens); ``authorization``:
    the header the endpoint's credentials make, when the config gives it some."""
    headers = {"Authorization": authorization} if authorization else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers),
                                    timeout=5) as reply:
            return int(reply.status), str(reply.read().decode())
    except urllib.error.HTTPError as exc:
        return exc.code, str(exc.read().decode())
    except OSError:
        return 0, ""


def _ready(port: int, authorization: str | None) -> bool:
    """``/readyz`` says ready, for the slot (it says so before the slot is registered, too)."""
    code, body = _get(port, "/readyz", authorization)
    return code == 200 and '"slot": ' in body


# -- the tests ----------------------------------------------------------------------------------


def test_every_secret_field_gets_a_canary(tmp_path: Path) -> None:
    """Each secret field of the models holds a canary in one of this file's configs (a new one
    that cannot be filled in, for want of the section it belongs to, is named here)."""
    setup = Setup(5432, 4222, 8222, tmp_path)
    given: set[tuple[str, str]] = set()
    for form in PG_ROLES:
        data, _ = _config(setup, form)
        given |= _given_secrets(Config.model_validate(data))
    missing = secret_fields() - given
    assert not missing, (f"secret fields no config of tests/test_secrets.py could fill: {sorted(missing)}; give "
                         "_config what each needs beside it (or a disabled sink for another way to log in)")
    assert ("DatabaseConfig", "password") in given and ("Mask", "secret") in given  # the walk sees them


@pytest.mark.parametrize(("form", "log_format"), [("url", "text"), ("fields", "json")])
def test_a_running_pipeline_writes_no_secret(setup: Setup, canary_nats: NatsServer, form: str, log_format: str) -> None:
    """Logs (at debug), ``/readyz``, ``/metrics``, check and status in both modes, the stored
    messages and a dead letter: no canary anywhere, while the pipeline publishes."""
    port = free_port()
    data, canaries = _config(setup, form, log_format=log_format, health_port=port)
    config = _write(setup, f"running-{form}", data)
    # the credentials the walk filled in (a token, or a password beside the username)
    token = HealthSettings.model_validate(data["walflow"]["health"]).authorization
    outputs: dict[str, str | bytes] = {}
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: _ready(port, token), timeout=90, what="the pipeline to be ready", check=lambda: assert_running(proc))
        with psycopg.connect(canary_pg_dsn(setup), autocommit=True) as conn:
            first = 1 if form == "url" else 11  # the module's server holds the other run's rows
            conn.execute(f"INSERT INTO {TABLE} VALUES (%s, '123-45-6789', 'ada'), (%s, '987-65-4321', 'grace')",
                         (first, first + 1))
        wait_for(lambda: len(stored(_plain(canary_nats), stream_of(form))) >= 2, timeout=60,
                 what="the row and the dead letter", check=lambda: assert_running(proc))
        for path in ("/readyz", "/metrics", "/healthz"):
            outputs[path] = _get(port, path, token)[1]
        assert "walflow_" in outputs["/metrics"]
        outputs |= _commands(config)
    outputs["the pipeline's log"] = log_text(proc)
    messages = stored(_plain(canary_nats), stream_of(form))
    assert [m.subject for m in messages] == [f"{form}.shop.public.accounts.insert", f"{form}.shop.dead_letter"]
    for message in messages:
        outputs[f"stored message {message.seq} ({message.subject})"] = message.data + repr(message.headers).encode()
    assert outputs["the pipeline's log"].strip(), "the pipeline wrote no log"
    assert_no_canary(canaries, outputs)


@pytest.mark.parametrize(("server", "form"), [("nats", "fields"), ("postgres", "url")])
def test_refused_credentials_exit_without_secrets(setup: Setup, server: str, form: str) -> None:
    """NATS or PostgreSQL refusing the password: the pipeline's fatal line on exit (after the
    warnings of its retries), and check and status in both modes, hold no canary."""
    wrong = canary("wrongpw")
    data, canaries = (_config(setup, form, nats_password=wrong) if server == "nats" else
                      _config(setup, form, pg_password=wrong))
    config = _write(setup, f"refused-{server}", data)
    done = run_to_exit(config)
    assert done.returncode == 2, done.stderr
    assert ("refused the credentials" if server == "nats" else "password authentication failed") in done.stderr, \
        done.stderr
    outputs: dict[str, str | bytes] = {"the pipeline (stdout)": done.stdout, "the pipeline (stderr)": done.stderr,
                                       **_commands(config)}
    assert_no_canary(canaries, outputs)


def test_an_unreachable_nats_is_retried_without_secrets(setup: Setup) -> None:
    """The pipeline's warnings while NATS does not answer, and check and status saying so."""
    data, canaries = _config(setup, "url", nats_port=free_port())
    config = _write(setup, "unreachable", data)
    with pipeline(config, "-s", "1") as proc:
        wait_for(lambda: "cannot reach NATS at nats://127.0.0.1:" in log_text(proc), timeout=60,
                 what="the pipeline to say NATS is unreachable", check=lambda: assert_running(proc))
        outputs: dict[str, str | bytes] = {**_commands(config)}
    outputs["the pipeline's log"] = log_text(proc)
    assert "NATS unreachable at nats://127.0.0.1:" in outputs["walflow check (stdout)"]
    assert_no_canary(canaries, outputs)


def _wrong_types(data: dict[str, Any], canaries: list[str]) -> dict[str, Any]:
    """``data`` with every secret (and each URL that may hold one) given a value of the wrong
    type that holds a canary: a list or a mapping, whose repr an error would show."""
    broken: dict[str, Any] = yaml.safe_load(yaml.safe_dump(data))
    for _, name, path in _secret_paths(Config.model_validate(data), []):
        value = canary(name.replace("_", ""))
        canaries.append(value)
        where: Any = broken
        for part in path[:-1]:
            where = where[part]
        where[path[-1]] = {value: [value]}
    return broken


def _secret_paths(value: Any, path: list[str | int]) -> Iterator[tuple[str, str, list[str | int]]]:
    """(model, field, path) of each given secret field of ``value``, and of its servers."""
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            child = getattr(value, name)
            if child is not None and (holds_secret(field) or field.repr is False):
                yield type(value).__name__, name, [*path, name]
            else:
                yield from _secret_paths(child, [*path, name])
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _secret_paths(item, [*path, i])
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _secret_paths(item, [*path, key])


def test_config_errors_repeat_no_secret(setup: Setup) -> None:
    """Every secret of the wrong type; every secret with a ``$`` that does not resolve (a
    password with a bare ``$`` in it, an unclosed ``${``): the errors of ``walflow check``
    (both modes) and of the pipeline name each key, and hold no canary."""
    canaries: list[str] = []
    data, given = _config(setup, "fields")
    canaries += given
    typed = _wrong_types(data, canaries)
    dollars = yaml.safe_load(yaml.safe_dump(data))
    paths = [path for _, _, path in _secret_paths(Config.model_validate(data), [])]
    for i, path in enumerate(paths):
        where: Any = dollars
        for part in path[:-1]:
            where = where[part]
        before, after = canary("before"), canary("after")
        canaries += [before, after]
        forms = (f"{before}${after}", f"{before}${{{after}", f"{before}${{1{after}}}", f"${after}")
        bad = forms[i % len(forms)]
        where[path[-1]] = [bad] if isinstance(where[path[-1]], list) else bad
    outputs: dict[str, str | bytes] = {}
    for name, broken in (("wrong-types", typed), ("dollars", dollars)):
        config = _write(setup, name, broken)
        done = run_to_exit(config)
        assert done.returncode == 2, done.stderr
        outputs[f"{name}: the pipeline (stderr)"], outputs[f"{name}: the pipeline (stdout)"] = done.stderr, done.stdout
        for command in (["check"], ["check", "--json"]):
            checked = walflow(*command, config, timeout=90)
            assert checked.returncode == 1, checked.stdout
            outputs[f"{name}: walflow {' '.join(command)}"] = checked.stdout + checked.stderr
        try:
            parse_config(config.read_text(), env={})
        except Exception as exc:  # noqa: BLE001 - the error's text is what is searched
            outputs[f"{name}: parse_config"] = str(exc)
    for path in paths:  # each key is named, so the errors still say what to fix
        for name in ("wrong-types", "dollars"):
            assert format_path(path) in outputs[f"{name}: walflow check"], (path, outputs[f"{name}: walflow check"])
    assert_no_canary(canaries, outputs)


def canary_pg_dsn(setup: Setup) -> str:
    role, password = PG_ROLES["fields"]
    return f"host=127.0.0.1 port={setup.pg_port} dbname={DATABASE} user={role} password={password}"


def _plain(server: NatsServer) -> str:
    """The NATS URL with the test's credentials, for reading the stream."""
    return f"nats://{NATS_USER}:{NATS_PASSWORD}@127.0.0.1:{server.port}"
