"""``walflow check`` against real servers: a good setup, then one broken thing at a time, each failure
with its fix; and the NATS permissions of the JetStream API and of publishing, probed without storing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from cli.probe import WouldChange, close_nats, open_nats
from config.schema import NatsDestination
from connectors.nats.stream import OWN_DESCRIPTION
from core.subjects import action_patterns
from embedded import NatsServer, PostgresServer
from embedded._process import free_port
from tests.backfill.helpers import stored_count
from tests.cli.helpers import Outcome, add_stream, edit, run_both
from tests.harness import ROLE_PASSWORD, Database, Nats, TestNames
from tests.pipeline import write_config
from tests.workload import setup_events


def _check(config: Path) -> Outcome:
    return run_both("check", config)


def _failed(out: Outcome) -> list[str]:
    return out.levels("fail")


def test_a_good_setup_passes_and_the_publish_probe_stores_nothing(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    add_stream(nats_srv.url, names.stream, [f"{names.subject_prefix}.shop.>"])
    out = _check(config)
    assert out.code == 0 and out.data["verdict"] == "pass" and out.data["failed"] == 0, out.text
    assert out.text.startswith("walflow check: PASS — all ")
    for fragment in (f"{config} loads: 1 database, 1 sink", "wal_level is 'logical'",
                     "role 'postgres' may stream changes (superuser)",
                     f"publication {names.publication}: 1 table (delete, insert, truncate, update), 1 read by the "
                     "enabled sinks", "may SELECT every table the sinks read",
                     "every published table has a replica identity",
                     f"slot {names.slot} does not exist: walflow creates it at start",
                     f"NATS at {nats_srv.address} accepts the sink's connection (with its credentials)",
                     "JetStream answers $JS.API.INFO",
                     f"stream {names.stream} captures the sink's subjects",
                     f"may publish on {names.subject_prefix}.shop.public.events.insert (stream {names.stream} "
                     "captures it; probed with a publish JetStream refuses, so nothing was stored)"):
        out.finding("pass", fragment)
    assert stored_count(nats_srv.url, names.stream) == 0  # the publish probe (run twice) stored nothing


@pytest.fixture(scope="module")
def replica_server() -> Iterator[PostgresServer]:
    with PostgresServer(settings={"wal_level": "replica"}) as server:
        yield server


def test_wal_level_replica(replica_server: PostgresServer, nats_srv: Nats, names: TestNames, tmp_path: Path) -> None:
    database = Database(replica_server, names)
    database.create()
    try:
        out = _check(setup_events(database, names, nats_srv, tmp_path))
    finally:
        database.drop()
    assert out.code == 1 and out.data["verdict"] == "fail"
    assert _failed(out) == ["wal_level is 'replica': logical replication needs 'logical'"]
    assert out.finding("fail", "wal_level is 'replica'")["fix"] == ("ALTER SYSTEM SET wal_level = logical; then "
                                                                   "restart PostgreSQL")
    assert out.text.startswith(f"walflow check: FAIL — 1 of {len(out.findings) - len(out.levels('info'))} checks "
                               "failed")


def test_a_role_without_replication(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    role = f"plain_{names.slot}"
    config = setup_events(database, names, nats_srv, tmp_path)  # the publication made as the superuser
    with database.connect() as conn:
        conn.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{ROLE_PASSWORD}'")
    try:
        out = _check(edit(config, lambda data: data["databases"][0].update(username=role, password=ROLE_PASSWORD)))
    finally:
        with database.connect() as conn:
            conn.execute(f'DROP ROLE "{role}"')
    assert out.code == 1
    assert _failed(out) == [f"role '{role}' may not stream changes: it has neither REPLICATION nor SUPERUSER"]
    assert out.finding("fail", f"role '{role}'")["fix"] == f'ALTER ROLE "{role}" WITH REPLICATION; (as a superuser)'
    select = out.finding("warn", f"role '{role}' may not SELECT public.events: changes stream, but walflow backfill "
                                 "cannot read them")
    assert select["fix"] == f'GRANT SELECT ON "public"."events" TO "{role}";'


def test_a_missing_publication_that_walflow_may_not_create(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, database, nats_srv, names, [
        {"name": "s", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}])
    edit(config, lambda data: data["databases"][0]["publication"].update(create_if_not_exists=False))
    out = _check(config)
    assert out.code == 1
    assert _failed(out) == [f"publication {names.publication} does not exist in database '{names.database}'"]
    assert out.finding("fail", "does not exist in database")["fix"] == (
        f'CREATE PUBLICATION "{names.publication}" FOR ALL TABLES WITH (publish_via_partition_root = true); or set '
        "publication.create_if_not_exists: true for database 'shop'")


def test_a_stream_with_other_subjects(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    add_stream(nats_srv.url, names.stream, [f"{names.subject_prefix}.other.>"])
    out = _check(setup_events(database, names, nats_srv, tmp_path))
    assert out.code == 1
    (failed,) = _failed(out)
    assert failed.startswith(  # the pipeline's own words, which end with what to change
        f"JetStream stream '{names.stream}' captures ['{names.subject_prefix}.other.>'], not walflow's subjects "
        f"'{names.subject_prefix}.shop.>' for database 'shop': its events would be rejected. Add "), failed
    out.finding("pass", f"may publish on {names.subject_prefix}.shop.public.events.insert (no stream captures it yet")


def test_a_table_without_replica_identity(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)
    with database.connect() as conn:
        conn.execute("CREATE TABLE loose (id int, payload text)")
        conn.execute("CREATE TABLE nothing (id int PRIMARY KEY) ; ALTER TABLE nothing REPLICA IDENTITY NOTHING")
        conn.execute(f"ALTER PUBLICATION {names.publication} ADD TABLE loose, nothing")
    out = _check(config)
    assert out.code == 1
    identity = out.finding("fail", "tables without a replica identity: public.loose (no primary key), public.nothing "
                                   "(REPLICA IDENTITY NOTHING); PostgreSQL rejects their UPDATEs and DELETEs")
    assert identity["fix"] == ('give each a primary key, or ALTER TABLE "public"."loose" REPLICA IDENTITY FULL; '
                               "(and likewise the others)")


def test_nats_unreachable(database: Database, names: TestNames, nats_srv: Nats, tmp_path: Path) -> None:
    port = free_port()
    config = edit(setup_events(database, names, nats_srv, tmp_path),
                  lambda data: data["sinks"][0]["destination"].update(port=port))
    out = _check(config)
    assert out.code == 1
    (failed,) = _failed(out)
    assert failed.startswith(f"NATS unreachable at nats://127.0.0.1:{port}: ")
    assert out.finding("fail", "NATS unreachable")["fix"] == (
        "start NATS there, or correct the sink's destination (host and port or servers, tls, tls_ca_file)")


PASSWORD = "right-pw"
AUTH = "authorization {\n  users = [\n" + "\n".join(
    f"    {{user: {user}, password: {json.dumps(PASSWORD)}{permissions}}}" for user, permissions in (
        ("walflow", ""),
        ("nojs", ', permissions: {publish: {deny: ["$JS.API.>"]}}'),
        ("nopub", ', permissions: {publish: {deny: ["denied.>"]}}'),
    )) + "\n  ]\n}"


@pytest.fixture(scope="module")
def auth_nats() -> Iterator[NatsServer]:
    with NatsServer(extra_config=AUTH) as server:
        yield server


def test_nats_credentials_and_permissions(
    database: Database, names: TestNames, auth_nats: NatsServer, tmp_path: Path
) -> None:
    """A wrong password, a user without JetStream's API, a user who may not publish the sink's
    subjects: one failure each, all in one run, and the refused requests do not wait for a timeout."""

    def sink(name: str, user: str, password: str = PASSWORD, prefix: str | None = None) -> dict[str, Any]:
        return {"name": name, "destination": {"username": user, "password": password,
                                              "subject_prefix": prefix or names.subject_prefix,
                                              "stream": {"name": f"{names.stream}_{name}"}}}

    with database.connect() as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE events")
    config = write_config(tmp_path, database, auth_nats, names, [
        sink("fine", "walflow"), sink("wrongpw", "walflow", "wrong-pw"), sink("nojs", "nojs"),
        sink("nopub", "nopub", prefix="denied")])
    out = _check(config)
    assert out.code == 1
    failed = {f["about"]: f for f in out.findings if f["level"] == "fail"}
    assert set(failed) == {"sink wrongpw", "sink nojs", "sink nopub"}, out.text
    assert failed["sink wrongpw"]["text"] == (f"NATS at {auth_nats.address} refused the credentials "
                                              "(nats: 'Authorization Violation')")
    assert failed["sink wrongpw"]["fix"] == "check destination.username ('walflow') and password against the " \
                                            "server's users or accounts"
    assert "wrong-pw" not in out.text
    nojs = failed["sink nojs"]["text"]
    assert nojs.startswith(f"NATS at {auth_nats.address} refused a $JS.API.INFO request (permissions violation for "
                           'publish to "$js.api.info"): grant user \'nojs\' that subject: docs/nats-permissions.conf'), nojs
    assert failed["sink nopub"]["text"] == ('NATS refused a publish on denied.shop.public.events.insert (permissions '
                                            'violation for publish to "denied.shop.public.events.insert")')
    assert failed["sink nopub"]["fix"] == "grant user 'nopub' publish permission on denied.>"
    out.finding("pass", f"may publish on {names.subject_prefix}.shop.public.events.insert")


def test_the_probes_connection_sends_nothing_that_would_change_jetstream(nats_srv: Nats, names: TestNames) -> None:
    dest = NatsDestination.model_validate({"type": "nats", **nats_srv.destination})

    async def run() -> list[str]:
        nc = await open_nats(dest, "walflow:test")
        js = nc.jetstream()
        stopped = []
        try:
            for attempt in (nc.publish(f"{names.subject_prefix}.x", b"1"), js.publish(f"{names.subject_prefix}.x", b"1"),
                            js.add_stream(name=names.stream, subjects=[f"{names.subject_prefix}.>"]),
                            js.delete_stream(names.stream)):
                with pytest.raises(WouldChange) as info:
                    await attempt
                stopped.append(info.value.subject)
            await js.account_info()  # a lookup goes through
        finally:
            await close_nats(nc)
        return stopped

    assert asyncio.run(run()) == [f"{names.subject_prefix}.x", f"{names.subject_prefix}.x",
                                  f"$JS.API.STREAM.CREATE.{names.stream}", f"$JS.API.STREAM.DELETE.{names.stream}"]


@pytest.mark.parametrize(("jetstream", "delay_ms", "level", "says"), [
    ("sync_interval: always", 0, "pass", "the servers sync every write: confirm_delay_ms (0 s) covers it"),
    ("sync_interval: 30s", 20_000, "warn", "confirm_delay_ms (20 s) is shorter than http://127.0.0.1:{port}'s "
                                           "sync_interval (30 s)"),
    ("", 150_000, "pass", "the servers sync every 120 s at most: confirm_delay_ms (150 s) covers it"),
], ids=["always", "shorter-than-sync", "default"])
def test_check_reads_the_servers_sync_policy_and_the_streams_replicas(
    database: Database, names: TestNames, tmp_path: Path, jetstream: str, delay_ms: int, level: str, says: str
) -> None:
    with NatsServer(jetstream_config=jetstream) as server:
        monitoring = f"http://127.0.0.1:{server.http_port}/"
        config = edit(setup_events(database, names, server, tmp_path), lambda data: data["sinks"][0]["destination"]
                      .update(confirm_delay_ms=delay_ms, monitoring_urls=[monitoring]))
        add_stream(server.url, names.stream, [f"{names.subject_prefix}.shop.>"])
        out = _check(config)
    out.finding(level, says.format(port=server.http_port))
    warned = out.finding("warn", f"stream {names.stream} keeps 1 replica(s)")
    assert warned["fix"] == "on a 3-node cluster, set destination.stream.replicas: 3"


def test_check_without_monitoring_urls_assumes_the_default_sync_interval(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = setup_events(database, names, nats_srv, tmp_path)  # confirm_delay_ms: 0, as tests write it
    out = _check(config)
    assert out.code == 0  # warnings only
    out.finding("warn", "confirm_delay_ms (0 s) is shorter than JetStream's default sync_interval (120 s)")
    out.finding("warn", f"stream {names.stream} keeps 1 replica(s)")  # the one walflow would create


def test_an_atomic_sink_on_a_stream_walflow_did_not_create_fails_with_what_to_do(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    add_stream(nats_srv.url, names.stream, [f"{names.subject_prefix}.shop.>"])
    config = edit(setup_events(database, names, nats_srv, tmp_path),
                  lambda data: data["sinks"][0].update(transactions="atomic"))
    out = _check(config)
    assert out.code == 1
    (failed,) = _failed(out)
    assert failed.startswith(f"transactions: atomic needs JetStream stream '{names.stream}' to allow atomic batches, "
                             "and walflow did not create it"), failed


def test_an_atomic_sink_on_walflows_own_stream_is_told_what_start_will_set(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    async def own_stream() -> None:  # as an earlier walflow without transactions: atomic created it
        nc = await nats.connect(nats_srv.url)
        try:
            await nc.jetstream().add_stream(name=names.stream, subjects=[f"{names.subject_prefix}.shop.>"],
                                            description=OWN_DESCRIPTION)
        finally:
            await nc.close()

    asyncio.run(own_stream())
    config = edit(setup_events(database, names, nats_srv, tmp_path),
                  lambda data: data["sinks"][0].update(transactions="atomic"))
    out = _check(config)
    assert _failed(out) == []
    out.finding("pass", f"stream {names.stream} (created by walflow) does not allow atomic batches yet: walflow sets "
                "allow_atomic at start (transactions: atomic)")


def test_a_stream_that_would_not_store_the_markers_fails(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    prefix = names.subject_prefix
    add_stream(nats_srv.url, names.stream, [f"{prefix}.shop.*.*.*"])  # the change subjects only
    config = edit(setup_events(database, names, nats_srv, tmp_path),
                  lambda data: data["sinks"][0].update(transaction_markers=True, schema_events=True))
    out = _check(config)
    assert out.code == 1
    markers = out.finding("fail", f"stream {names.stream} does not capture {prefix}.shop._transaction.*")
    assert markers["fix"] == f"add {prefix}.shop._transaction.* to the stream's subjects, or set transaction_markers: false"
    assert len(_failed(out)) == 1  # the schema events' subjects have five tokens: *.*.* captures them


def test_a_stream_of_the_actions_only_would_not_store_schema_events(
    database: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    prefix = names.subject_prefix
    add_stream(nats_srv.url, names.stream, action_patterns(prefix, "shop"))  # one pattern per action
    config = edit(setup_events(database, names, nats_srv, tmp_path),
                  lambda data: data["sinks"][0].update(schema_events=True))
    out = _check(config)
    (failed,) = _failed(out)
    assert failed.startswith(f"stream {names.stream} does not capture {prefix}.shop.*.*.schema"), failed
