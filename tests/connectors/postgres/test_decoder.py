"""The decoder: bytes in, changes and positions out, with no socket, thread or clock.

Three kinds of checks:

- hand-built messages (``tests/pgoutput_encode.py``) for each rule: positions, the resume
  skip, key-only old rows, refused messages, the memory estimate;
- real WAL from PostgreSQL 15 (a workload of every message type the session asks for),
  decoded by walflow's decoder and, independently, by the tests' reference decoder
  (``tests/pgoutput_reference.py``) with a plain model of transactions on top: both must
  give the same changes and markers, from a fresh start and resumed anywhere;
- mutated real messages and random bytes: the same outcome as the oracle, and never an
  error other than ``DecodeError``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.postgres import relations
from connectors.postgres.connection import conninfo
from connectors.postgres.decoder import (
    WHOLE_TRANSACTION,
    DecodeError,
    Decoder,
    Item,
    ResumePoint,
    change_memory,
)
from connectors.postgres.messages import OWNED
from connectors.postgres.protocol import pg_timestamp
from connectors.postgres.types import Catalog
from core.events import UNCHANGED_TOAST, OversizedValue, RawChange, RawRow, RawValue, Table
from tests import pgoutput_reference as ref
from tests.copydata import ORDERS, TS, FakeCatalog, keepalive, text, transaction, xlog
from tests.harness import Database, TestNames
from tests.pgoutput_encode import encode
from tests.replication import slot_messages


def run(messages: list[bytes], resume: ResumePoint | None = None) -> tuple[Decoder, list[Item]]:
    decoder = Decoder(FakeCatalog(), resume or ResumePoint())
    for message in messages:
        decoder.feed(message)
    return decoder, decoder.take()[0]


def changes(items: list[Item]) -> list[RawChange]:
    return [item for item in items if isinstance(item, RawChange)]


def test_each_message_kind_is_its_protocol_letter() -> None:
    """The kinds are int literals (compiled, a C constant each): each is the byte the protocol names."""
    from connectors.postgres import decoder

    letters = {"_XLOGDATA": "w", "_KEEPALIVE": "k", "_BEGIN": "B", "_COMMIT": "C", "_INSERT": "I", "_UPDATE": "U",
               "_DELETE": "D", "_RELATION": "R", "_TYPE": "Y", "_ORIGIN": "O", "_TRUNCATE": "T", "_MESSAGE": "M",
               "_NEW": "N", "_KEY": "K", "_OLD": "O", "_TEXT": "t", "_NULL": "n", "_UNCHANGED": "u"}
    assert {name: chr(getattr(decoder, name)) for name in letters} == letters


# -- the rules, on hand-built messages ---------------------------------------------------------------------


def test_a_transaction_is_its_changes_then_its_end() -> None:
    messages = [xlog(ORDERS), *transaction(1000, 1100, ref.Insert(None, 16400, text("1", "a")),
                                           ref.Insert(None, 16400, text("2", None)))]
    decoder, items = run(messages)
    first, second, end = items
    assert isinstance(first, RawChange) and isinstance(second, RawChange)
    assert (first.action, first.table.qualified, first.new, first.old) == ("insert", "public.orders", (b"1", b"a"), None)
    assert second.new == (b"2", None)
    assert (first.commit_lsn, first.commit_idx, second.commit_idx, first.xid) == (1000, 0, 1, 7)
    assert first.commit_ts == pg_timestamp(TS) and first.commit_ts.tzinfo is UTC
    assert end == 1100  # the commit's end: everything before it was handed on
    assert decoder.received == 1000 and decoder.resume_point() == ResumePoint(1100)


def test_sizes_are_the_memory_estimate() -> None:
    messages = [xlog(ORDERS), *transaction(1000, 1100, ref.Insert(None, 16400, text("1", "abc")))]
    decoder = Decoder(FakeCatalog(), ResumePoint())
    for message in messages:
        decoder.feed(message)
    _, sizes, total = decoder.take()
    assert sizes == [change_memory(len(messages[2]), 2), 0] and total == sum(sizes)
    assert decoder.take() == ([], [], 0)


def test_keepalives_mark_walend_only_between_transactions() -> None:
    decoder = Decoder(FakeCatalog(), ResumePoint())
    assert decoder.feed(keepalive(500, reply=True)) is True
    decoder.feed(xlog(ORDERS))
    decoder.feed(xlog(ref.Begin(1000, TS, 7), 900))
    assert decoder.feed(keepalive(950)) is False  # inside a transaction: no position
    decoder.feed(xlog(ref.Insert(None, 16400, text("1", "a")), 950))
    decoder.feed(xlog(ref.Commit(0, 1000, 1100, TS), 1000))
    decoder.feed(keepalive(1200))
    decoder.feed(keepalive(1300))  # consecutive markers collapse
    items = decoder.take()[0]
    assert [i if isinstance(i, int) else "change" for i in items] == [500, "change", 1300]
    assert decoder.received == 1300


def test_resume_skips_what_a_previous_run_emitted() -> None:
    rows = [ref.Insert(None, 16400, text(str(i), "x")) for i in range(5)]
    messages = [xlog(ORDERS), *transaction(1000, 1100, *rows[:2]), *transaction(2000, 2100, *rows)]
    _, items = run(messages, ResumePoint(1100, 2000, 2))  # the first done, the second up to index 2
    assert [(c.commit_lsn, c.commit_idx) for c in changes(items)] == [(2000, 3), (2000, 4)]
    assert items[-1] == 2100
    decoder, items = run(messages, ResumePoint(2100))  # both done: nothing, not even their ends
    assert items == [] and decoder.resume_point() == ResumePoint(2100)


def test_resume_point_mid_transaction() -> None:
    messages = [xlog(ORDERS), *transaction(1000, 1100, ref.Insert(None, 16400, text("1", "a")))][:-1]
    decoder, _ = run(messages, ResumePoint(900))
    assert decoder.resume_point() == ResumePoint(900, 1000, 0)


def test_emitted_up_to_follows_the_servers_skip_rule() -> None:
    point = ResumePoint(lsn=1000, commit_lsn=2000, commit_idx=4)
    assert point.emitted_up_to(999) > WHOLE_TRANSACTION  # committed before the position: all of it
    assert point.emitted_up_to(1000) == -1 and point.emitted_up_to(2000) == 4 and point.emitted_up_to(3000) == -1


def test_key_only_and_full_old_rows() -> None:
    key_update = ref.Update(None, 16400, "K", text("1", None), text("10", "a"))
    full_delete = ref.Delete(None, 16400, "O", text("10", "a"))
    _, items = run([xlog(ORDERS), *transaction(1000, 1100, key_update, full_delete)])
    update, delete = changes(items)
    assert (update.action, update.old, update.old_is_key, update.new) == ("update", (b"1", None), True, (b"10", b"a"))
    assert (delete.action, delete.old, delete.old_is_key, delete.new) == ("delete", (b"10", b"a"), False, None)


def test_unchanged_toast_is_the_marker() -> None:
    update = ref.Update(None, 16400, None, None, ref.TupleData(b"tu", (b"1", None)))
    _, items = run([xlog(ORDERS), *transaction(1000, 1100, update)])
    assert changes(items)[0].new == (b"1", UNCHANGED_TOAST)


def test_a_new_relation_version_applies_to_later_changes_only() -> None:
    wider = ref.Relation(None, 16400, "public", "orders", "d", (*ORDERS.columns, ref.Column(0, "extra", 23, -1)))
    messages = [xlog(ORDERS), *transaction(1000, 1100, ref.Insert(None, 16400, text("1", "a"))),
                xlog(wider), *transaction(2000, 2100, ref.Insert(None, 16400, text("2", "b", "7")))]
    _, items = run(messages)
    before, after = changes(items)
    assert before.table.columns == ("id", "note") and after.table.columns == ("id", "note", "extra")


def test_truncate_is_one_change_per_table_at_one_index_and_types_reach_the_catalog() -> None:
    catalog = FakeCatalog()
    decoder = Decoder(catalog, ResumePoint())
    other = ref.Relation(None, 16401, "public", "other", "d", (ref.Column(1, "id", 23, -1),))
    for message in [xlog(ref.Type(None, 16500, "", "int4")), xlog(ORDERS), xlog(other),
                    *transaction(1000, 1100, ref.Truncate(None, (16400, 16401), False, False))]:
        decoder.feed(message)
    truncated = changes(decoder.take()[0])
    assert [(c.action, c.table.name, c.commit_idx) for c in truncated] == [("truncate", "orders", 0),
                                                                          ("truncate", "other", 0)]
    assert catalog.types == [relations.TypeName(16500, "", "int4")]


def test_heartbeats_go_to_the_callback_others_messages_nowhere() -> None:
    seen: list[tuple[str, bytes]] = []
    ignored: list[tuple[str, str]] = []
    decoder = Decoder(FakeCatalog(), ResumePoint(), lambda prefix, content: seen.append((prefix, content)),
                      on_ignored=lambda prefix, reason, _: ignored.append((prefix, reason)))
    for message in transaction(1000, 1100, ref.Message(None, True, 1000, "walflow.heartbeat", b"{}")):
        decoder.feed(message)
    decoder.feed(xlog(ref.Message(None, False, 1200, "walflow.heartbeat", b"[]")))  # anyone may write one
    decoder.feed(xlog(ref.Message(None, False, 1200, "other", b"x")))
    decoder.feed(xlog(ref.Message(None, False, 1200, "p" * 100, b"x")))  # longer than any prefix walflow owns
    decoder.feed(xlog(ref.Message(None, False, 1200, "walflow.heartbeatX", b"x")))
    assert seen == [("walflow.heartbeat", b"{}"), ("walflow.heartbeat", b"[]")] and ignored == []
    assert decoder.take()[0] == [1100]


def test_a_message_over_its_prefixs_limit_is_ignored_without_being_copied() -> None:
    seen: list[tuple[str, bytes]] = []
    ignored: list[tuple[str, str]] = []
    decoder = Decoder(FakeCatalog(), ResumePoint(), lambda prefix, content: seen.append((prefix, content)),
                      frozenset({"walflow.backfill"}), lambda prefix, reason, _: ignored.append((prefix, reason)))
    insert = ref.Insert(None, 16400, text("1", "a"))
    decoder.feed(xlog(ORDERS))
    for message in transaction(1000, 1100,
                               ref.Message(None, True, 1000, "walflow.heartbeat", b"x" * 1025),
                               ref.Message(None, True, 1000, "walflow.backfill", b"x" * (64 * 1024 + 1)),
                               ref.Message(None, True, 1000, "sequin:transaction_annotations.set", b"1" * 70_000),
                               insert):
        decoder.feed(memoryview(message))  # as the session hands them over
    items = decoder.take()[0]
    assert seen == [] and [c.annotations for c in changes(items)] == [None]
    assert ignored == [("walflow.heartbeat", "too_large"), ("walflow.backfill", "too_large"),
                       ("sequin:transaction_annotations.set", "too_large")]
    assert [c.commit_idx for c in changes(items)] == [3]  # each message still takes its index


def test_signals_are_staged_with_their_size_and_only_from_transactions() -> None:
    ignored: list[tuple[str, str]] = []
    decoder = Decoder(FakeCatalog(), ResumePoint(), None, frozenset({"walflow.backfill"}),
                      lambda prefix, reason, _: ignored.append((prefix, reason)))
    for message in transaction(1000, 1100, ref.Message(None, True, 1000, "walflow.backfill", b"{" * 1000)):
        decoder.feed(message)
    decoder.feed(xlog(ref.Message(None, False, 1200, "walflow.backfill", b"{}")))
    items, sizes, total = decoder.take()
    assert [type(i).__name__ for i in items] == ["Signal", "int"] and sizes[0] == change_memory(1000, 0)
    assert total == sizes[0] and ignored == [("walflow.backfill", "malformed")]


def test_a_name_that_is_not_utf8_is_read_with_its_bytes_escaped() -> None:
    """A database in another encoding sends its names as they are: reading goes on."""
    relation = encode(ORDERS).replace(b"orders", b"caf\xe9s")
    decoder = Decoder(FakeCatalog(), ResumePoint())
    decoder.feed(xlog(relation))
    for message in transaction(1000, 1100, ref.Insert(None, 16400, text("1", "a"))):
        decoder.feed(message)
    assert [c.table.name for c in changes(decoder.take()[0])] == ["caf\\xe9s"]


def test_commit_idx_counts_every_message_of_the_transaction_as_sequin_does() -> None:
    """Insert, Update, Delete, Truncate and transactional messages each take an index
    (Sequin's slot_producer.ex); Relation, Type and Origin do not."""
    insert = ref.Insert(None, 16400, text("1", "a"))
    _, items = run([xlog(ORDERS), *transaction(
        1000, 1100,
        insert,
        ref.Message(None, True, 1000, "someone.else", b"x"),
        ref.Relation(None, 16400, "public", "orders", "d", ORDERS.columns),
        insert,
        ref.Truncate(None, (16400,), False, False),
        ref.Origin(5, "upstream"),
        insert,
    )])
    assert [(c.action, c.commit_idx) for c in changes(items)] == [("insert", 0), ("insert", 2), ("truncate", 3),
                                                                  ("insert", 4)]


def test_transaction_annotations_apply_to_the_changes_after_them_until_cleared() -> None:
    insert = ref.Insert(None, 16400, text("1", "a"))
    set_ = "sequin:transaction_annotations.set"
    _, items = run([xlog(ORDERS), *transaction(
        1000, 1100,
        insert,
        ref.Message(None, True, 1000, set_, b'{"by": "ops"}'),
        insert,
        ref.Message(None, True, 1000, "sequin:transaction_annotations.clear", b""),
        insert,
    ), *transaction(2000, 2100, ref.Message(None, True, 2000, set_, b'{"n": 2}'), insert),
        *transaction(3000, 3100, insert)])
    assert [(c.commit_lsn, c.commit_idx, c.annotations) for c in changes(items)] == [
        (1000, 0, None), (1000, 2, b'{"by": "ops"}'), (1000, 4, None), (2000, 1, b'{"n": 2}'), (3000, 0, None)]


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([xlog(ref.StreamStart(7, True))], "Stream Start message: walflow did not ask for it"),
        ([xlog(ref.BeginPrepare(1, 2, 3, 4, "g"))], "Begin Prepare message: walflow did not ask for it"),
        ([xlog(b"Z")], "unknown pgoutput message type b'Z'"),
        ([b"x" + bytes(30)], "unexpected CopyData message"),
        ([xlog(ref.Insert(None, 16400, text("1", "a")))], "outside a transaction"),
        ([*transaction(1000, 1100, ref.Insert(None, 16400, text("1", "a")))], "before its Relation message"),
        ([xlog(ORDERS), *transaction(1000, 1100, ref.Insert(None, 16400, text("1")))], "a tuple of 1 columns"),
        ([xlog(ORDERS), *transaction(1000, 1100, ref.Insert(None, 16400, ref.TupleData(b"tb", (b"1", b"2"))))],
         "unexpected tuple data kind b'b'"),
        ([xlog(ref.Begin(1000, TS, 7)), xlog(ref.Begin(2000, TS, 8))], "inside transaction 7"),
        ([xlog(ref.Begin(1000, TS, 7)), xlog(ref.Commit(0, 999, 1100, TS))], "does not end the open transaction"),
        ([xlog(ORDERS)[:-3]], "malformed message"),
    ],
)
def test_what_was_not_asked_for_is_refused(messages: list[bytes], error: str) -> None:
    with pytest.raises(DecodeError, match=error.replace("(", r"\(").replace(")", r"\)")):
        run(messages)


@given(st.binary(max_size=80), st.sampled_from([b"", b"w", b"k"]), st.sampled_from(list(b"BCIUDRYOTMZS")))
def test_random_bytes_raise_decode_error_only(body: bytes, head: bytes, tag: int) -> None:
    decoder = Decoder(FakeCatalog(), ResumePoint())
    decoder.feed(xlog(ORDERS))
    data = head + body if head != b"w" else xlog(bytes([tag]) + body)
    try:
        decoder.feed(data)
    except DecodeError:
        pass


@pytest.mark.parametrize(
    ("values", "text_bytes"),
    [(7, 32), (7, 1500), (100, 0), (200, 0)],  # Sequin's row, its 1.6 KB variant, many small columns
)
def test_memory_estimate_covers_what_a_decoded_row_holds(values: int, text_bytes: int) -> None:
    """The buffer and the epoch budget bound memory only if the estimate is not below it."""
    import tracemalloc
    from decimal import Decimal

    names = [f"c{c}" for c in range(values - 1)]  # the table's column names, shared by every row

    def row(i: int) -> dict[str, Any]:
        out: dict[str, Any] = {name: Decimal(i * 1000 + c).scaleb(-2) for c, name in enumerate(names)}
        out["text"] = f"{i:032x}" * (text_bytes // 32)
        return out

    tracemalloc.start()
    rows = [row(i) for i in range(2000)]
    held = tracemalloc.get_traced_memory()[0] / len(rows)
    tracemalloc.stop()
    wal_bytes = 25 + 8 + values * 5 + text_bytes + (values - 1) * 12  # XLogData + row header + values as text
    assert change_memory(wal_bytes, values) >= held, (change_memory(wal_bytes, values), held, rows[:0])




# -- the size limit: a row message over max_change (core/sizes.py) ---------------------------------------------

#: orders with a third column: the key, and two values to choose from.
NOTES = ref.Relation(None, 16402, "public", "notes", "d",
                     (ref.Column(1, "id", 25, -1), ref.Column(0, "a", 25, -1), ref.Column(0, "b", 25, -1)))


def sized(limit: int, *messages: bytes) -> tuple[Decoder, list[Item], list[int], list[tuple[int, str, int]]]:
    """``messages`` (after NOTES) fed as psycopg hands them over (memoryviews), with ``max_change``
    ``limit``: the decoder, what it staged with their sizes, and what it reported as oversized."""
    reported: list[tuple[int, str, int]] = []
    decoder = Decoder(FakeCatalog(), ResumePoint(), max_change=limit,
                      on_oversized=lambda change, column, size: reported.append((change.commit_idx, column, size)))
    for message in (xlog(NOTES), *messages):
        decoder.feed(memoryview(message))
    items, sizes, _ = decoder.take()
    return decoder, items, sizes, reported


def notes_insert(key: str, a: str, b: str) -> bytes:
    return transaction(1000, 1100, ref.Insert(None, 16402, text(key, a, b)))[1]


def test_a_row_message_exactly_at_max_change_is_staged_whole() -> None:
    message = notes_insert("1", "x" * 300, "y" * 200)
    _, items, sizes, reported = sized(len(message), *transaction(1000, 1100)[:1], message)
    (change,) = changes(items)
    assert change.new == (b"1", b"x" * 300, b"y" * 200) and reported == []
    assert sizes[0] == change_memory(len(message), 3)


def test_a_row_message_past_max_change_loses_its_largest_values_until_it_fits() -> None:
    message = notes_insert("1", "x" * 300, "y" * 200)
    begin, commit = transaction(1000, 1100)
    decoder, items, sizes, reported = sized(len(message) - 1, begin, message, commit)
    (change,) = changes(items)
    assert change.new == (b"1", OversizedValue.of(b"x" * 300), b"y" * 200)  # one byte over: the largest goes
    assert not any(isinstance(value, memoryview) for value in change.new)  # what it kept is its own bytes
    assert reported == [(0, "a", 300)]
    assert sizes[0] == change_memory(len(message) - 300, 3)  # counted at the size it keeps
    assert decoder.staged_size == 0 and decoder.resume_point() == ResumePoint(1100)
    _, items, _, reported = sized(len(message) - 301, begin, message, commit)  # past what one value covers
    assert changes(items)[0].new == (b"1", OversizedValue.of(b"x" * 300), OversizedValue.of(b"y" * 200))
    assert reported == [(0, "a", 300), (0, "b", 200)]


def test_the_key_is_never_replaced_and_both_rows_are_weighed() -> None:
    update = ref.Update(None, 16402, "O", text("k" * 900, "old" * 100, None), text("k" * 900, "n", "new" * 50))
    message = transaction(1000, 1100, update)[1]
    _, items, _, reported = sized(100, *transaction(1000, 1100, update)[:1], message)
    (change,) = changes(items)
    assert change.old == (b"k" * 900, OversizedValue.of(b"old" * 100), None)
    assert change.new == (b"k" * 900, b"n", OversizedValue.of(b"new" * 50))  # "n": a marker is no shorter
    assert [column for _, column, _ in reported] == ["a", "b"]  # largest first: 300, then 150
    assert OversizedValue.of(b"k" * 900) not in change.new


def test_an_oversized_row_a_previous_run_emitted_is_skipped_as_any_other() -> None:
    message = notes_insert("1", "x" * 300, "y")
    reported: list[str] = []
    decoder = Decoder(FakeCatalog(), ResumePoint(900, 1000, 0), max_change=100,
                      on_oversized=lambda change, column, size: reported.append(column))
    for data in (xlog(NOTES), xlog(ref.Begin(1000, TS, 7)), message):
        decoder.feed(memoryview(data))
    assert changes(decoder.take()[0]) == [] and reported == []


#: A 20 MB text, fed as psycopg hands a message over.
BIG = "x" * 20_000_000


def feed_big(max_change: int) -> tuple[RawChange, int, list[int]]:
    """A notes insert of ``BIG`` decoded with ``max_change``: its change, the memory decoding it
    took at the peak (tracemalloc), and the staged sizes."""
    import tracemalloc

    decoder = Decoder(FakeCatalog(), ResumePoint(), max_change=max_change)
    for data in (xlog(NOTES), xlog(ref.Begin(1000, TS, 7))):
        decoder.feed(data)
    message = memoryview(notes_insert("1", BIG, "small"))
    tracemalloc.start()
    decoder.feed(message)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    (change,) = changes(decoder.staged)
    return change, peak, decoder.staged_sizes


def test_an_oversized_value_is_never_copied() -> None:
    """What makes the limit worth having: a value over it costs the reader nothing beyond the
    message libpq already holds (before, the message was copied once and the value once more)."""
    change, peak, _ = feed_big(1_000_000)
    assert change.new == (b"1", OversizedValue.of(BIG.encode()), b"small")
    assert peak < 100_000, peak


def test_a_long_row_under_max_change_is_copied_once() -> None:
    """Past VIEW_ABOVE a row is decoded on views of the message: each value is copied once, not the
    whole message first and the value again."""
    change, peak, sizes = feed_big(100_000_000)
    assert change.new == (b"1", BIG.encode(), b"small") and type(change.new[1]) is bytes
    assert peak < 21_000_000, peak  # the value once (before: the message, then the value: 40 MB)
    assert sizes == [change_memory(len(notes_insert("1", BIG, "small")), 3)]


def test_a_malformed_oversized_row_is_refused_as_any_other() -> None:
    message = notes_insert("1", "x" * 300, "y")
    with pytest.raises(DecodeError, match="runs past the end"):
        sized(100, xlog(ref.Begin(1000, TS, 7)), message[:-1])


# -- against the reference decoder, on real WAL --------------------------------------------------------------

WORKLOAD = [
    """CREATE TABLE mixed (id int PRIMARY KEY, s text, n numeric, ts timestamptz, j jsonb, d date, b bytea,
       a int[], big text, plain timestamp DEFAULT '2024-01-02 03:04:05.678901')""",
    "ALTER TABLE mixed ALTER big SET STORAGE EXTERNAL",
    "CREATE TABLE full_identity (k text PRIMARY KEY, v int)",
    "ALTER TABLE full_identity REPLICA IDENTITY FULL",
    "CREATE TABLE keyless (v int)",
    "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
    "CREATE TYPE mood AS ENUM ('ok', 'sad')",
    "CREATE TABLE custom (id posint PRIMARY KEY, m mood, ms mood[])",
    "CREATE PUBLICATION {publication} FOR ALL TABLES",
    "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')",
    """INSERT INTO mixed (id, s, n, ts, j, d, b, a) VALUES
       (1, 'héllo', 1.5, '2024-05-06 07:08:09.123456+02', '{"a": [1, 2.5, null], "n": 123456789012345678901234}',
        '2024-02-29', '\\xdeadbeef', '{1,NULL,3}'),
       (2, NULL, 'NaN', 'infinity', '"x"', 'infinity', '', '{}'),
       (3, '', -0.000001, '0044-03-15 12:00 BC', 'null', '0044-03-15 BC', NULL, NULL)""",
    "INSERT INTO mixed (id, big) VALUES (4, repeat(md5('x'), 40000))",
    "UPDATE mixed SET s = 'changed', n = n + 1 WHERE id <= 4",  # the TOASTed column unchanged
    "UPDATE mixed SET id = 10 WHERE id = 1",  # a key change: K old tuple
    "DELETE FROM mixed WHERE id = 2",
    "INSERT INTO full_identity VALUES ('a', 1), ('b', 2)",
    "UPDATE full_identity SET v = v * 10",
    "DELETE FROM full_identity WHERE k = 'a'",
    "INSERT INTO keyless VALUES (1), (2)",
    "INSERT INTO custom VALUES (1, 'ok', '{ok,sad}')",
    "ALTER TABLE mixed ADD COLUMN extra int DEFAULT 7",  # a new Relation message mid-stream
    "INSERT INTO mixed (id) VALUES (20)",
    "SELECT pg_logical_emit_message(true, 'walflow.heartbeat', 'not json')",
    "SELECT pg_logical_emit_message(false, 'other', 'outside')",
    "BEGIN; INSERT INTO keyless VALUES (3); TRUNCATE keyless, full_identity; INSERT INTO mixed (id) VALUES (21); COMMIT",
    "BEGIN; INSERT INTO mixed (id) SELECT g FROM generate_series(100, 140) g; DELETE FROM mixed WHERE id > 130; COMMIT",
]


@dataclass
class Captured:
    """A workload's XLogData messages as the walsender would send them, and a catalog for them."""

    messages: list[bytes]
    commits: list[tuple[int, int]]  # (commit LSN, end LSN) of each transaction
    catalog: Catalog


@pytest.fixture(scope="module")
def captured(pg_server: Any) -> Iterator[Captured]:
    if not pg_server.running:
        pg_server.start()
    names = TestNames.for_test("decoder_against_reference")
    db = Database(pg_server, names)
    db.create()
    try:
        with db.connect() as conn:
            for statement in WORKLOAD:
                conn.execute(statement.replace("{slot}", names.slot).replace("{publication}", names.publication))
            messages = slot_messages(conn, names.slot, names.publication)
        commits = [struct.unpack_from("!xxQQ", m, 25) for m in messages if m[25:26] == b"C"]
        with psycopg.connect(conninfo(db.config(create=False), application_name="test"), autocommit=True) as meta:
            yield Captured(messages, [(c, e) for c, e in commits], Catalog(meta))
    finally:
        db.drop()


def _raw(data: ref.TupleData, ncols: int) -> RawRow:
    if len(data.values) != ncols:
        raise ValueError("column count")
    out: list[RawValue] = []
    for kind, value in zip(data.kinds, data.values, strict=True):
        if kind == ord("b"):
            raise ValueError("binary value")
        out.append(UNCHANGED_TOAST if kind == ord("u") else value)
    return tuple(out)


def _name(text: str) -> str:
    """A name as walflow reads it: bytes that are not UTF-8 as ``\\xNN``."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _passed_over(data: bytes, in_transaction: bool) -> bool:
    """A logical message that is not walflow's (by the first 64 bytes of its prefix): walflow
    does not read past its flags (``connectors/postgres/messages.py``); bad flags are refused."""
    flags = data[26]
    if len(data) < 35 or flags & ~1 or (flags and not in_transaction):
        raise ValueError("flags")
    head = data[35:99]
    end = head.find(0)
    return end < 0 or head[:end] not in OWNED


def oracle(catalog: Catalog, messages: list[bytes], resume: ResumePoint) -> tuple[list[Item], int] | str:
    """What the decoder should stage, from the reference decoder and a plain model of transactions."""
    decoder = ref.Decoder()
    tables: dict[int, Table] = {}
    out: list[Item] = []
    size = 0
    marked = resume.lsn
    txn: tuple[int, datetime, int] | None = None
    idx = emitted = 0
    annotations: bytes | None = None

    def mark(lsn: int) -> None:
        nonlocal marked
        if lsn > marked:
            marked = lsn
            if out and isinstance(out[-1], int):
                out[-1] = lsn
            else:
                out.append(lsn)

    try:
        for data in messages:
            if data[:1] == b"k":
                (wal_end,) = struct.unpack_from("!Q", data, 1)
                if txn is None:
                    mark(wal_end)
                continue
            if data[25:26] == b"M" and _passed_over(data, txn is not None):
                idx += data[26] & 1  # someone else's message: only its place in the transaction counts
                continue
            msg = decoder.decode(data[25:])
            if isinstance(msg, ref.Begin):
                assert txn is None
                txn = (msg.final_lsn, pg_timestamp(msg.commit_ts), msg.xid)
                idx, emitted, annotations = 0, resume.emitted_up_to(msg.final_lsn), None
            elif isinstance(msg, ref.Commit):
                assert txn is not None and msg.flags == 0 and msg.commit_lsn == txn[0]
                txn = None
                if emitted < WHOLE_TRANSACTION:
                    mark(msg.end_lsn)
            elif isinstance(msg, ref.Relation):
                assert all(c.flags in (0, 1) for c in msg.columns)  # proto 1: only "part of the key"
                tables[msg.relid] = catalog.describe(relations.Relation(
                    msg.relid, _name(msg.namespace), _name(msg.name), msg.replica_identity,
                    tuple(relations.Column(_name(c.name), c.type_oid, c.typmod, c.is_key) for c in msg.columns)))
            elif isinstance(msg, ref.Type):
                catalog.type_seen(relations.TypeName(msg.oid, _name(msg.namespace), _name(msg.name)))
            elif isinstance(msg, ref.Insert | ref.Update | ref.Delete | ref.Truncate):
                assert txn is not None
                relids = msg.relids if isinstance(msg, ref.Truncate) else (msg.relid,)
                for relid in relids:
                    table = tables[relid]
                    ncols = len(table.columns)
                    new = None if isinstance(msg, ref.Delete | ref.Truncate) else _raw(msg.new, ncols)
                    old_data = None if isinstance(msg, ref.Insert | ref.Truncate) else msg.old
                    old = None if old_data is None else _raw(old_data, ncols)
                    old_is_key = not isinstance(msg, ref.Insert | ref.Truncate) and msg.old_kind == "K"
                    action = {ref.Insert: "insert", ref.Update: "update", ref.Delete: "delete",
                              ref.Truncate: "truncate"}[type(msg)]
                    if idx > emitted:
                        out.append(RawChange(action, table, new, old, old_is_key, txn[0], idx, txn[1], txn[2],  # type: ignore[arg-type]
                                             None, annotations))
                        values = (0 if new is None else ncols) + (0 if old is None else ncols)
                        size += change_memory(len(data), values)
                idx += 1  # one index per message, as Sequin counts commit_idx
            elif isinstance(msg, ref.Message):
                assert not msg.transactional or txn is not None
                if msg.transactional:
                    idx += 1
                    if msg.prefix == "sequin:transaction_annotations.set":
                        annotations = msg.content
                    elif msg.prefix == "sequin:transaction_annotations.clear":
                        annotations = None
            elif isinstance(msg, ref.Origin):
                assert txn is not None
            else:
                raise TypeError(f"not asked for: {msg}")
    except (ref.DecodeError, ValueError, TypeError, KeyError, AssertionError, IndexError, struct.error, UnicodeDecodeError,
            OverflowError):  # OverflowError: a commit time no datetime holds
        return "refused"
    return out, size


def decoded(catalog: Catalog, messages: list[bytes], resume: ResumePoint) -> tuple[list[Item], int] | str:
    decoder = Decoder(catalog, resume)
    try:
        for data in messages:
            decoder.feed(memoryview(bytearray(data)))
    except DecodeError:
        return "refused"
    items, _, size = decoder.take()
    return items, size


def assert_same(mine: tuple[list[Item], int] | str, expected: tuple[list[Item], int] | str) -> None:
    if isinstance(mine, str) or isinstance(expected, str):
        assert mine == expected
        return
    (mine_items, mine_size), (items, size) = mine, expected
    assert mine_size == size and len(mine_items) == len(items)
    for a, b in zip(mine_items, items, strict=True):
        if isinstance(a, RawChange) and isinstance(b, RawChange):
            assert a.table.qualified == b.table.qualified and a.table.columns == b.table.columns
            assert a._replace(table=None) == b._replace(table=None)  # type: ignore[arg-type]
            assert a.commit_ts.tzinfo is b.commit_ts.tzinfo
        else:
            assert a == b


def test_the_workload_has_every_message_the_session_asks_for(captured: Captured) -> None:
    assert {m[25:26] for m in captured.messages} == {b"B", b"C", b"R", b"Y", b"I", b"U", b"D", b"T", b"M"}
    result = decoded(captured.catalog, captured.messages, ResumePoint())
    assert not isinstance(result, str)
    found = changes(result[0])
    actions = {(c.table.name, c.action, c.old is not None, c.old_is_key) for c in found}
    assert {("mixed", "insert", False, False), ("mixed", "update", False, False), ("mixed", "update", True, True),
            ("mixed", "delete", True, True), ("full_identity", "update", True, False),
            ("full_identity", "delete", True, False), ("keyless", "insert", False, False),
            ("keyless", "truncate", False, False), ("custom", "insert", False, False)} <= actions
    toasted = next(c for c in found if c.action == "update" and c.new is not None and c.new[0] == b"4")
    assert toasted.new is not None and toasted.new[8] is UNCHANGED_TOAST
    assert next(c for c in found if c.table.name == "full_identity").table.key_columns == ("k",)


def test_decoder_equals_the_reference(captured: Captured) -> None:
    assert_same(decoded(captured.catalog, captured.messages, ResumePoint()),
                oracle(captured.catalog, captured.messages, ResumePoint()))


def test_decoder_equals_the_reference_when_resuming(captured: Captured) -> None:
    """Resumed at every other transaction boundary, and inside the big last transaction."""
    ends = [end for _, end in captured.commits]
    last_commit = captured.commits[-1][0]
    resumes = [ResumePoint(end) for end in ends[::2]] + [
        ResumePoint(ends[-2], last_commit, idx) for idx in (0, 5, 40, 10**6)
    ]
    for resume in resumes:
        assert_same(decoded(captured.catalog, captured.messages, resume),
                    oracle(captured.catalog, captured.messages, resume))


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.data())
def test_decoder_equals_the_reference_on_mutated_messages(captured: Captured, data: st.DataObject) -> None:
    """A changed, cut or lengthened message: the same changes, or both refuse it."""
    messages = list(captured.messages)
    at = data.draw(st.integers(0, len(messages) - 1))
    message = bytearray(messages[at])
    edit = data.draw(st.sampled_from(["byte", "cut", "extend"]))
    if edit == "byte":
        position = data.draw(st.integers(25, len(message) - 1))
        message[position] = data.draw(st.integers(0, 255))
    elif edit == "cut":
        del message[data.draw(st.integers(25, len(message) - 1)):]
    else:
        message += data.draw(st.binary(min_size=1, max_size=6))
    messages[at] = bytes(message)
    assert_same(decoded(captured.catalog, messages, ResumePoint()), oracle(captured.catalog, messages, ResumePoint()))
