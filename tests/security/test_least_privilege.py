"""walflow as the least-privilege PostgreSQL role (docs/least-privilege.sql, run as users run it, with
psql) and NATS user (docs/nats-permissions.conf, the server's own authorization block): the whole
pipeline, backfills included, delivers every change once and moves its slot; ``walflow check``
finds nothing missing and nothing more than needed, and names each privilege taken away or added."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cli.probe import SHARED_INBOX, close_nats, may_delete_streams, may_subscribe, open_nats
from config import load_config
from config.schema import NatsDestination
from connectors.nats.connection import connect_options
from connectors.nats.replay import ids_since
from embedded import NatsServer, wait_for
from tests.backfill.helpers import walflow
from tests.cli.helpers import Outcome, edit, run_both
from tests.harness import ROLE_PASSWORD, Database, TestNames, delete_stream, slot_confirmed
from tests.pipeline import ROOT, assert_running, pipeline, stored, write_config

pytestmark = pytest.mark.slow  # the pipeline (python -m bytewax.run) runs in most of them

RECIPE = ROOT / "docs" / "least-privilege.sql"
NATS_RECIPE = ROOT / "docs" / "nats-permissions.conf"
NATS_PASSWORD = "walflow-nats-test"
#: A user without permissions: all of them (the tests read the stream as it; check names its excess).
ADMIN = "admin"
#: config/walflow.yaml's names, which docs/nats-permissions.conf is written for.
PREFIX, STREAM, INBOX = "walflow", "WALFLOW", "_INBOX_walflow"


def nats_authorization() -> str:
    """docs/nats-permissions.conf with the test's password, and beside walflow's user an admin
    (every permission) and ``nobucket``: walflow's permissions but the lookup of its bucket."""
    text = NATS_RECIPE.read_text().replace("$WALFLOW_NATS_PASSWORD", json.dumps(NATS_PASSWORD))
    start, end = text.index("    {\n      user: walflow"), text.index("\n  ]\n")
    nobucket = text[start:end].replace("user: walflow", "user: nobucket").replace(
        '"$JS.API.STREAM.INFO.KV_walflow_state"\n', "")
    admin = f"    {{user: {ADMIN}, password: {json.dumps(NATS_PASSWORD)}}}\n"
    return text[:end] + "\n" + nobucket + "\n" + admin + text[end:]


@pytest.fixture(scope="module")
def minimal_nats() -> Iterator[NatsServer]:
    with NatsServer(extra_config=nats_authorization()) as server:
        yield server


def admin_url(server: NatsServer) -> str:
    return server.address.replace("nats://", f"nats://{ADMIN}:{NATS_PASSWORD}@")


@pytest.fixture
def own_stream(minimal_nats: NatsServer) -> Iterator[None]:
    """The recipe's stream, deleted after the test (the server is the module's)."""
    yield
    delete_stream(admin_url(minimal_nats), STREAM)


@dataclass(frozen=True)
class Roles:
    """The test's roles: the tables' owner (who owns the database) and walflow's (from the recipe)."""

    owner: str
    walflow: str


@contextmanager
def least_privilege(database: Database, names: TestNames, tables: dict[str, str], role: str | None = None,
                    rows: int = 0) -> Iterator[Roles]:
    """The test's database owned by another role, which creates ``tables`` (name: columns) with
    ``rows`` rows each; then the recipe, run by psql as the superuser, makes walflow's role
    (``role``, else one of the test's own) and the publication. Both roles dropped on leaving."""
    roles = Roles(f"owner_{names.slot}", role or f"walflow_{names.slot}")
    with database.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(roles.owner),
                                                                        sql.Literal(ROLE_PASSWORD)))
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(names.database),
                                                                    sql.Identifier(roles.owner)))
    try:
        with psycopg.connect(make_conninfo(database.dsn, user=roles.owner, password=ROLE_PASSWORD),
                             autocommit=True) as owner:
            for table, columns in tables.items():
                owner.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(*table.split(".")),
                                                                    sql.SQL(columns)))
                owner.execute(sql.SQL("INSERT INTO {} (id) SELECT generate_series(1, %s)").format(
                    sql.Identifier(*table.split("."))), [rows])
        listed = ", ".join(sql.Identifier(*t.split(".")).as_string() for t in tables)
        done = subprocess.run(
            ["psql", database.dsn, "-X", "-q", "-f", str(RECIPE), "-v", f"role={roles.walflow}",
             "-v", f"password={ROLE_PASSWORD}", "-v", f"owner={roles.owner}", "-v", f"publication={names.publication}",
             "-v", f"tables={listed}"],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        yield roles
    finally:
        with database.connect() as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(sql.Identifier(names.database)))
        database.drop()  # its slots and objects first: then nothing is left that the roles own
        with psycopg.connect(database.server.dsn(), autocommit=True) as conn:
            for name in (roles.walflow, roles.owner):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def minimal_config(tmp_path: Path, database: Database, nats: NatsServer, names: TestNames, roles: Roles,
                   **sink: Any) -> Path:
    """A config that logs in as walflow's role and as the NATS recipe's user, with its names."""
    destination = {"username": "walflow", "password": NATS_PASSWORD, "subject_prefix": PREFIX,
                   "stream": {"name": STREAM}, "inbox_prefix": INBOX}
    config = write_config(tmp_path, database, nats, names, [{"name": "shop-sink", **sink, "destination": destination}],
                          backfill={"initial_chunk_rows": 100})
    return edit(config, lambda data: data["databases"][0].update(username=roles.walflow, password=ROLE_PASSWORD))


def test_the_whole_pipeline_runs_as_the_least_privilege_role_and_user(
    database: Database, names: TestNames, minimal_nats: NatsServer, own_stream: None, tmp_path: Path
) -> None:
    """Initial backfill, changes, a requested backfill: each row read once and each change
    delivered once, the slot past all of it, and no privilege missed on the way (the log)."""
    tables = {"public.items": "id int PRIMARY KEY, name text", "public.later": "id int PRIMARY KEY"}
    with least_privilege(database, names, tables, rows=300) as roles:
        config = minimal_config(tmp_path, database, minimal_nats, names, roles,
                                initial_backfill=[{"table": "public.items"}])
        url = admin_url(minimal_nats)
        with pipeline(config, "-s", "1") as proc:
            wait_for(lambda: len(stored(url, STREAM)) >= 300, timeout=90, what="the initial backfill's reads",
                     check=lambda: assert_running(proc))
            with database.connect() as conn:
                conn.execute("INSERT INTO items (id, name) SELECT g, 'new' FROM generate_series(301, 350) g")
                conn.execute("UPDATE items SET name = 'changed' WHERE id <= 20")
                conn.execute("DELETE FROM items WHERE id BETWEEN 21 AND 30")
            requested = walflow("backfill", config, "--sink", "shop-sink", "--table", "public.later")
            assert requested.returncode == 0, requested.stderr
            wait_for(lambda: len(stored(url, STREAM)) >= 300 + 50 + 20 + 10 + 300, timeout=90,
                     what="the changes and the requested backfill", check=lambda: assert_running(proc))
            end = database.current_lsn()
            wait_for(lambda: slot_confirmed(database) >= end, timeout=60, what="the slot to pass everything",
                     check=lambda: assert_running(proc))
            log = proc.log_tail(10_000)
        with database.connect() as conn:  # while it is stopped; a restart reads its stream and bucket first
            conn.execute("INSERT INTO items (id, name) VALUES (351, 'after the restart')")
        with pipeline(config, "-s", "1", log_suffix="-again") as proc:
            wait_for(lambda: len(stored(url, STREAM)) >= 681, timeout=90, what="the change made while stopped",
                     check=lambda: assert_running(proc))
            end = database.current_lsn()
            wait_for(lambda: slot_confirmed(database) >= end, timeout=60, what="the slot to pass the change",
                     check=lambda: assert_running(proc))
            log += proc.log_tail(10_000)
        events = stored(url, STREAM)
        seen = Counter((e.subject.split(".")[3], e.event["action"], e.event["record"]["id"]) for e in events)
        expected = Counter({("items", "read", i): 1 for i in range(1, 301)}
                           | {("items", "insert", i): 1 for i in range(301, 352)}
                           | {("items", "update", i): 1 for i in range(1, 21)}
                           | {("items", "delete", i): 1 for i in range(21, 31)}
                           | {("later", "read", i): 1 for i in range(1, 301)})
        assert seen == expected
        assert len({e.msg_id for e in events}) == len(events)
        for refused in ("may not write logical messages", "Permissions Violation", "permission denied"):
            assert refused not in log, log
        # a replay's read of the stream's tail (an ordered consumer) as walflow's user: every id
        assert asyncio.run(_ids_as_walflow(config)) == {e.msg_id for e in events}


async def _ids_as_walflow(config: Path) -> set[str]:
    dest = load_config(str(config)).sinks[0].destination
    nc = await nats.connect(**connect_options(dest, "walflow:test"))
    try:
        return await ids_since(nc, STREAM, f"{PREFIX}.>", 1)
    finally:
        await nc.close()


def _check(config: Path) -> Outcome:
    return run_both("check", config)


#: What check says of a one-server NATS with tests' confirm_delay_ms: 0 (cli/durability.py), not of privileges.
DURABILITY = (f"stream {STREAM} keeps ", "confirm_delay_ms ")


def _findings(out: Outcome, level: str) -> dict[str, str | None]:
    """The findings at ``level`` (their fixes), but those on durability."""
    return {f["text"]: f["fix"] for f in out.findings if f["level"] == level and not f["text"].startswith(DURABILITY)}


def _nats_user(config: Path, user: str, password: str = NATS_PASSWORD) -> Path:
    return edit(config, lambda data: data["sinks"][0]["destination"].update(username=user, password=password))


def test_check_finds_nothing_missing_and_nothing_more_than_needed(
    database: Database, names: TestNames, minimal_nats: NatsServer, tmp_path: Path
) -> None:
    with least_privilege(database, names, {"public.items": "id int PRIMARY KEY"}) as roles:
        out = _check(minimal_config(tmp_path, database, minimal_nats, names, roles, initial_backfill=True))
    assert out.code == 0 and _findings(out, "warn") == {} and _findings(out, "info") == {}, out.text
    out.finding("pass", f"role '{roles.walflow}' may stream changes (REPLICATION)")
    out.finding("pass", f"role '{roles.walflow}' may write logical messages (heartbeats, backfill signals)")
    out.finding("pass", f"role '{roles.walflow}' may SELECT every table the sinks read")
    out.finding("pass", "may look up walflow's key-value bucket (KV_walflow_state)")
    out.finding("pass", "user 'walflow' may not delete streams (not all of JetStream's API, $JS.API.>, is granted)")
    out.finding("pass", f"replies arrive under {INBOX}.>, and user 'walflow' may not read the account's other "
                        "replies (_INBOX.>)")


def test_check_names_a_superuser_and_a_user_with_all_of_jetstream_as_more_than_needed(
    database: Database, names: TestNames, minimal_nats: NatsServer, tmp_path: Path
) -> None:
    superuser = conninfo_to_dict(database.dsn)["user"]
    with database.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE items").format(sql.Identifier(names.publication)))
    config = write_config(tmp_path, database, minimal_nats, names, [{"name": "s", "destination": {
        "subject_prefix": PREFIX, "stream": {"name": STREAM}, "inbox_prefix": INBOX}}])
    out = _check(_nats_user(config, ADMIN))
    assert out.code == 0, out.text  # more than needed is a warning: the pipeline would run
    warned = _findings(out, "warn")
    expected = {
        f"role '{superuser}' is a superuser: more than walflow needs (it may read and change everything on the "
        "server)": "run walflow as a role made by docs/least-privilege.sql (LOGIN REPLICATION, SELECT on the "
                   "published tables, EXECUTE on pg_logical_emit_message)",
        "user 'admin' may delete streams (probed with one that cannot exist): more than walflow needs; with "
        "$JS.API.> it may delete or purge every stream of the account":
            "grant it only the subjects walflow uses (docs/nats-permissions.conf)",
        "user 'admin' may subscribe to _INBOX.>, where the account's other users get their replies: it can read "
        "them": f"grant it subscribe on {INBOX}.> only, its replies' prefix (docs/nats-permissions.conf)",
    }
    assert warned == expected, out.text
    note = out.finding("info", "every role of the database may write logical messages into walflow's slot")
    assert "REVOKE EXECUTE" in note["fix"]


def test_check_names_the_tables_owner_as_more_than_needed(
    database: Database, names: TestNames, minimal_nats: NatsServer, tmp_path: Path
) -> None:
    """Streaming as the role that owns the tables: it may alter and drop them; and, the recipe
    having revoked logical messages from PUBLIC, it may not write them (its backfill cannot start)."""
    with least_privilege(database, names, {"public.items": "id int PRIMARY KEY"}) as roles:
        with database.connect() as conn:
            conn.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(roles.owner)))
        config = edit(minimal_config(tmp_path, database, minimal_nats, names, roles, initial_backfill=True),
                      lambda data: data["databases"][0].update(username=roles.owner))
        out = _check(config)
    assert out.code == 1
    assert _findings(out, "warn") == {
        f"role '{roles.owner}' owns public.items: more than walflow needs (an owner may alter and drop them; walflow "
        "only reads them)": "run walflow as a role made by docs/least-privilege.sql (LOGIN REPLICATION, SELECT on "
                            "the published tables, EXECUTE on pg_logical_emit_message)"}, out.text
    assert _findings(out, "fail") == {
        f"role '{roles.owner}' may not write logical messages (pg_logical_emit_message): initial_backfill of "
        "shop-sink cannot start": f'GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean,text,text) TO '
                                  f'"{roles.owner}"; (as a superuser)'}, out.text


def test_check_names_each_missing_privilege_with_the_grant_quoted(
    database: Database, names: TestNames, minimal_nats: NatsServer, tmp_path: Path
) -> None:
    """A role and a table whose names hold a quote and a space: the statements check says to run
    are quoted by psycopg, and run as they are they grant what was missing."""
    role, table = f'wf "odd" role {names.slot}', 'public.my "odd" table'
    with least_privilege(database, names, {table: "id int PRIMARY KEY"}, role=role) as roles:
        with database.connect() as conn:
            conn.execute(sql.SQL("ALTER ROLE {} NOREPLICATION").format(sql.Identifier(role)))
            conn.execute(sql.SQL("REVOKE SELECT ON {} FROM {}").format(sql.Identifier(*table.split(".")),
                                                                      sql.Identifier(role)))
            conn.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM {}")
                         .format(sql.Identifier(role)))
        config = _nats_user(minimal_config(tmp_path, database, minimal_nats, names, roles, initial_backfill=True),
                            "nobucket")
        out = _check(config)
        assert out.code == 1
        failed = _findings(out, "fail")
        quoted_role, quoted_table = '"wf ""odd"" role ' + names.slot + '"', '"public"."my ""odd"" table"'
        assert failed == {
            f"role '{role}' may not stream changes: it has neither REPLICATION nor SUPERUSER":
                f"ALTER ROLE {quoted_role} WITH REPLICATION; (as a superuser)",
            f"role '{role}' may not SELECT {table}, which initial_backfill reads at the first start":
                f"GRANT SELECT ON {quoted_table} TO {quoted_role};",
            f"role '{role}' may not write logical messages (pg_logical_emit_message): initial_backfill of shop-sink "
            "cannot start":
                f"GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean,text,text) TO {quoted_role}; (as a superuser)",
            "NATS refused a lookup of walflow's key-value bucket (KV_walflow_state: permissions violation for publish "
            'to "$js.api.stream.info.kv_walflow_state")':
                "grant user 'nobucket' publish permission on $JS.API.STREAM.INFO.KV_walflow_state and the bucket's "
                "other subjects (docs/nats-permissions.conf)",
        }, out.text
        with database.connect() as conn:  # the fixes, pasted as they are
            for fix in list(failed.values())[:3]:
                assert fix is not None
                conn.execute(fix.removesuffix(" (as a superuser)").encode())
        out = _check(_nats_user(config, "walflow"))
        assert out.code == 0 and _findings(out, "warn") == {}, out.text


@pytest.mark.servers
def test_the_probes_tell_what_the_user_may_from_what_it_may_not(minimal_nats: NatsServer) -> None:
    """Subscribing to its replies' prefix, to nats-py's shared one, to its own subjects (which it
    only publishes on); deleting a stream: for walflow's user and for the admin."""
    async def probe(user: str) -> tuple[str, list[bool], bool]:
        dest = NatsDestination.model_validate({"type": "nats", "servers": [minimal_nats.url], "username": user,
                                               "password": NATS_PASSWORD,
                                               "inbox_prefix": INBOX})
        nc = await open_nats(dest, "walflow:test")
        try:
            subscribed = [await may_subscribe(nc, s) for s in (f"{INBOX}.probe", f"{SHARED_INBOX}.probe", f"{PREFIX}.x")]
            return nc.reply_prefix, subscribed, await may_delete_streams(nc)
        finally:
            await close_nats(nc)

    assert asyncio.run(probe("walflow")) == (INBOX, [True, False, False], False)
    assert asyncio.run(probe(ADMIN)) == (INBOX, [True, True, True], True)
