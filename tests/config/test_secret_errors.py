"""Config errors never repeat a secret: the secret keys are found by walking the models, and their
inputs (a wrong type, a ``$`` that does not resolve) are left out, while other keys' errors still
say what was given."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from config.loader import ConfigError, parse_config, secret_keys
from config.schema import Config
from config.section import Section

CANARY = "cAnArY7f3a"


def _problems(text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env=env or {})
    return str(caught.value)


def _config(**walflow: Any) -> str:
    return yaml.safe_dump({
        "databases": [{"name": "db", "hostname": "h", "database": "d", "slot": {"name": "s"},
                       "publication": {"name": "p"}}],
        "sinks": [{"name": "s", "database": "db", "destination": {"type": "nats", "host": "n"}}],
        "walflow": walflow,
    })


def test_the_secret_keys_are_every_secret_field_of_the_models() -> None:
    found = secret_keys(Config)
    assert {"password", "sslpassword", "jwt", "nkey_seed", "secret", "mask_secret"} <= found  # SecretStr fields
    assert {"servers", "monitoring_urls", "url"} <= found  # URLs that may carry credentials
    assert not {"name", "username", "hostname", "log_format"} & found


def test_a_secret_field_of_a_new_model_is_found_without_being_listed() -> None:
    class Vault(Section):
        token: SecretStr | None = None
        tokens: tuple[SecretStr, ...] = ()
        address: str = ""

    class Outer(Section):
        vaults: dict[str, Vault] | None = None

    assert secret_keys(Outer) == {"token", "tokens"}


@pytest.mark.parametrize("value", [[CANARY], {CANARY: 1}, 12345678])
def test_a_secret_of_the_wrong_type_is_named_not_shown(value: Any) -> None:
    text = _problems(_config(mask_secret=value, log_format="jsn"))
    assert "walflow.mask_secret: Input should be a valid string\n" in text + "\n"
    assert CANARY not in text and "12345678" not in text
    assert "walflow.log_format: Input should be 'text' or 'json' (got 'jsn')" in text  # other keys still say


def test_a_servers_url_is_never_repeated() -> None:
    text = _problems(_config().replace("host: n", f"servers: nats://u:{CANARY}@n:4222"))
    assert "sinks[0].destination.servers: Input should be a valid list" in text and CANARY not in text


@pytest.mark.parametrize("password", [f"pa${CANARY}", f"${CANARY}", f"x${{{CANARY}", f"x${{1{CANARY}}}",
                                      f"a${{{CANARY}}}b"])
def test_a_secret_whose_dollar_does_not_resolve_is_not_quoted(password: str) -> None:
    text = _problems(_config().replace("hostname: h", f"hostname: h\n  password: '{password}'"))
    assert "databases[0].password: holds a '$' that does not resolve (the value is a secret" in text, text
    assert CANARY not in text, text


def test_a_secret_that_is_one_reference_names_its_variable() -> None:
    text = _problems(_config().replace("hostname: h", "hostname: h\n  password: ${DB_PASSWORD}"))
    assert "databases[0].password: ${DB_PASSWORD} is not set: export DB_PASSWORD" in text


def test_a_non_secret_reference_is_quoted_as_before() -> None:
    text = _problems(_config().replace("hostname: h", "hostname: h$HOST_SUFFIX"))
    assert "databases[0].hostname: $HOST_SUFFIX is not set" in text
