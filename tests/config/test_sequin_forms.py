"""Every form of Sequin's YAML is accepted: used (mapped onto walflow's equivalent), ignored with
exactly one warning that says what walflow does instead, or refused with an error that names
the key and the fix. The example files are Sequin's own (its docs, its tests, what its
``to_external`` functions write for ``sequin config export``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from config import Config, ConfigError, load_config, parse_config
from tests.config.test_schema import MINIMAL

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"


IGNORED_EXPORT_KEYS = {
    "pool_size": "walflow opens its own two connections (replication and heartbeats)",
    "ipv6": "libpq tries every address the hostname resolves to, IPv6 and IPv4",
    "batch_size": "walflow batches by itself (many messages in flight, acknowledged per epoch)",
    "max_retry_count": "walflow never discards a change: it retries until JetStream accepts it",
    "load_shedding_policy": "walflow never sheds load: a slow sink slows the reader down",
    "active_backfills": "a backfill running in Sequin does not carry over; request one with walflow backfill",
    "health": "Sequin's health report at export; walflow reports its own at /healthz and /readyz",
}
PAUSED = (
    "sinks[1].status: paused is run as disabled: walflow cannot hold a paused sink's changes without holding the "
    "slot's WAL; to resume without a gap, set status: active and request a backfill "
    "(walflow backfill --sink NAME --table SCHEMA.TABLE)"
)


def warnings_of(caplog: pytest.LogCaptureFixture, text: str, **env: str) -> tuple[Config, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="walflow.config"):
        config = parse_config(text, source="test.yaml", env=env)
    return config, [r.getMessage() for r in caplog.records if r.name == "walflow.config"]


def errors_of(text: str, **env: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="test.yaml", env=env)
    return info.value.problems


WHERE = "    hostname: 127.0.0.1\n    database: app\n"


def database(extra: str, *, where: str = WHERE) -> str:
    """MINIMAL with ``extra`` lines in its database entry, after ``where`` (its hostname and database)."""
    return MINIMAL.replace(WHERE, where + extra, 1)


def sink(extra: str) -> str:
    """MINIMAL with ``extra`` lines in its sink entry."""
    return MINIMAL.replace("    database: app\n    destination", f"    database: app\n{extra}    destination", 1)


# -- the example files ---------------------------------------------------------------------------


def test_the_export_loads_with_one_warning_per_key_walflow_does_not_use(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="walflow.config"):
        config = load_config(EXAMPLES / "sequin-export.yaml", env={})
    expected = [f"databases[0].{key} is ignored: {IGNORED_EXPORT_KEYS[key]}" for key in ("pool_size", "ipv6")]
    expected += [f"sinks[0].{key} is ignored: {IGNORED_EXPORT_KEYS[key]}"
                 for key in ("batch_size", "max_retry_count", "load_shedding_policy", "active_backfills", "health")]
    expected += [f"sinks[1].{key} is ignored: {IGNORED_EXPORT_KEYS[key]}"
                 for key in ("batch_size", "max_retry_count", "load_shedding_policy", "active_backfills")]
    assert [r.getMessage() for r in caplog.records] == [*expected, PAUSED]

    db = config.databases[0]
    assert (db.name, db.hostname, db.port, db.database, db.username, db.ssl) == (
        "production-db", "127.0.0.1", 5432, "app_production", "sequin", True)
    assert db.password is not None and db.password.get_secret_value() == "source-db-password"
    assert (db.slot.name, db.publication.name) == ("sequin_slot", "sequin_pub")
    orders, audit = config.sinks
    assert orders.enabled and orders.annotations == {"team": "payments"}
    assert [(t.name, t.group_column_names) for t in orders.tables] == [
        ("public.orders", ["account_id"]), ("public.customers", None)]
    assert orders.source.include_schemas == ["public"] and orders.source.exclude_tables == ["public.json_web_tokens"]
    assert orders.source.include_tables is None and orders.source.exclude_schemas is None
    assert orders.destination.server_urls == ["nats://127.0.0.1:4222"]
    assert audit.status == "disabled" and not audit.enabled
    assert audit.tables == [] and not audit.message_grouping and audit.timestamp_format == "unix_microsecond"
    assert audit.destination.server_urls == ["tls://127.0.0.1:4222"]
    assert audit.destination.jwt is not None and audit.destination.nkey_seed is not None


@pytest.mark.parametrize(
    ("name", "env", "expected"),
    [
        ("sequin-docs-reference.yaml", {}, [
            "account is ignored: walflow has no accounts",
            "users is ignored: walflow has no users",
            "api_tokens is ignored: walflow has no API",
            f"databases[0].pool_size is ignored: {IGNORED_EXPORT_KEYS['pool_size']}",
            f"sinks[0].batch_size is ignored: {IGNORED_EXPORT_KEYS['batch_size']}",
        ]),
        ("sequin-docs-example.yaml", {}, [
            "account is ignored: walflow has no accounts",
            "users is ignored: walflow has no users",
            "http_endpoints is ignored: walflow only has NATS sinks",
            "change_retentions is ignored: walflow does not write change tables",
            "databases[0].publication.schemas is ignored: Sequin does not read it either: a publication walflow "
            "creates is FOR ALL TABLES, as Sequin's; to publish some schemas only, write init_sql: CREATE "
            "PUBLICATION ... FOR TABLES IN SCHEMA ...",
        ]),
        ("sequin-docs-anchors.yaml", {"NATS_JWT": "jwt", "NATS_NKEY_SEED": "seed"}, [
            "base_sink_config is ignored: not a walflow or Sequin key (Sequin ignores unknown top-level keys too, "
            "e.g. the base of a YAML anchor)",
        ]),
        ("sequin-plan-fixture.yaml", {}, [
            "http_endpoints is ignored: walflow only has NATS sinks",
            "change_retentions is ignored: walflow does not write change tables",
            f"databases[0].pool_size is ignored: {IGNORED_EXPORT_KEYS['pool_size']}",
            f"databases[0].ipv6 is ignored: {IGNORED_EXPORT_KEYS['ipv6']}",
            f"sinks[0].batch_size is ignored: {IGNORED_EXPORT_KEYS['batch_size']}",
            f"sinks[0].max_retry_count is ignored: {IGNORED_EXPORT_KEYS['max_retry_count']}",
            f"sinks[0].load_shedding_policy is ignored: {IGNORED_EXPORT_KEYS['load_shedding_policy']}",
            f"sinks[0].active_backfill is ignored: {IGNORED_EXPORT_KEYS['active_backfills']}",
        ]),
    ],
)
def test_sequin_example_files_load(caplog: pytest.LogCaptureFixture, name: str, env: dict[str, str],
                                   expected: list[str]) -> None:
    with caplog.at_level(logging.WARNING, logger="walflow.config"):
        config = load_config(EXAMPLES / name, env=env)
    assert [r.getMessage() for r in caplog.records] == expected
    assert config.sinks and all(s.destination.type == "nats" for s in config.sinks)


def test_the_docs_files_mean_what_sequin_makes_of_them() -> None:
    reference = load_config(EXAMPLES / "sequin-docs-reference.yaml", env={})
    db, sink_ = reference.databases[0], reference.sinks[0]
    assert db.publication.init_sql is not None and db.publication.init_sql.startswith("create publication sequin_pub")
    assert (db.await_database.timeout_ms, db.await_database.interval_ms) == (30_000, 3_000)
    assert [(t.name, t.group_column_names) for t in sink_.tables] == [("public.users", ["account_id"])]
    assert sink_.destination.username == "nats_user" and sink_.destination.jwt is not None

    example = load_config(EXAMPLES / "sequin-docs-example.yaml", env={"DB_HOST": "db.internal", "DB_PASSWORD": "p: #1"})
    db = example.databases[0]
    assert (db.hostname, db.database) == ("db.internal", "app_production")
    assert db.password is not None and db.password.get_secret_value() == "p: #1"  # YAML syntax in a value is text
    assert example.sinks[0].source.include_schemas == ["public"]  # schema: public

    anchors = load_config(EXAMPLES / "sequin-docs-anchors.yaml", env={"NATS_JWT": "jwt", "NATS_NKEY_SEED": "seed"})
    assert [(s.name, s.database, s.source.include_schemas) for s in anchors.sinks] == [
        ("audit-logging", "production-db", ["public"]), ("microservice-events", "production-db", ["public"])]
    jwt = anchors.sinks[1].destination.jwt
    assert jwt is not None and jwt.get_secret_value() == "jwt"
    assert errors_of((EXAMPLES / "sequin-docs-anchors.yaml").read_text()) == [
        "sinks[1].destination.jwt: ${NATS_JWT} is not set: export NATS_JWT, or give a default with ${NATS_JWT:-value}",
        "sinks[1].destination.nkey_seed: ${NATS_NKEY_SEED} is not set: export NATS_NKEY_SEED, or give a default "
        "with ${NATS_NKEY_SEED:-value}",
    ]


# -- databases -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://walflow:s3cret@db.internal:6432/app",
         ("db.internal", 6432, "app", "walflow", "s3cret", "prefer")),
        # as Sequin's URI.parse: nothing percent-decoded, the host's case kept
        ("postgresql://walflow:p%40ss%3Aw@DB.Internal/my%20db?sslmode=require",
         ("DB.Internal", 5432, "my%20db", "walflow", "p%40ss%3Aw", "require")),
        ("postgres://walflow:pa:ss@db.internal/app", ("db.internal", 5432, "app", "walflow", "pa:ss", "prefer")),
        ("postgres://walflow@[::1]:5433/app?sslmode=disable", ("::1", 5433, "app", "walflow", None, "disable")),
        ("postgres://db.internal/app", ("db.internal", 5432, "app", "postgres", None, "prefer")),
    ],
    ids=["full", "not-decoded-and-ssl", "colon-in-password", "ipv6-literal-no-password", "host-and-database-only"],
)
def test_a_database_url_is_mapped_onto_its_keys(url: str, expected: tuple[object, ...]) -> None:
    config = parse_config(database(f"    url: {url}\n", where=""), env={})
    db = config.databases[0]
    password = db.password.get_secret_value() if db.password is not None else None
    assert (db.hostname, db.port, db.database, db.username, password, db.libpq_sslmode) == expected
    assert "s3cret" not in repr(db)


@pytest.mark.parametrize(
    ("url", "extra", "message"),
    [
        ("postgres://u:pw@h:5432/app", "    hostname: other\n",
         "give either url or hostname, not both (as in Sequin)"),
        ("postgres://u:pw@h:5432/app?sslmode=require", "    ssl: true\n",
         "give either ssl or the URL's sslmode, not both"),
        ("postgres://u:pw@h:5432/app?sslmode=verify-all", "",
         "the URL's sslmode=verify-all is not one of libpq's: disable, allow, prefer, require, verify-ca, verify-full"),
        ("postgres://u:pw@h:5432/app?sslmode=require&sslmode=disable", "", "the URL gives sslmode twice"),
        ("postgres://u:pw@h:5432/app?sslmode=require", "    sslmode: verify-full\n",
         "give either sslmode or the URL's sslmode, not both"),
        ("postgres://u:pw@h:5432/app?application_name=x", "",
         "the URL's parameter application_name is not supported; only sslmode, sslrootcert, sslcert, sslkey, "
         "sslpassword are (as the database keys of those names)"),
        ("mysql://u:pw@h:5432/app", "",
         "expected a postgres:// or postgresql:// URL, like postgres://user:password@host:5432/database"),
        ("postgres://u:pw@h:5432", "",
         "the URL needs a host and a database name, like postgres://user:password@host:5432/database"),
        ("postgres://u:pw@h:99999/app", "",
         "the port is not a number from 1 to 65535 (a URL like postgres://user:password@host:5432/database)"),
        ("postgres://u:pw@a:5432,b:5432/app", "", "give one host: walflow reads the slot of one server"),
    ],
    ids=["with-hostname", "with-ssl", "unknown-sslmode", "sslmode-twice", "with-sslmode", "other-parameter", "scheme",
         "no-database", "port",
         "several-hosts"],
)
def test_a_url_that_cannot_be_mapped_is_an_error_without_the_password(url: str, extra: str, message: str) -> None:
    problems = errors_of(database(f"    url: '{url}'\n{extra}", where=""))
    assert problems == [f"databases[0].url: {message}"]
    assert "pw" not in problems[0].replace("password", "")


def test_use_local_tunnel_false_is_walflows_direct_connection(caplog: pytest.LogCaptureFixture) -> None:
    config, warnings = warnings_of(caplog, database("    use_local_tunnel: ${TUNNEL:-false}\n"))
    assert warnings == [] and config.databases[0].hostname == "127.0.0.1"


def test_a_tunnel_or_a_primary_is_refused_with_the_fix() -> None:
    text = database("    use_local_tunnel: true\n    primary: { hostname: primary.internal, database: app }\n")
    assert errors_of(text) == [
        "databases[0].use_local_tunnel: walflow connects to the database directly, not through Sequin Cloud's "
        "tunnel; point hostname and port at the tunnel's local end (or at the database), and remove use_local_tunnel",
        "databases[0].primary: walflow reads the slot on the server it connects to and writes its heartbeats and "
        "backfill watermarks there (pg_logical_emit_message), which a standby cannot take; point hostname at the "
        "primary and remove primary:",
    ]
    assert errors_of(database("    use_local_tunnel: maybe\n")) == [
        "databases[0].use_local_tunnel: Input should be a valid boolean"]
    parse_config(database("    primary:\n"), env={})  # empty: no primary, as Sequin reads it


def test_database_id_annotations_and_ipv6(caplog: pytest.LogCaptureFixture) -> None:
    config, warnings = warnings_of(caplog, database(
        "    id: 2f1c9a3e-0000-4000-8000-000000000001\n    annotations: { team: core }\n    ipv6: true\n"))
    db = config.databases[0]
    assert (db.id, db.annotations) == ("2f1c9a3e-0000-4000-8000-000000000001", {"team": "core"})
    assert warnings == [f"databases[0].ipv6 is ignored: {IGNORED_EXPORT_KEYS['ipv6']}"]


def test_publication_schemas_is_ignored_as_sequin_does(caplog: pytest.LogCaptureFixture) -> None:
    config, warnings = warnings_of(caplog, MINIMAL.replace(
        "publication: { name: p1 }", "publication: { name: p1, create_if_not_exists: true, schemas: [public] }"))
    assert config.databases[0].publication.init_sql is None  # created FOR ALL TABLES, as Sequin does
    assert len(warnings) == 1 and warnings[0].startswith("databases[0].publication.schemas is ignored: ")


# -- sinks -----------------------------------------------------------------------------------------


def test_a_paused_sink_runs_as_disabled_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    two = sink("    status: paused\n") + MINIMAL[MINIMAL.index("  - name: out"):].replace("name: out", "name: second")
    config, warnings = warnings_of(caplog, two)
    assert [s.status for s in config.sinks] == ["disabled", "active"]
    assert warnings == [PAUSED.replace("sinks[1]", "sinks[0]")]
    config, warnings = warnings_of(caplog, sink("    status: ${STATUS}\n"), STATUS="paused")
    assert config.sinks[0].status == "disabled" and len(warnings) == 1


@pytest.mark.parametrize(
    ("extra", "warning"),
    [
        ("    consumer_start: { position: beginning }\n",
         "sinks[0].consumer_start is ignored: Sequin ignores it too (it started its former record consumers); "
         "to publish the rows a table has, set initial_backfill"),
        ("    active_backfill:\n", f"sinks[0].active_backfill is ignored: {IGNORED_EXPORT_KEYS['active_backfills']}"),
        ("    active_backfills: [{ id: x, state: active, table: public.orders }]\n",
         f"sinks[0].active_backfills is ignored: {IGNORED_EXPORT_KEYS['active_backfills']}"),
        ("    inserted_at: 2025-06-01T00:00:00Z\n",
         "sinks[0].inserted_at is ignored: Sequin's bookkeeping (sequin config export writes it), not configuration"),
        ("    updated_at: 2025-06-01T00:00:00Z\n",
         "sinks[0].updated_at is ignored: Sequin's bookkeeping (sequin config export writes it), not configuration"),
        ("    health: { name: Consumer health, status: healthy, checks: [] }\n",
         f"sinks[0].health is ignored: {IGNORED_EXPORT_KEYS['health']}"),
    ],
    ids=["consumer_start", "active_backfill", "active_backfills", "inserted_at", "updated_at", "health"],
)
def test_sequin_only_sink_keys_warn_once(caplog: pytest.LogCaptureFixture, extra: str, warning: str) -> None:
    _, warnings = warnings_of(caplog, sink(extra))
    assert warnings == [warning]


def test_the_nats_connection_id_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    _, warnings = warnings_of(caplog, MINIMAL.replace("host: 127.0.0.1 }", "host: 127.0.0.1, connection_id: abc }"))
    assert warnings == ["sinks[0].destination.connection_id is ignored: Sequin's id of its NATS connection; "
                        "walflow names its connections itself"]


def test_sink_id_is_used_and_message_kind_ignored_as_sequin_does(caplog: pytest.LogCaptureFixture) -> None:
    """Sequin removed message_kind in v0.14 and ignores it: a file with ``record`` gets whole messages."""
    config, warnings = warnings_of(caplog, sink("    id: 7d0c0000-0000-4000-8000-000000000002\n    message_kind: record\n"))
    assert config.sinks[0].id == "7d0c0000-0000-4000-8000-000000000002"
    assert warnings == ["sinks[0].message_kind is ignored: Sequin ignores it since v0.14 and publishes the whole "
                        "message (record, changes, action, metadata); so does walflow"]


def test_the_legacy_schema_key_is_source_include_schemas() -> None:
    config = parse_config(sink("    schema: public\n    source: { exclude_tables: [public.jobs] }\n"), env={})
    source = config.sinks[0].source
    assert (source.include_schemas, source.exclude_tables) == (["public"], ["public.jobs"])
    assert errors_of(sink("    schema: public\n    source: { include_schemas: [app] }\n")) == [
        "sinks[0].schema: give either schema or source.include_schemas, not both"]


def test_tables_entries_without_group_columns_group_by_the_primary_key() -> None:
    config = parse_config(sink("    message_grouping: false\n    tables: [{ name: events }, "
                               "{ name: public.logs, group_column_names: [] }]\n"), env={})
    assert [(t.name, t.group_column_names) for t in config.sinks[0].tables] == [
        ("public.events", None), ("public.logs", None)]  # a bare table is public's, as in Sequin
    assert errors_of(sink("    message_grouping: false\n    tables: [{ name: public.a, group_column_names: [x] }]\n")) \
        == ["sinks[0]: group columns are set but message_grouping is false: remove one of them"]
    assert parse_config(sink("    tables:\n    source:\n    initial_backfill:\n"), env={}).sinks[0].tables == []


def test_bare_table_names_are_in_public_everywhere() -> None:
    config = parse_config(sink("    table: orders\n    source: { include_tables: [orders], exclude_tables: [jobs] }\n"
                               "    initial_backfill: [{ table: orders }]\n"), env={})
    s = config.sinks[0]
    assert isinstance(s.initial_backfill, list)
    assert (s.table, s.source.include_tables, s.source.exclude_tables, s.initial_backfill[0].table) == (
        "public.orders", ["public.orders"], ["public.jobs"], "public.orders")


def test_column_filters_at_sink_level_need_its_table() -> None:
    assert errors_of(sink("    filters: [{ column_name: status, operator: '=', comparison_value: x }]\n")) == [
        "sinks[0]: filters at sink level needs table: (or use tables: [{name, filters}])"]
    config = parse_config(sink("    table: orders\n    filters: [{ column_name: status, operator: IN, "
                               "comparison_value: [a, b] }]\n"), env={})
    assert config.sinks[0].filters[0].operator == "in"


# -- top level and unknown keys ------------------------------------------------------------------


def test_unknown_top_level_keys_warn_once_and_unknown_keys_below_stay_errors(caplog: pytest.LogCaptureFixture) -> None:
    _, warnings = warnings_of(caplog, MINIMAL + "base: &base { a: 1 }\nwalfow: { log_level: debug }\n")
    reason = "not a walflow or Sequin key (Sequin ignores unknown top-level keys too, e.g. the base of a YAML anchor)"
    assert warnings == [f"base is ignored: {reason}", f"walfow is ignored: {reason} (did you mean 'walflow'?)"]
    assert errors_of(sink("    colour: red\n"))[0].startswith("sinks[0].colour: unknown key; expected one of: ")


# -- interpolation ------------------------------------------------------------------------------


def test_references_resolve_in_values_only() -> None:
    text = MINIMAL.replace("hostname: 127.0.0.1", "hostname: $PGHOST  # or ${UNSET_IN_COMMENT}") + (
        "users:\n  - email: a@example.com\n    password: ${UNSET_ADMIN_PASSWORD}\n")  # a dropped key's
    config = parse_config(text, env={"PGHOST": "db.internal"})
    assert config.databases[0].hostname == "db.internal"


def test_resolved_values_are_read_by_type_and_an_empty_one_is_null() -> None:
    text = database("    port: ${PGPORT-5433}\n    ssl: ${SSL:-true}\n    password: ${PGPASSWORD:-}\n")
    db = parse_config(text, env={}).databases[0]
    assert (db.port, db.ssl, db.password) == (5433, True, None)
    db = parse_config(text, env={"PGPASSWORD": "123456", "PGPORT": "6432"}).databases[0]
    assert db.port == 6432 and db.password is not None and db.password.get_secret_value() == "123456"


def test_references_in_flow_mappings_and_their_errors_name_the_value() -> None:
    text = MINIMAL.replace("host: 127.0.0.1 }", "host: ${NATS_HOST}, port: ${NATS_PORT:-4222} }")
    assert parse_config(text, env={"NATS_HOST": "nats"}).sinks[0].destination.server_urls == ["nats://nats:4222"]
    assert errors_of(sink("    actions: [insert, $ACTION]\n")) == [
        "sinks[0].actions[1]: $ACTION is not set: export ACTION, give a default with ${ACTION:-value}, or write "
        "$$ACTION for a literal $ACTION"]


def test_keys_are_not_interpolated(caplog: pytest.LogCaptureFixture) -> None:
    assert errors_of(sink("    ${KEY}: 1\n"), KEY="batch_size")[0].startswith("sinks[0].${KEY}: unknown key")
    _, warnings = warnings_of(caplog, MINIMAL + "${KEY}: 1\n", KEY="x")
    assert warnings == ["${KEY} is ignored: not a walflow or Sequin key (Sequin ignores unknown top-level keys too, "
                        "e.g. the base of a YAML anchor)"]


def test_a_yaml_error_names_the_files_line_and_column() -> None:
    assert errors_of("databases: [${A:-x}, ${B:-y}\n") == [
        "line 2, column 1: not valid YAML: expected ',' or ']', but got '<stream end>'"]


@pytest.mark.parametrize("masked", ["*****", "p******d", "sec******e", "sou********************d"])
def test_a_secret_masked_by_an_export_warns(caplog: pytest.LogCaptureFixture, masked: str) -> None:
    _, warnings = warnings_of(caplog, MINIMAL.replace("database: app\n", f"database: app\n    password: '{masked}'\n", 1))
    assert warnings == ["databases[0].password looks masked, as `sequin config export` writes secrets without "
                        "--show-sensitive: export again with it, or write the secret"]


def test_a_real_secret_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    _, warnings = warnings_of(caplog, MINIMAL.replace("database: app\n", "database: app\n    password: 'pa**word'\n", 1))
    assert warnings == []


def test_a_table_listed_twice_is_refused() -> None:
    assert errors_of(sink("    tables: [{ name: orders, columns: { mask: { email: redact } } }, "
                          "{ name: public.orders, where: [{ column: id, gt: 1 }] }]\n")) == [
        "sinks[0]: tables[1]: public.orders is listed twice (as tables[0] too): give each table one entry, with all "
        "of its settings"]
