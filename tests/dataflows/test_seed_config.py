"""The seed config (a real Sequin user's file) runs unchanged through ``python -m bytewax.run dataflows.cdc``.

It asks for TLS to PostgreSQL (``ssl: true``), TLS and a user/password to NATS, and a
publication that must already exist, so it gets servers of its own, set up as that user's
would be: only the two ports in the file change.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from nats.aio.client import Client
from psycopg.conninfo import make_conninfo

from connectors.postgres.protocol import str_to_lsn
from embedded import NatsServer, PostgresServer, wait_for
from tests.pipeline import ROOT, Stored, assert_running, pipeline
from tests.tls import TlsFiles, issue

# it runs the pipeline (python -m bytewax.run) on a PostgreSQL and a NATS of its own (TLS, credentials)
pytestmark = [pytest.mark.slow, pytest.mark.servers]

SEED = ROOT / "config" / "examples" / "sequin-seed.yaml"
NATS_USER, NATS_PASSWORD = "nats", "nats-password"
#: The seed's database password (config/examples/sequin-seed.yaml): the role the test creates has it.
PG_PASSWORD = "source-db-password"
SLOT = "sequin_slot"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """The servers' certificate, for 127.0.0.1 and localhost."""
    return issue(tmp_path_factory.mktemp("tls"), "127.0.0.1", "localhost")


@pytest.fixture(scope="module")
def seed_pg(tls_files: TlsFiles) -> Iterator[PostgresServer]:
    """PostgreSQL with TLS, prepared as the seed expects: role, database, tables, publication."""
    with PostgresServer(tls=(tls_files.cert, tls_files.key)) as server:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE sequin LOGIN REPLICATION PASSWORD '{PG_PASSWORD}'")
            conn.execute("CREATE DATABASE abc OWNER sequin")
        with psycopg.connect(make_conninfo(server.dsn("abc"), user="sequin", password=PG_PASSWORD), autocommit=True) as conn:
            conn.execute("CREATE TABLE public.users (id int PRIMARY KEY, email text)")
            conn.execute("CREATE TABLE public.json_web_tokens (id int PRIMARY KEY, token text)")
        with psycopg.connect(server.dsn("abc"), autocommit=True) as conn:
            conn.execute("CREATE PUBLICATION abc_pub FOR ALL TABLES")  # FOR ALL TABLES needs a superuser
        yield server


@pytest.fixture(scope="module")
def seed_nats(tls_files: TlsFiles) -> Iterator[NatsServer]:
    auth = f"authorization {{\n  user: {NATS_USER}\n  password: {json.dumps(NATS_PASSWORD)}\n}}"
    with NatsServer(extra_config=auth, tls=(tls_files.cert, tls_files.key)) as server:
        yield server


def _seed_with_ports(target: Path, pg_port: int, nats_port: int) -> Path:
    """The seed file with only its two ``"port":`` values replaced, checked line by line."""
    original = SEED.read_text()
    text = re.sub(r'^(\s*"port": )5432$', rf"\g<1>{pg_port}", original, count=1, flags=re.MULTILINE)
    text = re.sub(r'^(\s*"port": )4222$', rf"\g<1>{nats_port}", text, count=1, flags=re.MULTILINE)
    before, after = original.splitlines(), text.splitlines()
    assert len(before) == len(after)
    changed = [(old, new) for old, new in zip(before, after, strict=True) if old != new]
    assert changed == [('  "port": 5432', f'  "port": {pg_port}'), ('    "port": 4222', f'    "port": {nats_port}')]
    target.write_text(text)
    return target


async def _connect(server: NatsServer, ca: Path, **auth: str) -> Client:
    """A TLS connection that trusts ``ca``, with ``user``/``password`` if given."""
    tls = ssl.create_default_context(cafile=str(ca))
    return await nats.connect(server.url, tls=tls, connect_timeout=5, allow_reconnect=False, **auth)


def _read_stream(server: NatsServer, ca: Path, stream: str) -> list[Stored]:
    """Everything in ``stream``, read as the seed's NATS user."""

    async def read() -> list[Stored]:
        nc = await _connect(server, ca, user=NATS_USER, password=NATS_PASSWORD)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            out: list[Stored] = []
            if not info.state.messages:
                return out  # nothing yet (its first_seq is then 0, which no message has)
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                headers = msg.headers or {}
                out.append(Stored(seq, msg.subject or "", headers.get("Nats-Msg-Id", ""), json.loads(msg.data or b"{}")))
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def _one(server: PostgresServer, query: str) -> Any:
    with psycopg.connect(server.dsn("abc"), autocommit=True) as conn:
        row = conn.execute(query, [SLOT]).fetchone()
    return row[0] if row else None


def _slot_active(server: PostgresServer) -> bool:
    return bool(_one(server, "SELECT active FROM pg_replication_slots WHERE slot_name = %s"))


def _confirmed(server: PostgresServer) -> int:
    lsn = _one(server, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s")
    return str_to_lsn(lsn) if lsn else 0


def test_seed_config_runs_unchanged(
    seed_pg: PostgresServer, seed_nats: NatsServer, tls_files: TlsFiles, tmp_path: Path
) -> None:
    config = _seed_with_ports(tmp_path / "sequin-seed.yaml", seed_pg.port, seed_nats.port)
    with pipeline(config, "-s", "1", env={"SSL_CERT_FILE": str(tls_files.ca)}) as proc:
        wait_for(lambda: _slot_active(seed_pg), timeout=60, what="the pipeline to open its slot",
                 check=lambda: assert_running(proc))
        with psycopg.connect(make_conninfo(seed_pg.dsn("abc"), user="sequin", password=PG_PASSWORD), autocommit=True) as conn:
            conn.execute("INSERT INTO users VALUES (1, 'ada@example.com')")
            with conn.transaction():
                conn.execute("INSERT INTO json_web_tokens VALUES (1, 'secret-token')")
                conn.execute("INSERT INTO users VALUES (2, 'grace@example.com')")
            conn.execute("UPDATE users SET email = 'ada@lovelace.org' WHERE id = 1")
            conn.execute("UPDATE json_web_tokens SET token = 'rotated' WHERE id = 1")
            conn.execute("DELETE FROM users WHERE id = 2")
            written = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert written is not None
        end = str_to_lsn(str(written[0]))
        # the seed sets no confirm_delay_ms: the slot trails the acknowledgements by the default 150 s,
        # so it is the stream that shows the writes arrived (the four changes of users)
        wait_for(lambda: len(_read_stream(seed_nats, tls_files.ca, "WALFLOW")) >= 4, timeout=60,
                 what="the writes in the stream", check=lambda: assert_running(proc))
        assert _confirmed(seed_pg) < end  # held back by the confirm delay
        with psycopg.connect(seed_pg.dsn("abc"), autocommit=True) as conn:
            walsender_ssl = conn.execute(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_replication r USING (pid) WHERE r.application_name = %s",
                [f"walflow:{SLOT}"],
            ).fetchall()
        events = _read_stream(seed_nats, tls_files.ca, "WALFLOW")
        assert proc.running
    log = config.with_suffix(".log").read_text()

    assert walsender_ssl == [(True,)]
    # JetStream holds each row's changes in commit order; across rows the order is free
    by_commit = sorted(events, key=lambda e: (e.event["metadata"]["commit_lsn"], e.event["metadata"]["commit_idx"]))
    for row in (1, 2):
        lsns = [e.event["metadata"]["commit_lsn"] for e in events if e.event["record"]["id"] == row]
        assert lsns == sorted(lsns)
    assert [(e.subject, e.event["action"], e.event["record"], e.event["changes"]) for e in by_commit] == [
        # the seed sets no subject_prefix: Sequin's subjects
        ("sequin.abc-source.public.users.insert", "insert", {"id": 1, "email": "ada@example.com"}, None),
        ("sequin.abc-source.public.users.insert", "insert", {"id": 2, "email": "grace@example.com"}, None),
        ("sequin.abc-source.public.users.update", "update", {"id": 1, "email": "ada@lovelace.org"}, {}),
        ("sequin.abc-source.public.users.delete", "delete", {"id": 2, "email": None}, None),
    ]
    for e in events:
        meta = e.event["metadata"]
        assert (meta["database_name"], meta["table_schema"], meta["table_name"]) == ("abc-source", "public", "users")
        assert meta["consumer"]["name"] == "abc-to-nats" and e.msg_id == meta["idempotency_key"]
    assert "account is ignored" in log and "users is ignored" in log
    # the server really asks for the user: the pipeline's publishes went through with the seed's credentials
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        asyncio.run(_connect(seed_nats, tls_files.ca))
