"""A sink's NATS credentials and TLS keys: keys that go together, none that nats-py would drop, TLS implied."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import ConfigError, parse_config
from config.schema import NatsDestination


def _destination(tmp_path: Path, extra: str) -> str:
    for name in ("ca.pem", "client.pem", "client.key", "user.creds", "user.nk"):
        (tmp_path / name).write_text("placeholder\n")
    return f"""
databases:
  - {{ name: app, hostname: 127.0.0.1, database: app, slot: {{ name: s1 }}, publication: {{ name: p1 }} }}
sinks:
  - name: out
    database: app
    destination: {{ type: nats, host: nats.internal, {extra.replace("DIR", str(tmp_path))} }}
"""


def _dest(tmp_path: Path, extra: str) -> NatsDestination:
    return parse_config(_destination(tmp_path, extra), source="test.yaml", env={}).sinks[0].destination


def _errors(tmp_path: Path, extra: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(_destination(tmp_path, extra), source="test.yaml", env={})
    return info.value.problems


@pytest.mark.parametrize(("extra", "tls"), [
    ("tls: false", False),
    ("tls: true", True),
    ("tls_ca_file: DIR/ca.pem", True),
    ("tls_cert_file: DIR/client.pem, tls_key_file: DIR/client.key", True),
    ("tls_handshake_first: true", True),
])
def test_any_tls_key_means_tls(tmp_path: Path, extra: str, tls: bool) -> None:
    dest = _dest(tmp_path, extra)
    assert dest.uses_tls is tls
    assert dest.server_urls == [f"{'tls' if tls else 'nats'}://nats.internal:4222"]


def test_a_tls_server_url_means_tls(tmp_path: Path) -> None:
    text = _destination(tmp_path, "").replace("host: nats.internal,", "servers: ['nats://a:4222', 'tls://b:4222']")
    assert parse_config(text, source="test.yaml", env={}).sinks[0].destination.uses_tls


def test_the_defaults_keep_nats_pys_inbox_and_no_credentials(tmp_path: Path) -> None:
    dest = _dest(tmp_path, "")
    assert (dest.inbox_prefix, dest.logs_in, dest.tls_handshake_first) == ("_INBOX", False, False)


@pytest.mark.parametrize("extra", [
    "username: u, password: p", "token: t", "creds_file: DIR/user.creds", "jwt: j, nkey_seed: SU",
    "jwt: j, nkey_seed_file: DIR/user.nk", "nkey_seed: SU", "nkey_seed_file: DIR/user.nk",
])
def test_each_way_to_log_in_alone_is_accepted(tmp_path: Path, extra: str) -> None:
    assert _dest(tmp_path, extra).logs_in


def test_the_token_is_a_secret(tmp_path: Path) -> None:
    dest = _dest(tmp_path, "token: s3cret-token")
    assert dest.token is not None and dest.token.get_secret_value() == "s3cret-token"
    assert "s3cret-token" not in repr(dest) and "s3cret-token" not in str(dest.model_dump())


def test_a_token_with_a_user_is_refused_as_one_of_them_would_not_be_sent(tmp_path: Path) -> None:
    assert _errors(tmp_path, "username: u, password: p, token: t") == [
        "sinks[0].destination: username/password and token are two ways to log in, and walflow would send only the "
        "password: keep the one the server's authorization expects"
    ]


@pytest.mark.parametrize("extra", [
    "username: u, password: p, jwt: j, nkey_seed: SU",  # Sequin's reference config: the server's nonce decides
    "token: t, jwt: j, nkey_seed: SU",  # an auth callout's token, with the user's signature
    "token: t, nkey_seed_file: DIR/user.nk",
    "token: t, creds_file: DIR/user.creds",
])
def test_credentials_nats_py_sends_together_are_accepted(tmp_path: Path, extra: str) -> None:
    assert _dest(tmp_path, extra).logs_in


@pytest.mark.parametrize(("extra", "message"), [
    ("tls_cert_file: DIR/client.pem", "tls_cert_file and tls_key_file go together (a client certificate and its key): "
                                      "set both or neither"),
    ("tls_key_file: DIR/client.key", "tls_cert_file and tls_key_file go together (a client certificate and its key): "
                                     "set both or neither"),
    ("jwt: j", "jwt needs its user's seed to sign the server's challenge: set nkey_seed (or nkey_seed_file), or give "
               "both in creds_file"),
    ("nkey_seed: SU, nkey_seed_file: DIR/user.nk", "nkey_seed and nkey_seed_file are the same seed given twice: keep "
                                                   "one of them"),
    ("creds_file: DIR/user.creds, jwt: j, nkey_seed: SU", "creds_file already holds the JWT and nkey seed: drop "
                                                          "jwt/nkey_seed/nkey_seed_file, or drop creds_file"),
    ("creds_file: DIR/user.creds, nkey_seed_file: DIR/user.nk", "creds_file already holds the JWT and nkey seed: "
                                                                "drop jwt/nkey_seed/nkey_seed_file, or drop creds_file"),
])
def test_keys_that_go_together_are_refused_alone(tmp_path: Path, extra: str, message: str) -> None:
    assert _errors(tmp_path, extra) == [f"sinks[0].destination: {message}"]


@pytest.mark.parametrize("prefix", ["_INBOX.>", "in box", "", "a..b"])
def test_an_inbox_prefix_must_be_a_plain_subject(tmp_path: Path, prefix: str) -> None:
    [problem] = _errors(tmp_path, f"inbox_prefix: '{prefix}'")
    assert problem.startswith("sinks[0].destination.inbox_prefix: ") and "not a valid subject prefix" in problem
