"""The reference pgoutput decoder (the oracle of walflow's own) against a real PostgreSQL 15, and fuzzed input.

Each ``capture_*`` function runs one workload with its own tables, publication and slot, and returns
what ``pg_logical_slot_get_binary_changes`` produced: one pgoutput message per row, exactly the payload
of an XLogData message. The tests decode those and check field values and the relationships between
them. Every real message must also re-encode to the very same bytes (``tests/pgoutput_encode.py``),
so nothing in it went unread. A module-wide corpus of all captures feeds the truncation and mutation
fuzzing; random message objects check the round trip for values the server did not happen to send.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from tests.harness import Database, Postgres, TestNames
from tests.pgoutput_encode import encode
from tests.pgoutput_reference import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    DecodeError,
    Decoder,
    Delete,
    Insert,
    Message,
    Origin,
    PgoutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)

Conn = psycopg.Connection[tuple[object, ...]]
Row = tuple[int, bytes]  # (the SQL function's lsn column, one pgoutput message)
IN_TRANSACTION = (Relation, Type, Insert, Update, Delete, Truncate, Message)  # xid-prefixed inside a stream block
M = TypeVar("M")

PG_EPOCH_UNIX_US = 946_684_800 * 1_000_000
STREAM_START = encode(StreamStart(1, True))


def scalar(conn: Conn, query: str, *params: object) -> int:
    """The one integer that ``query`` returns."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    value = row[0]
    assert isinstance(value, int), value
    return value


def pg_now_us() -> int:
    return time.time_ns() // 1000 - PG_EPOCH_UNIX_US


def assert_recent(ts: int) -> None:
    """A commit/prepare timestamp of a transaction made by this test (µs since 2000-01-01)."""
    assert abs(ts - pg_now_us()) < 300_000_000, ts


@dataclass
class Session:
    """One test's connection, with helpers that keep every capture's slot and publication apart."""

    conn: Conn
    prefix: str
    connect: Callable[[], Conn]

    def __post_init__(self) -> None:
        # Text values are rendered by the backend that decodes: pin what the assertions depend on.
        self.conn.execute("SET TimeZone = 'UTC'")
        self.conn.execute("SET DateStyle = 'ISO'")

    def run(self, *statements: str) -> None:
        for statement in statements:
            self.conn.execute(statement)

    def scalar(self, query: str, *params: object) -> int:
        return scalar(self.conn, query, *params)

    def oid(self, relation: str) -> int:
        return self.scalar("SELECT %s::regclass::oid::bigint", relation)

    def setup(self, name: str, tables: str, *, two_phase: bool = False) -> tuple[str, str]:
        """A publication of ``tables`` and a fresh slot, both named after the capture."""
        publication = f"{name}_pub"
        self.run(f"CREATE PUBLICATION {publication} FOR TABLE {tables}")
        return self.slot(name, two_phase=two_phase), publication

    def slot(self, name: str, *, two_phase: bool = False) -> str:
        """A new slot: it sees transactions that start after this returns."""
        slot = f"{self.prefix}_{name}"
        self.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)", [slot, two_phase])
        return slot

    def changes(self, slot: str, publication: str, proto: int, *, peek: bool = False, **options: str) -> list[Row]:
        """Consume the slot (or with ``peek`` only read it): one row per pgoutput message."""
        args = ["proto_version", str(proto), "publication_names", publication]
        for key, value in options.items():
            args += [key, value]
        function = "pg_logical_slot_peek_binary_changes" if peek else "pg_logical_slot_get_binary_changes"
        query = sql.SQL("SELECT (lsn - '0/0')::bigint, data FROM {}({}, NULL, NULL, {})").format(
            sql.Identifier(function), sql.Literal(slot), sql.SQL(", ").join(sql.Literal(a) for a in args)
        )
        rows: list[Row] = []
        for lsn, data in self.conn.execute(query).fetchall():
            assert isinstance(lsn, int) and isinstance(data, bytes)
            rows.append((lsn, data))
        return rows


@dataclass
class Capture:
    """What one workload produced: the rows of each SQL call in order, and facts to check them against."""

    calls: list[list[Row]]
    facts: dict[str, int] = field(default_factory=dict)

    @property
    def rows(self) -> list[Row]:
        return [row for call in self.calls for row in call]


def decode_all(rows: list[Row]) -> list[PgoutputMessage]:
    """Decode in order with one decoder; every message must re-encode to exactly the bytes it came from."""
    decoder = Decoder()
    messages = []
    for _, data in rows:
        message = decoder.decode(data)
        assert encode(message) == data, message
        messages.append(message)
    assert not decoder.in_stream
    return messages


def only(kind: type[M], messages: list[PgoutputMessage]) -> list[M]:
    return [m for m in messages if isinstance(m, kind)]


def one(kind: type[M], messages: list[PgoutputMessage]) -> M:
    found = only(kind, messages)
    assert len(found) == 1, found
    return found[0]


def text(*values: str | None) -> TupleData:
    """A text-format tuple: ``None`` is a NULL column."""
    return TupleData(
        bytes(b"n"[0] if v is None else b"t"[0] for v in values),
        tuple(None if v is None else v.encode() for v in values),
    )


def check_transaction(messages: list[PgoutputMessage], rows: list[Row]) -> tuple[Begin, Commit]:
    """The messages are one Begin…Commit transaction; check the LSN and timestamp relationships."""
    begin, commit = messages[0], messages[-1]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
    assert commit.end_lsn == rows[-1][0]  # the Commit is written at the end of the commit record
    assert begin.commit_ts == commit.commit_ts
    assert commit.flags == 0
    assert_recent(commit.commit_ts)
    return begin, commit


def prepared_rollback_all(conn: Conn) -> None:
    """Prepared transactions outlive sessions and block DROP DATABASE: end any a failed test left behind."""
    for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()").fetchall():
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


# -- the workloads ------------------------------------------------------------------------------------------


def capture_insert(s: Session) -> Capture:
    s.run(
        "CREATE TABLE ins_items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2),"
        " created timestamptz, in_stock bool, note varchar(20))"
    )
    slot, pub = s.setup("ins", "ins_items")
    with s.conn.transaction():
        s.run("INSERT INTO ins_items VALUES (1, 'café ☕', 12.5, '2024-01-02 03:04:05.123456+00', true, NULL)")
        xid = s.scalar("SELECT pg_current_xact_id()::text::bigint")
    return Capture([s.changes(slot, pub, 1)], {"xid": xid, "relid": s.oid("ins_items")})


def capture_update_delete(s: Session) -> Capture:
    s.run(
        "CREATE TABLE ud_default (id int PRIMARY KEY, v text, n int)",
        "CREATE TABLE ud_full (id int PRIMARY KEY, v text, n int)",
        "ALTER TABLE ud_full REPLICA IDENTITY FULL",
        "CREATE TABLE ud_index (id int PRIMARY KEY, code text NOT NULL, v text)",
        "CREATE UNIQUE INDEX ud_index_code ON ud_index (code)",
        "ALTER TABLE ud_index REPLICA IDENTITY USING INDEX ud_index_code",
        "CREATE TABLE ud_nothing (id int, v text)",
        "ALTER TABLE ud_nothing REPLICA IDENTITY NOTHING",
    )
    slot, pub = s.setup("ud", "ud_default, ud_full, ud_index, ud_nothing")
    s.run(
        "INSERT INTO ud_default VALUES (1, 'a', 10)",
        "INSERT INTO ud_full VALUES (1, 'a', 10)",
        "INSERT INTO ud_index VALUES (1, 'c1', 'a')",
        "INSERT INTO ud_nothing VALUES (1, 'a')",
        "UPDATE ud_default SET v = 'b' WHERE id = 1",  # key unchanged: no old tuple
        "UPDATE ud_default SET id = 2 WHERE id = 1",  # key changed: old key
        "DELETE FROM ud_default WHERE id = 2",
        "UPDATE ud_full SET n = 11 WHERE id = 1",
        "DELETE FROM ud_full WHERE id = 1",
        "UPDATE ud_index SET code = 'c2' WHERE id = 1",
        "UPDATE ud_index SET v = 'b' WHERE id = 1",
        "DELETE FROM ud_index WHERE id = 1",
    )
    relids = {name: s.oid(name) for name in ("ud_default", "ud_full", "ud_index", "ud_nothing")}
    return Capture([s.changes(slot, pub, 1)], relids)


def capture_truncate(s: Session) -> Capture:
    s.run(
        "CREATE TABLE tr_parent (id serial PRIMARY KEY)",
        "CREATE TABLE tr_child (id serial PRIMARY KEY, parent int REFERENCES tr_parent)",
    )
    slot, pub = s.setup("tr", "tr_parent, tr_child")
    fill = ("INSERT INTO tr_parent DEFAULT VALUES", "INSERT INTO tr_child (parent) SELECT max(id) FROM tr_parent")
    s.run(*fill, "TRUNCATE tr_parent, tr_child", *fill, "TRUNCATE tr_parent RESTART IDENTITY CASCADE")
    return Capture([s.changes(slot, pub, 1)], {"parent": s.oid("tr_parent"), "child": s.oid("tr_child")})


def capture_types(s: Session) -> Capture:
    s.run(
        "CREATE TYPE ty_mood AS ENUM ('sad', 'ok', 'happy')",
        "CREATE DOMAIN ty_posint AS int CHECK (VALUE > 0)",
        "CREATE TABLE ty_t (id int PRIMARY KEY, mood ty_mood, amount ty_posint)",
    )
    slot, pub = s.setup("ty", "ty_t")
    s.run("INSERT INTO ty_t VALUES (1, 'happy', 5)")
    facts = {
        "relid": s.oid("ty_t"),
        "mood": s.scalar("SELECT 'ty_mood'::regtype::oid::bigint"),
        "posint": s.scalar("SELECT 'ty_posint'::regtype::oid::bigint"),
    }
    return Capture([s.changes(slot, pub, 1)], facts)


def capture_toast(s: Session) -> Capture:
    s.run("CREATE TABLE toast_docs (id int PRIMARY KEY, n int, body text)")
    slot, pub = s.setup("toast", "toast_docs")
    # 200 000 random hex digits: pglz cannot shrink them under the TOAST threshold, so the value lives out of line.
    s.run(
        "INSERT INTO toast_docs SELECT 1, 1, string_agg(md5(random()::text), '') FROM generate_series(1, 6250)",
        "UPDATE toast_docs SET n = 2 WHERE id = 1",
    )
    relid = s.oid("toast_docs")
    chunks = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("pg_toast", f"pg_toast_{relid}"))
    facts = {
        "relid": relid,
        "toast_chunks": s.scalar(chunks.as_string(s.conn)),
        "md5": s.scalar("SELECT ('x' || substr(md5(body), 1, 15))::bit(60)::bigint FROM toast_docs"),
    }
    return Capture([s.changes(slot, pub, 1)], facts)


def capture_binary(s: Session) -> Capture:
    s.run(
        "CREATE TABLE bin_t (id int PRIMARY KEY, flag bool, label text, at timestamptz, doc jsonb,"
        " amount numeric, big bigint, missing int)"
    )
    slot, pub = s.setup("bin", "bin_t")
    s.run("INSERT INTO bin_t VALUES (1, true, 'héllo', '2000-01-01 00:00:01+00', '{\"a\": 1}', 12.5, -2, NULL)")
    return Capture([s.changes(slot, pub, 1, binary="true")], {"relid": s.oid("bin_t")})


def capture_messages(s: Session) -> Capture:
    s.run("CREATE TABLE msg_unused (id int)")
    slot, pub = s.setup("msg", "msg_unused")
    emit = "SELECT (pg_logical_emit_message(%s, 'wf-test', %s) - '0/0')::bigint"
    facts = {"bytes": s.scalar(emit, False, b"\x00\xff")}
    s.run("BEGIN")
    facts["rolled_back"] = s.scalar(emit, True, b"rolled back")
    facts["survives"] = s.scalar(emit, False, b"survives")
    s.run("ROLLBACK", "BEGIN")
    facts["committed"] = s.scalar(emit, True, b"committed")
    facts["xid"] = s.scalar("SELECT pg_current_xact_id()::text::bigint")
    s.run("COMMIT")
    return Capture([s.changes(slot, pub, 1, messages="true")], facts)


def capture_origin(s: Session) -> Capture:
    s.run("CREATE TABLE orig_t (id int PRIMARY KEY, v text)", "SET logical_decoding_work_mem = '64kB'")
    slot, pub = s.setup("orig", "orig_t")
    origin = f"{s.prefix}_origin"  # origins belong to the cluster, not the database: drop it ourselves
    s.conn.execute("SELECT pg_replication_origin_create(%s)", [origin])
    try:
        s.conn.execute("SELECT pg_replication_origin_session_setup(%s)", [origin])
        with s.conn.transaction():
            s.run(
                "SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())", "INSERT INTO orig_t VALUES (1, 'small')"
            )
        small = s.changes(slot, pub, 1)
        with s.conn.transaction():
            s.run("INSERT INTO orig_t SELECT g, repeat('z', 50) FROM generate_series(2, 3001) g")
        streamed = s.changes(slot, pub, 2, streaming="true")  # while the origin exists: it is sent by name
    finally:
        s.run("SELECT pg_replication_origin_session_reset()")
        s.conn.execute("SELECT pg_replication_origin_drop(%s)", [origin])
    return Capture([small, streamed])


def capture_streaming(s: Session) -> Capture:
    s.run(
        "CREATE TYPE st_mood AS ENUM ('ok', 'bad')",
        "CREATE TABLE st_big (id int PRIMARY KEY, mood st_mood, payload text)",
        "CREATE TABLE st_side (id int)",
        "CREATE TABLE st_unpublished (id int)",
        "SET logical_decoding_work_mem = '64kB'",  # read by the backend that decodes: this one
    )
    slot, pub = s.setup("st", "st_big, st_side")
    rows = "INSERT INTO st_big SELECT g, 'ok', repeat('x', 50) FROM generate_series({}, {}) g"
    facts: dict[str, int] = {}
    with s.conn.transaction():
        facts["xid"] = s.scalar("SELECT pg_current_xact_id()::text::bigint")
        s.run(rows.format(1, 2000), "SELECT pg_logical_emit_message(true, 'wf-stream', 'inside')", "SAVEPOINT sp")
        s.run(rows.format(2001, 3000))
        facts["subxid"] = s.scalar("SELECT xmin::text::bigint FROM st_big WHERE id = 2001")
        s.run(
            "ROLLBACK TO SAVEPOINT sp",
            "RELEASE SAVEPOINT sp",
            "UPDATE st_big SET payload = 'updated' WHERE id = 1",
            "DELETE FROM st_big WHERE id = 2",
            "TRUNCATE st_side",
            rows.format(3001, 4000),
        )
    committed = s.changes(slot, pub, 2, streaming="true", messages="true")
    # A transaction still running when the slot is read is streamed as far as its WAL goes. Peeked at, not
    # consumed: read again after its rollback, it is streamed from its start once more, then aborted.
    # A second slot: re-reading the first from its restart_lsn would stream the committed one again (and
    # then send Stream Abort for it, as it was already confirmed).
    open_slot = s.slot("st_open")
    with s.connect() as other:
        other.execute("BEGIN")
        other.execute(rows.format(100_001, 103_000))
        facts["open_xid"] = scalar(other, "SELECT pg_current_xact_id()::text::bigint")
        s.run("INSERT INTO st_unpublished VALUES (1)")  # its commit flushes the open transaction's WAL too
        in_progress = s.changes(open_slot, pub, 2, peek=True, streaming="true", messages="true")
        other.execute("ROLLBACK")
    s.run("INSERT INTO st_unpublished VALUES (2)")  # an abort record is not flushed by itself: flush it
    aborted = s.changes(open_slot, pub, 2, streaming="true", messages="true")
    facts.update(relid=s.oid("st_big"), side=s.oid("st_side"), mood=s.scalar("SELECT 'st_mood'::regtype::oid::bigint"))
    return Capture([committed, in_progress, aborted], facts)


def capture_two_phase(s: Session) -> Capture:
    s.run("CREATE TABLE tp_t (id int PRIMARY KEY, v text)")
    slot, pub = s.setup("tp", "tp_t", two_phase=True)
    facts: dict[str, int] = {}
    xid = "SELECT pg_current_xact_id()::text::bigint"
    calls = []
    try:
        s.run("BEGIN", "INSERT INTO tp_t VALUES (1, 'a')")
        facts["xid_a"] = s.scalar(xid)
        s.run("PREPARE TRANSACTION 'wf-gid-a'")
        calls.append(s.changes(slot, pub, 3, two_phase="true"))
        s.run("COMMIT PREPARED 'wf-gid-a'", "BEGIN", "INSERT INTO tp_t VALUES (2, 'b')")
        facts["xid_b"] = s.scalar(xid)
        s.run("PREPARE TRANSACTION 'wf-gid-b'")
        calls.append(s.changes(slot, pub, 3, two_phase="true"))
        s.run("ROLLBACK PREPARED 'wf-gid-b'")
        calls.append(s.changes(slot, pub, 3, two_phase="true"))
        # Prepared and rolled back before the slot is read: decoded at PREPARE, already known to be aborted.
        s.run("BEGIN", "INSERT INTO tp_t VALUES (3, 'c')")
        facts["xid_c"] = s.scalar(xid)
        s.run("PREPARE TRANSACTION 'wf-gid-c'", "ROLLBACK PREPARED 'wf-gid-c'")
        calls.append(s.changes(slot, pub, 3, two_phase="true"))
    finally:
        prepared_rollback_all(s.conn)
    return Capture(calls, facts)


def capture_stream_prepare(s: Session) -> Capture:
    s.run("CREATE TABLE sp_t (id int PRIMARY KEY, v text)", "SET logical_decoding_work_mem = '64kB'")
    slot, pub = s.setup("sp", "sp_t", two_phase=True)
    facts: dict[str, int] = {}
    try:
        s.run("BEGIN", "INSERT INTO sp_t SELECT g, repeat('y', 40) FROM generate_series(1, 3000) g")
        facts["xid"] = s.scalar("SELECT pg_current_xact_id()::text::bigint")
        s.run("PREPARE TRANSACTION 'wf-gid-big'")
        prepared = s.changes(slot, pub, 3, two_phase="true", streaming="true")
        s.run("COMMIT PREPARED 'wf-gid-big'")
        committed = s.changes(slot, pub, 3, two_phase="true", streaming="true")
    finally:
        prepared_rollback_all(s.conn)
    return Capture([prepared, committed], facts)


CAPTURES: list[Callable[[Session], Capture]] = [
    capture_insert,
    capture_update_delete,
    capture_truncate,
    capture_types,
    capture_toast,
    capture_binary,
    capture_messages,
    capture_origin,
    capture_streaming,
    capture_two_phase,
    capture_stream_prepare,
]


@pytest.fixture
def session(database: Database, names: TestNames) -> Iterator[Session]:
    with database.connect() as conn:
        yield Session(conn, names.slot, database.connect)


# -- real messages, one workload per test ---------------------------------------------------------------------


def test_insert_transaction(session: Session) -> None:
    cap = capture_insert(session)
    messages = decode_all(cap.rows)
    assert [type(m) for m in messages] == [Begin, Relation, Insert, Commit]
    begin, _ = check_transaction(messages, cap.rows)
    assert begin.xid == cap.facts["xid"]
    relation = one(Relation, messages)
    assert relation == Relation(
        xid=None,
        relid=cap.facts["relid"],
        namespace="public",
        name="ins_items",
        replica_identity="d",
        columns=(
            Column(1, "id", 23, -1),
            Column(0, "name", 25, -1),
            Column(0, "price", 1700, (10 << 16 | 2) + 4),  # numeric typmod: (precision << 16 | scale) + VARHDRSZ
            Column(0, "created", 1184, -1),
            Column(0, "in_stock", 16, -1),
            Column(0, "note", 1043, 20 + 4),
        ),
    )
    assert [c.is_key for c in relation.columns] == [True, False, False, False, False, False]
    insert = one(Insert, messages)
    assert insert == Insert(
        None, relation.relid, text("1", "café ☕", "12.50", "2024-01-02 03:04:05.123456+00", "t", None)
    )


def test_update_and_delete_old_tuples_per_replica_identity(session: Session) -> None:
    cap = capture_update_delete(session)
    messages = decode_all(cap.rows)
    ids = cap.facts
    relations = {r.name: r for r in only(Relation, messages)}
    assert {name: r.replica_identity for name, r in relations.items()} == {
        "ud_default": "d",
        "ud_full": "f",
        "ud_index": "i",
        "ud_nothing": "n",
    }
    assert {name: [c.name for c in r.columns if c.is_key] for name, r in relations.items()} == {
        "ud_default": ["id"],
        "ud_full": ["id", "v", "n"],  # FULL: every column is part of the identity
        "ud_index": ["code"],
        "ud_nothing": [],
    }
    assert {name: r.relid for name, r in relations.items()} == ids
    changes = [m for m in messages if isinstance(m, Update | Delete)]
    assert changes == [
        Update(None, ids["ud_default"], None, None, text("1", "b", "10")),
        Update(None, ids["ud_default"], "K", text("1", None, None), text("2", "b", "10")),
        Delete(None, ids["ud_default"], "K", text("2", None, None)),
        Update(None, ids["ud_full"], "O", text("1", "a", "10"), text("1", "a", "11")),
        Delete(None, ids["ud_full"], "O", text("1", "a", "11")),
        Update(None, ids["ud_index"], "K", text(None, "c1", None), text("1", "c2", "a")),
        Update(None, ids["ud_index"], None, None, text("1", "c2", "b")),
        Delete(None, ids["ud_index"], "K", text(None, "c2", None)),
    ]
    assert one(Insert, [m for m in messages if getattr(m, "relid", None) == ids["ud_nothing"]]).new == text("1", "a")


def test_truncate_of_two_tables_with_flags(session: Session) -> None:
    cap = capture_truncate(session)
    messages = decode_all(cap.rows)
    both = {cap.facts["parent"], cap.facts["child"]}
    truncates = only(Truncate, messages)
    assert [(set(t.relids), len(t.relids), t.cascade, t.restart_identity, t.xid) for t in truncates] == [
        (both, 2, False, False, None),
        (both, 2, True, True, None),  # the child was emptied by CASCADE and still comes in the same message
    ]
    for truncate in truncates:  # each inside its own transaction
        position = messages.index(truncate)
        assert isinstance(messages[position + 1], Commit)
        assert any(isinstance(m, Begin) for m in messages[:position])


def test_type_messages_for_enum_and_domain(session: Session) -> None:
    cap = capture_types(session)
    messages = decode_all(cap.rows)
    assert [type(m) for m in messages] == [Begin, Type, Type, Relation, Insert, Commit]
    mood, posint = cap.facts["mood"], cap.facts["posint"]
    assert mood >= 10000 and posint >= 10000
    assert only(Type, messages) == [
        Type(None, mood, "public", "ty_mood"),
        Type(None, posint, "", "int4"),  # a domain: its own OID, but its base type's name, "" = pg_catalog
    ]
    relation = one(Relation, messages)
    assert [(c.name, c.type_oid) for c in relation.columns] == [("id", 23), ("mood", mood), ("amount", posint)]
    assert one(Insert, messages).new == text("1", "happy", "5")


def test_unchanged_toast_column(session: Session) -> None:
    cap = capture_toast(session)
    assert cap.facts["toast_chunks"] > 50  # the value really is stored out of line (in ~2 kB chunks)
    messages = decode_all(cap.rows)
    insert, update = one(Insert, messages), one(Update, messages)
    body = insert.new.values[2]
    assert insert.new.kinds == b"ttt" and body is not None and len(body) == 200_000
    assert int(hashlib.md5(body).hexdigest()[:15], 16) == cap.facts["md5"]
    assert update.old is None and update.new.kinds == b"ttu"
    assert update.new.values == (b"1", b"2", None)


def test_binary_format_columns(session: Session) -> None:
    cap = capture_binary(session)
    messages = decode_all(cap.rows)
    assert one(Insert, messages).new == TupleData(
        b"bbbbbbbn",
        (
            struct.pack("!i", 1),
            b"\x01",
            "héllo".encode(),
            struct.pack("!q", 1_000_000),  # µs since 2000-01-01
            b'\x01{"a": 1}',  # jsonb: version byte, then the text
            struct.pack("!hhhh2h", 2, 0, 0, 1, 12, 5000),  # numeric: ndigits, weight, sign, dscale, base-10000 digits
            struct.pack("!q", -2),
            None,
        ),
    )


def test_logical_messages_transactional_and_not(session: Session) -> None:
    cap = capture_messages(session)
    messages = decode_all(cap.rows)
    f = cap.facts
    assert messages[:2] == [
        Message(None, False, f["bytes"], "wf-test", b"\x00\xff"),
        Message(None, False, f["survives"], "wf-test", b"survives"),  # its transaction rolled back; it still comes
    ]
    assert [type(m) for m in messages[2:]] == [Begin, Message, Commit]
    begin, _ = check_transaction(messages[2:], cap.rows)
    assert begin.xid == f["xid"]
    assert messages[3] == Message(None, True, f["committed"], "wf-test", b"committed")
    # Message.lsn is what pg_logical_emit_message returned, and the LSN the server writes the message at.
    assert [lsn for lsn, _ in cap.rows[:2]] == [f["bytes"], f["survives"]]
    assert f["rolled_back"] not in {m.lsn for m in only(Message, messages)}


def test_origin_after_begin_and_inside_the_first_stream_block(session: Session) -> None:
    cap = capture_origin(session)
    name = f"{session.prefix}_origin"
    small = decode_all(cap.calls[0])
    assert [type(m) for m in small] == [Begin, Origin, Relation, Insert, Commit]
    check_transaction(small, cap.calls[0])
    assert small[1] == Origin(0xABCDEF, name)
    # Streamed: Origin follows the first Stream Start, inside the block and without an xid prefix.
    streamed = decode_all(cap.calls[1])
    start = streamed[0]
    assert isinstance(start, StreamStart) and start.first_segment
    assert streamed[1] == Origin(0, name)  # stream start sends no origin LSN
    assert len(only(Origin, streamed)) == 1 and len(only(StreamStart, streamed)) > 1
    assert isinstance(streamed[-1], StreamCommit) and streamed[-1].xid == start.xid


def test_streamed_transactions(session: Session) -> None:
    cap = capture_streaming(session)
    f = cap.facts
    xid, subxid, open_xid = f["xid"], f["subxid"], f["open_xid"]
    assert len({xid, subxid, open_xid}) == 3
    decoder = Decoder()
    blocks: list[tuple[int, StreamStart, list[PgoutputMessage]]] = []  # (SQL call, Stream Start, contents)
    outside: list[tuple[int, int, PgoutputMessage]] = []  # (SQL call, lsn, message) between blocks
    for call, rows in enumerate(cap.calls):
        for lsn, data in rows:
            was_in_stream = decoder.in_stream
            message = decoder.decode(data)
            assert encode(message) == data
            is_stop = isinstance(message, StreamStop)
            assert decoder.in_stream is (isinstance(message, StreamStart) or (was_in_stream and not is_stop))
            if isinstance(message, StreamStart):
                blocks.append((call, message, []))
            elif was_in_stream and not is_stop:
                blocks[-1][2].append(message)
            elif not was_in_stream:
                outside.append((call, lsn, message))
    assert not decoder.in_stream

    # Between blocks only the ends of streamed transactions; no Begin/Commit at all.
    assert [(call, type(m)) for call, _, m in outside] == [(0, StreamAbort), (0, StreamCommit), (2, StreamAbort)]
    (_, _, sub_abort), (_, commit_row_lsn, commit), (_, _, open_abort) = outside
    assert sub_abort == StreamAbort(xid, subxid, None, None)  # ROLLBACK TO SAVEPOINT: only the subtransaction
    assert isinstance(commit, StreamCommit) and (commit.xid, commit.flags) == (xid, 0)
    assert commit.commit_lsn < commit.end_lsn == commit_row_lsn
    assert_recent(commit.commit_ts)
    assert open_abort == StreamAbort(open_xid, open_xid, None, None)  # the whole transaction

    committed = [(start, body) for call, start, body in blocks if call == 0]
    assert all(start.xid == xid for start, _ in committed)
    assert [start.first_segment for start, _ in committed] == [True] + [False] * (len(committed) - 1)
    changes = [m for _, body in committed for m in body]
    # Inside a block every change carries the xid of its (sub)transaction.
    assert all(isinstance(m, IN_TRANSACTION) and m.xid in {xid, subxid} for m in changes)
    relations = only(Relation, changes)
    assert {r.relid for r in relations} == {f["relid"], f["side"]} and all(r.xid == xid for r in relations)
    assert Type(xid, f["mood"], "public", "st_mood") in changes
    assert Message(xid, True, one(Message, changes).lsn, "wf-stream", b"inside") in changes
    assert Update(xid, f["relid"], None, None, text("1", "ok", "updated")) in changes
    assert Delete(xid, f["relid"], "K", text("2", None, None)) in changes
    assert Truncate(xid, (f["side"],), False, False) in changes
    # Apply as a subscriber would: drop the aborted subtransaction's rows, keep the rest.
    inserted = {(m.xid, int(m.new.values[0] or b"")) for m in only(Insert, changes)}
    sub_rows = {row for x, row in inserted if x == subxid}
    assert sub_rows and sub_rows <= set(range(2001, 3001))  # streamed before the ROLLBACK TO SAVEPOINT
    assert {row for x, row in inserted if x == xid} == set(range(1, 2001)) | set(range(3001, 4001))

    # The transaction open during the peek was streamed as far as its WAL went; the read after its rollback
    # (a new decoding session) streamed it from its start again before the abort.
    assert {start.xid for c, start, _ in blocks if c > 0} == {open_xid}
    for call in (1, 2):
        starts = [start for c, start, _ in blocks if c == call]
        assert [s.first_segment for s in starts] == [True] + [False] * (len(starts) - 1)
    streamed = [m for c, _, body in blocks if c == 1 for m in body]
    assert streamed and all(isinstance(m, Insert | Relation | Type) and m.xid == open_xid for m in streamed)
    assert {int(m.new.values[0] or b"") for m in only(Insert, streamed)} <= set(range(100_001, 103_001))


def test_two_phase_prepare_commit_and_rollback(session: Session) -> None:
    cap = capture_two_phase(session)
    f = cap.facts
    first = decode_all(cap.calls[0])
    assert [type(m) for m in first] == [BeginPrepare, Relation, Insert, Prepare]
    begin, prepare_a = first[0], first[-1]
    assert isinstance(begin, BeginPrepare) and isinstance(prepare_a, Prepare)
    assert begin == BeginPrepare(prepare_a.prepare_lsn, prepare_a.end_lsn, prepare_a.prepare_ts, f["xid_a"], "wf-gid-a")
    assert prepare_a.flags == 0 and prepare_a.gid == "wf-gid-a" and prepare_a.xid == f["xid_a"]
    assert prepare_a.prepare_lsn < prepare_a.end_lsn == cap.calls[0][-1][0]
    assert_recent(prepare_a.prepare_ts)
    assert one(Insert, first).new == text("1", "a")

    second = decode_all(cap.calls[1])
    assert [type(m) for m in second] == [CommitPrepared, BeginPrepare, Relation, Insert, Prepare]
    commit = second[0]
    assert isinstance(commit, CommitPrepared)
    assert (commit.flags, commit.xid, commit.gid) == (0, f["xid_a"], "wf-gid-a")
    assert prepare_a.end_lsn <= commit.commit_lsn < commit.end_lsn
    assert commit.commit_ts >= prepare_a.prepare_ts
    prepare_b = second[-1]
    assert isinstance(prepare_b, Prepare) and (prepare_b.xid, prepare_b.gid) == (f["xid_b"], "wf-gid-b")
    assert one(Insert, second).new == text("2", "b")

    third = decode_all(cap.calls[2])
    rollback = one(RollbackPrepared, third)
    assert third == [rollback] and rollback == RollbackPrepared(
        0,
        prepare_b.end_lsn,
        rollback.rollback_end_lsn,
        prepare_b.prepare_ts,
        rollback.rollback_ts,
        f["xid_b"],
        "wf-gid-b",
    )
    assert rollback.rollback_end_lsn > rollback.prepare_end_lsn and rollback.rollback_ts >= rollback.prepare_ts
    assert rollback.rollback_end_lsn == cap.calls[2][0][0]

    # Already rolled back when decoded: Begin Prepare and Prepare still come, with none of its changes.
    fourth = decode_all(cap.calls[3])
    assert [type(m) for m in fourth] == [BeginPrepare, Prepare, RollbackPrepared]
    assert {getattr(m, "gid", None) for m in fourth} == {"wf-gid-c"}
    assert {getattr(m, "xid", None) for m in fourth} == {f["xid_c"]}


def test_stream_prepare(session: Session) -> None:
    cap = capture_stream_prepare(session)
    xid = cap.facts["xid"]
    prepared = decode_all(cap.calls[0])
    starts = only(StreamStart, prepared)
    assert len(starts) > 1 and all(s.xid == xid for s in starts) and starts[0].first_segment
    assert not any(s.first_segment for s in starts[1:])
    inserts = only(Insert, prepared)
    assert [int(i.new.values[0] or b"") for i in inserts] == list(range(1, 3001))
    assert all(i.xid == xid for i in inserts)
    stream_prepare = prepared[-1]
    assert isinstance(stream_prepare, StreamPrepare)
    assert (stream_prepare.flags, stream_prepare.xid, stream_prepare.gid) == (0, xid, "wf-gid-big")
    assert stream_prepare.prepare_lsn < stream_prepare.end_lsn == cap.calls[0][-1][0]
    assert_recent(stream_prepare.prepare_ts)
    commit = one(CommitPrepared, decode_all(cap.calls[1]))
    assert (commit.xid, commit.gid) == (xid, "wf-gid-big") and commit.commit_lsn >= stream_prepare.end_lsn


# -- the decoder's own rules ----------------------------------------------------------------------------------


def in_stream_decoder() -> Decoder:
    decoder = Decoder()
    decoder.decode(STREAM_START)
    return decoder


def test_unknown_type_byte_is_named() -> None:
    with pytest.raises(DecodeError, match=r"^unknown pgoutput message type b'Z' \(0x5a\)$"):
        Decoder().decode(b"Z\x00\x00")
    with pytest.raises(DecodeError, match="empty"):
        Decoder().decode(b"")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"B" + bytes(19), r"malformed pgoutput Begin message \(20 bytes\): expected 21 bytes, got 20"),
        (b"B" + bytes(21), "expected 21 bytes, got 22"),
        (b"A" + bytes(12), "expected 9 bytes, got 13"),
        (b"S" + bytes(4) + b"\x02", "first_segment must be 0 or 1"),
        (b"I\x00\x00\x00\x01X\x00\x00", r"expected 'N' \(new tuple\), got b'X'"),
        (b"I\x00\x00\x00\x01N\x00\x01x", r"column 0: unknown tuple data kind b'x'"),
        (b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x05abc", "column 0: a 5-byte value"),
        (b"U\x00\x00\x00\x01K\x00\x00K\x00\x00", r"expected 'N' \(new tuple\), got b'K'"),
        (b"D\x00\x00\x00\x01N\x00\x00", r"expected 'K' or 'O'"),
        (b"R\x00\x00\x00\x01\x00t\x00x\x00\x00", r"unknown replica identity 'x'"),
        (b"R\x00\x00\x00\x01public", "no NUL terminator"),
        (b"T\xff\xff\xff\xff\x00\x00\x00\x00\x01", "4294967295 relation ids need"),
        (b"T\x00\x00\x00\x01\x04\x00\x00\x00\x01", "unknown truncate flags 0x04"),
        (b"M\x02" + bytes(8) + b"p\x00" + bytes(4), "unknown message flags 0x02"),
        (b"M\x00" + bytes(8) + b"p\x00\x00\x00\x00\x02x", "content length 2 does not match the 1 bytes"),
        (b"O" + bytes(8) + b"name\x00\x00", "1 unexpected trailing bytes"),
        (b"P" + bytes(29), "no NUL terminator"),
        (b"C\x00", r"malformed pgoutput Commit message \(2 bytes\)"),
    ],
)
def test_malformed_messages_are_refused(data: bytes, error: str) -> None:
    with pytest.raises(DecodeError, match=error):
        Decoder().decode(data)


def test_stream_state_is_enforced_and_survives_errors() -> None:
    decoder = Decoder()
    with pytest.raises(DecodeError, match="Stream Stop outside a stream block"):
        decoder.decode(b"E")
    decoder.decode(encode(StreamStart(77, True)))
    assert decoder.in_stream
    for outside_only in (StreamStart(78, False), Begin(1, 2, 3), Commit(0, 1, 2, 3), StreamCommit(77, 0, 1, 2, 3)):
        with pytest.raises(DecodeError, match="inside the stream block of transaction 77"):
            decoder.decode(encode(outside_only))
    with pytest.raises(DecodeError):
        decoder.decode(b"I\x00\x00")  # malformed: the state is unchanged
    with pytest.raises(DecodeError, match="malformed pgoutput Stream Stop message .* 1 unexpected trailing bytes"):
        decoder.decode(b"E\x00")
    assert decoder.in_stream
    # Inside a block the same bytes carry an xid first; Origin never does.
    assert decoder.decode(encode(Insert(9, 5, text("x")))) == Insert(9, 5, text("x"))
    assert decoder.decode(encode(Origin(0, "o"))) == Origin(0, "o")
    assert decoder.decode(b"E") == StreamStop() and not decoder.in_stream
    assert Decoder().decode(encode(Insert(None, 5, text("x")))) == Insert(None, 5, text("x"))
    assert decoder.decode(encode(Origin(0, "o"))) == Origin(0, "o")


def test_stream_abort_has_two_sizes() -> None:
    assert Decoder().decode(b"A" + struct.pack("!II", 5, 6)) == StreamAbort(5, 6, None, None)
    assert Decoder().decode(b"A" + struct.pack("!IIQq", 5, 6, 7, -8)) == StreamAbort(5, 6, 7, -8)


def test_memoryview_input_gives_independent_bytes() -> None:
    buffer = bytearray(encode(Insert(None, 5, text("abc", None))))
    message = Decoder().decode(memoryview(buffer))
    buffer[:] = bytes(len(buffer))  # the receive buffer is reused
    assert message == Insert(None, 5, text("abc", None))
    assert type(message.new.values[0]) is bytes


# -- fuzzing: random and mutated bytes, random messages -------------------------------------------------------


def check_decode(decoder: Decoder, data: bytes) -> None:
    """Either a message that re-encodes to exactly ``data`` (nothing ignored), or a DecodeError."""
    before = decoder.in_stream
    try:
        message = decoder.decode(data)
    except DecodeError:
        assert decoder.in_stream == before
        return
    if isinstance(message, StreamStart | StreamStop):  # re-encoding needs the state before the message
        assert decoder.in_stream != before
    assert encode(message) == data


@given(st.booleans(), st.binary(max_size=64))
def test_random_bytes(in_stream: bool, data: bytes) -> None:
    check_decode(in_stream_decoder() if in_stream else Decoder(), data)


@given(st.booleans(), st.sampled_from(b"BCORYIUDTMSEcAbPKrp"), st.binary(max_size=64))
def test_random_bodies_of_every_type(in_stream: bool, tag: int, body: bytes) -> None:
    check_decode(in_stream_decoder() if in_stream else Decoder(), bytes([tag]) + body)


@pytest.fixture(scope="module")
def corpus(pg_server: Postgres) -> Iterator[list[tuple[bool, bytes]]]:
    """Real messages of every kind the server produced, each with the stream state it was decoded in."""
    if not pg_server.running:
        pg_server.start()
    names = TestNames.for_test("pgoutput_corpus")
    db = Database(pg_server, names)
    db.create()
    try:
        with db.connect() as conn:
            session = Session(conn, names.slot, db.connect)
            rows = [row for capture in CAPTURES for row in capture(session).rows]
        decoder = Decoder()
        per_kind: dict[tuple[int, bool], list[bytes]] = {}
        for _, data in rows:
            state = decoder.in_stream
            decoder.decode(data)
            samples = per_kind.setdefault((data[0], state), [])
            if len(samples) < 8 and data not in samples:
                samples.append(data)
        yield [(state, data) for (_, state), samples in per_kind.items() for data in samples]
    finally:
        db.drop()


def test_corpus_has_every_message_the_server_sends(corpus: list[tuple[bool, bytes]]) -> None:
    kinds = {(chr(data[0]), state) for state, data in corpus}
    outside = {k for k, state in kinds if not state}
    inside = {k for k, state in kinds if state}
    assert outside == set("BCORYIUDTMScAbPKrp")
    assert inside == set("ORYIUDTME")  # Stream Stop ends a block; Origin follows a first Stream Start


def test_every_truncation_of_real_messages_is_refused(corpus: list[tuple[bool, bytes]]) -> None:
    for state, data in corpus:
        n = len(data)
        cuts = set(range(min(n, 300))) | set(range(max(0, n - 300), n)) | set(range(0, n, 997))
        for cut in sorted(cuts):
            decoder = in_stream_decoder() if state else Decoder()
            with pytest.raises(DecodeError):
                decoder.decode(data[:cut])
            assert decoder.in_stream == state


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data())
def test_mutated_real_messages(corpus: list[tuple[bool, bytes]], data: st.DataObject) -> None:
    state, message = data.draw(st.sampled_from(corpus))
    at = data.draw(st.integers(0, len(message)))
    mutation = data.draw(st.sampled_from(["replace", "insert", "delete", "big-int32", "truncate"]))
    if mutation == "replace" and at < len(message):
        mutated = message[:at] + bytes([data.draw(st.integers(0, 255))]) + message[at + 1 :]
    elif mutation == "insert":
        mutated = message[:at] + data.draw(st.binary(min_size=1, max_size=8)) + message[at:]
    elif mutation == "delete":
        mutated = message[:at] + message[at + data.draw(st.integers(1, 8)) :]
    elif mutation == "big-int32":  # lengths and counts are the fields that hurt
        value = data.draw(st.sampled_from([0, 1, 2**15, 2**16 - 1, 2**31 - 1, 2**32 - 1]))
        mutated = message[:at] + struct.pack("!I", value) + message[at + 4 :]
    else:
        mutated = message[:at]
    check_decode(in_stream_decoder() if state else Decoder(), mutated)


u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u8 = st.integers(0, 255)
xids = st.none() | u32
names_ = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
tuples = st.lists(
    st.tuples(st.sampled_from(b"nu"), st.none()) | st.tuples(st.sampled_from(b"tb"), st.binary(max_size=12)),
    max_size=6,
).map(lambda cols: TupleData(bytes(k for k, _ in cols), tuple(v for _, v in cols)))
columns = st.builds(Column, u8, names_, u32, st.integers(-(2**31), 2**31 - 1))
messages: st.SearchStrategy[PgoutputMessage] = st.one_of(
    st.builds(Begin, u64, i64, u32),
    st.builds(Commit, u8, u64, u64, i64),
    st.builds(Origin, u64, names_),
    st.builds(Relation, xids, u32, names_, names_, st.sampled_from("dnfi"), st.lists(columns, max_size=5).map(tuple)),
    st.builds(Type, xids, u32, names_, names_),
    st.builds(Insert, xids, u32, tuples),
    st.builds(Update, xids, u32, st.just(None), st.just(None), tuples),
    st.builds(Update, xids, u32, st.sampled_from("KO"), tuples, tuples),
    st.builds(Delete, xids, u32, st.sampled_from("KO"), tuples),
    st.builds(Truncate, xids, st.lists(u32, max_size=5).map(tuple), st.booleans(), st.booleans()),
    st.builds(Message, xids, st.booleans(), u64, names_, st.binary(max_size=20)),
    st.builds(StreamStart, u32, st.booleans()),
    st.just(StreamStop()),
    st.builds(StreamCommit, u32, u8, u64, u64, i64),
    st.builds(StreamAbort, u32, u32, st.none(), st.none()),
    st.builds(StreamAbort, u32, u32, u64, i64),
    st.builds(BeginPrepare, u64, u64, i64, u32, names_),
    st.builds(Prepare, u8, u64, u64, i64, u32, names_),
    st.builds(CommitPrepared, u8, u64, u64, i64, u32, names_),
    st.builds(RollbackPrepared, u8, u64, u64, i64, i64, u32, names_),
    st.builds(StreamPrepare, u8, u64, u64, i64, u32, names_),
)


@given(messages)
def test_random_messages_round_trip(message: PgoutputMessage) -> None:
    needs_stream = isinstance(message, StreamStop) or (isinstance(message, IN_TRANSACTION) and message.xid is not None)
    decoder = in_stream_decoder() if needs_stream else Decoder()
    assert decoder.decode(memoryview(encode(message))) == message
