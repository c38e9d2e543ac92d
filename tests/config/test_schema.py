"""Config loading: Sequin's format, walflow's defaults, and errors that name the key path."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from config import Config, ConfigError, config_path, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "config" / "examples" / "sequin-seed.yaml"
DEFAULT = ROOT / "config" / "walflow.yaml"

MINIMAL = """
databases:
  - name: app
    hostname: 127.0.0.1
    database: app
    slot: { name: s1 }
    publication: { name: p1 }
sinks:
  - name: out
    database: app
    destination: { type: nats, host: 127.0.0.1 }
"""


def errors_of(text: str, **env: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="test.yaml", env=env)
    assert str(info.value).startswith("invalid walflow config test.yaml:")
    return info.value.problems


def test_seed_config_loads_and_warns_once_per_ignored_key(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="walflow.config"):
        config = load_config(SEED, env={})
    assert [r.getMessage() for r in caplog.records] == [
        "account is ignored: walflow has no accounts",
        "users is ignored: walflow has no users",
    ]
    db, sink = config.databases[0], config.sinks[0]
    assert (db.name, db.hostname, db.port, db.ssl) == ("abc-source", "127.0.0.1", 5432, True)
    assert (db.slot.name, db.slot.create_if_not_exists) == ("sequin_slot", True)
    assert (db.publication.name, db.publication.create_if_not_exists) == ("abc_pub", False)
    assert sink.database == "abc-source" and sink.enabled
    assert sink.source.include_schemas == ["public"]
    assert sink.source.exclude_tables == ["public.json_web_tokens"]
    assert sink.actions == ["insert", "update", "delete"]
    assert sink.destination.server_urls == ["tls://127.0.0.1:4222"]


def test_default_config_file_loads_with_defaults() -> None:
    config = load_config(DEFAULT, env={})
    dest = config.sinks[0].destination
    assert config.databases[0].port == 5432  # ${PGPORT:-5432} became an integer
    assert config.databases[0].username == "walflow"  # docs/least-privilege.sql's role, not a superuser
    assert dest.subject_prefix == "walflow"
    assert (dest.stream.name, dest.stream.create_if_not_exists) == ("WALFLOW", True)
    assert dest.stream.duplicate_window_ms == 120_000
    assert config.walflow.max_memory_mb == 128


def test_environment_overrides_defaults() -> None:
    config = load_config(DEFAULT, env={"PGPORT": "6543", "NATS_HOST": "nats.internal"})
    assert config.databases[0].port == 6543
    assert config.sinks[0].destination.server_urls == ["nats://nats.internal:4222"]


def test_walflow_config_variable_names_the_file() -> None:
    assert config_path({}) == "config/walflow.yaml"
    assert config_path({"WALFLOW_CONFIG": "/etc/walflow.yaml"}) == "/etc/walflow.yaml"


def test_minimal_config_fills_every_default() -> None:
    config = parse_config(MINIMAL, env={})
    db, sink = config.databases[0], config.sinks[0]
    assert (db.port, db.username, db.password, db.ssl) == (5432, "postgres", None, False)
    assert sink.status == "active" and sink.message_grouping and sink.timestamp_format == "iso8601"
    assert sink.destination.port == 4222 and sink.destination.tls is False
    assert config.walflow.log_level == "info"


def test_legacy_sequin_slot_and_table_keys() -> None:
    text = MINIMAL.replace("    slot: { name: s1 }\n    publication: { name: p1 }\n",
                           "    slot_name: s1\n    publication_name: p1\n")
    text = text.replace("    database: app\n    destination",
                        "    database: app\n    table: public.orders\n    group_column_names: [tenant, id]\n    destination")
    config = parse_config(text, env={})
    assert config.databases[0].slot.name == "s1" and config.databases[0].publication.name == "p1"
    assert config.sinks[0].table == "public.orders"
    assert config.sinks[0].group_column_names == ["tenant", "id"]


def test_ignored_sink_keys_warn_with_their_path(caplog: pytest.LogCaptureFixture) -> None:
    text = MINIMAL.replace("    database: app\n    destination", "    database: app\n    batch_size: 10\n    destination")
    with caplog.at_level(logging.WARNING, logger="walflow.config"):
        parse_config(text, env={})
    assert [r.getMessage() for r in caplog.records] == [
        "sinks[0].batch_size is ignored: walflow batches by itself (many messages in flight, acknowledged per epoch)"
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # unknown key, with a suggestion and the list of keys
        (("host: 127.0.0.1 }", "host: 127.0.0.1, prot: 1 }"),
         "sinks[0].destination.prot: unknown key (did you mean 'port'?); expected one of: ack_timeout_ms, confirm_delay_ms, "
         "creds_file, host, inbox_prefix, jwt, max_in_flight, monitoring_urls, msg_id, nkey_seed, nkey_seed_file, password, "
         "port, servers, stream, subject_prefix, tls, tls_ca_file, tls_cert_file, tls_handshake_first, tls_key_file, token, "
         "type, username"),
        (("hostname: 127.0.0.1", "hostname: 127.0.0.1\n    colour: red"),
         "databases[0].colour: unknown key; expected one of: annotations, await_database, database, hostname, id, name, password, "
         "port, publication, slot, ssl, sslcert, sslkey, sslmode, sslpassword, sslrootcert, username"),
        # wrong type
        (("host: 127.0.0.1 }", "host: 127.0.0.1, port: lots }"),
         "sinks[0].destination.port: Input should be a valid integer, unable to parse string as an integer "
         "(got 'lots')"),
        (("host: 127.0.0.1 }", "host: 127.0.0.1, port: 70000 }"),
         "sinks[0].destination.port: Input should be less than or equal to 65535 (got 70000)"),
        (("database: app\n    destination", "database: app\n    actions: [insert, upsert]\n    destination"),
         "sinks[0].actions[1]: Input should be 'insert', 'update' or 'delete' (got 'upsert')"),
        (("database: app\n    destination", "database: app\n    status: stopped\n    destination"),
         "sinks[0].status: Input should be 'active' or 'disabled' (got 'stopped')"),
        # missing required
        (("    hostname: 127.0.0.1\n", ""), "databases[0].hostname: required key is missing"),
        (("type: nats, ", ""), "sinks[0].destination.type: required key is missing"),
        (("type: nats, ", "type: kafka, "), "sinks[0].destination.type: Input should be 'nats' (got 'kafka')"),
        # semantic checks
        (("database: app\n    destination", "database: nope\n    destination"),
         "sinks[0].database: 'nope' is not a database in this file (databases: app)"),
        (("{ name: s1 }", "{ name: Slot-1 }"),
         "databases[0].slot.name: 'Slot-1' is not a valid slot name: use 1-63 lower-case letters, digits and "
         "underscores"),
        (("host: 127.0.0.1 }", "host: 127.0.0.1, subject_prefix: 'a.*' }"),
         "sinks[0].destination.subject_prefix: 'a.*' is not a valid subject prefix: dot-separated tokens of "
         "letters, digits, '-' and '_'"),
        (("host: 127.0.0.1 }", "host: 127.0.0.1, stream: { name: my.stream } }"),
         "sinks[0].destination.stream.name: 'my.stream' is not a valid stream name: no spaces, '.', '*', '>', "
         "'/' or '\\'"),
        (("host: 127.0.0.1 }", "host: 127.0.0.1, servers: [nats://a:4222] }"),
         "sinks[0].destination: set either host (with port) or servers, exactly one of them"),
        (("database: app\n    destination", "database: app\n    transform: my_fn\n    destination"),
         "sinks[0].transform: no function named 'my_fn' in functions: (none are defined)"),
        (("database: app\n    destination",
          "database: app\n    source: { exclude_tables: [public.] }\n    destination"),
         "sinks[0].source.exclude_tables[0]: 'public.' is not a table name: write schema.table (or table, for "
         "public.table)"),
        (("sinks:\n  - name: out", "walflow: { max_memory_mb: 1 }\nsinks:\n  - name: out"),
         "walflow.max_memory_mb: Input should be greater than or equal to 8 (got 1)"),
        # bad interpolation
        (("hostname: 127.0.0.1", "hostname: ${WF_UNSET_HOST}"),
         "databases[0].hostname: ${WF_UNSET_HOST} is not set: export WF_UNSET_HOST, or give a default with "
         "${WF_UNSET_HOST:-value}"),
        (("host: 127.0.0.1 }", "host: '${NATS.HOST}' }"),
         "sinks[0].destination.host: '${NATS.HOST}' is not a valid reference: write ${NAME}, ${NAME:-default} or "
         "$NAME (NAME: letters, digits and underscores, not starting with a digit); write $${ for a literal ${"),
        (("hostname: 127.0.0.1", "hostname: ${PGHOST"), "databases[0].hostname: '${PGHOST' has no closing '}'"),
    ],
)
def test_errors_name_the_key_path(change: tuple[str, str], expected: str) -> None:
    old, new = change
    assert old in MINIMAL
    assert errors_of(MINIMAL.replace(old, new, 1)) == [expected]


def test_every_error_is_reported_at_once() -> None:
    text = MINIMAL.replace("hostname: 127.0.0.1", "hostname: 127.0.0.1\n    port: x").replace("{ name: s1 }", "{}")
    assert errors_of(text) == [
        "databases[0].port: Input should be a valid integer, unable to parse string as an integer (got 'x')",
        "databases[0].slot.name: required key is missing",
    ]


def test_yaml_and_shape_errors() -> None:
    assert errors_of("databases: [") == [
        "line 1, column 13: not valid YAML: expected the node content, but found '<stream end>'"
    ]
    assert errors_of("- a\n- b\n") == ["(top level): expected a mapping with databases: and sinks:"]
    assert errors_of("databases: []\nsinks: []\n") == [
        "databases: List should have at least 1 item after validation, not 0 (got [])",
        "sinks: List should have at least 1 item after validation, not 0 (got [])",
    ]


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file: No such file or directory"):
        load_config(tmp_path / "missing.yaml")


def test_secrets_stay_out_of_repr_logs_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        config = load_config(SEED, env={})
        logging.getLogger("walflow.test").info("loaded %s", config)
    shown = repr(config) + str(config) + caplog.text + repr(config.model_dump())
    for secret in ("source-db-password", "nats-password", "admin-password"):
        assert secret not in shown
    assert config.databases[0].password is not None
    assert config.databases[0].password.get_secret_value() == "source-db-password"
    text = MINIMAL.replace("host: 127.0.0.1 }", "host: 127.0.0.1, username: u, password: [hunter2] }")
    assert errors_of(text) == ["sinks[0].destination.password: Input should be a valid string"]


def test_config_is_immutable() -> None:
    config = parse_config(MINIMAL, env={})
    with pytest.raises(Exception, match="frozen"):
        config.databases[0].port = 1
    assert isinstance(config, Config)


def test_a_matches_pattern_re2_cannot_read_is_refused_naming_its_key_and_the_fix() -> None:
    text = MINIMAL + "    tables:\n      - name: public.orders\n        where:\n          - {column: status, matches: '(a+)\\1'}\n"
    assert errors_of(text) == [
        "sinks[0].tables[0].where[0].matches: RE2 cannot read '(a+)\\\\1' (invalid escape sequence: \\1): walflow "
        "matches with RE2, which never backtracks, so write it without backreferences, look-arounds, possessive or "
        "atomic groups, (?x) or (?#...); \\z for \\Z; counts up to 1000"]
