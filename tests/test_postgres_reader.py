"""The reader's short paths give exactly what the full ones give.

The reader decodes Begin, Insert/Update/Delete and Commit without pgoutput's decoder and
converts rows straight from the bytes (``connectors/postgres/reader.py``); json goes through
orjson, commit times through psycopg's binary timestamptz loader (or a float), changes are
built without the frozen dataclass's ``__init__``, and a burst's changes enter the buffer
together. Each of these is checked here against the plain way it replaced: real messages from
PostgreSQL, mutated ones, and random values.
"""

from __future__ import annotations

import json
import math
import pickle
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config.schema import ReplicationSettings
from connectors.postgres.buffer import ChangeBuffer, Item
from connectors.postgres.changes import Change
from connectors.postgres.connection import conninfo
from connectors.postgres.protocol import PG_EPOCH, pg_timestamp
from connectors.postgres.reader import ResumePoint, SlotReader
from connectors.postgres.values import TypeResolver, _commit_time, json_loads
from tests.harness import Database, TestNames

# -- json --------------------------------------------------------------------------------------------------


def same(a: object, b: object) -> bool:
    """Equal, of the same types all the way down, floats bit for bit (NaN included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        assert isinstance(b, float)
        return struct.pack("!d", a) == struct.pack("!d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, Decimal):
        assert isinstance(b, Decimal)
        return str(a) == str(b)
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def outcome(loads: Callable[[bytes], Any], data: bytes) -> tuple[str, Any]:
    try:
        return "value", loads(data)
    except (ValueError, RecursionError) as exc:
        return "error", type(exc)


def assert_like_json_loads(data: bytes) -> None:
    expected, got = outcome(json.loads, data), outcome(json_loads, data)
    assert expected[0] == got[0] and same(expected[1], got[1]), (data, expected, got)


JSON_EDGES = [
    b"12345678901234567890", b"123456789012345678901234567890", b"-9223372036854775809", b"18446744073709551616",
    b"18446744073709551615", b"-0", b"-0.0", b'{"a":1,"a":2}', b"1E400", b"1e-400", b"0.1", b"1e2", b"1.0",
    b'"\\ud800"', b'"\\u0000"', b'"\\ud83d\\ude00"', b"[" * 2000 + b"]" * 2000, b' {"x" : [1, 2.5, null, true]} ',
    b"NaN", b"Infinity", b"-Infinity", b"1.7976931348623157e308", b"5e-324", b"9007199254740993", b"1" + b"0" * 400,
    b'"\xff"', b"\xef\xbb\xbf{}", b'{"a": 1}\n', b"[1,]", b"", b'{"n": 12345678901234567890}', b'"1234567890123456789"',
    b'{"big": -123456789012345678901234567890.5e3}', b"[1e23, 8.98846567431158e307, 2.2250738585072011e-308]",
]


@pytest.mark.parametrize("data", JSON_EDGES)
def test_json_loads_edges(data: bytes) -> None:
    assert_like_json_loads(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_json_loads_on_documents(value: object) -> None:
    assert_like_json_loads(json.dumps(value).encode())
    assert_like_json_loads(json.dumps(value, ensure_ascii=False).encode())


@given(json_values, st.lists(st.tuples(st.integers(0, 200), st.sampled_from(b'{}[]",:0123456789.eE+-\\ nul\xc3')),
                              max_size=3))
def test_json_loads_on_mutated_documents(value: object, edits: list[tuple[int, int]]) -> None:
    data = bytearray(json.dumps(value).encode())
    for at, byte in edits:
        data[min(at, len(data)):min(at, len(data))] = bytes([byte])
    assert_like_json_loads(bytes(data))


# -- commit timestamps, changes ----------------------------------------------------------------------------

_MICROSECOND = timedelta(microseconds=1)
_FIRST_US = (datetime(1, 1, 1, tzinfo=UTC) - PG_EPOCH) // _MICROSECOND
_LAST_US = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) - PG_EPOCH) // _MICROSECOND


@given(st.integers(_FIRST_US - 10**12, _LAST_US + 10**12) | st.integers(-(2**63), 2**63 - 1)
       | st.integers(7 * 10**14, 9 * 10**14))
def test_pg_timestamp_is_the_exact_sum(us: int) -> None:
    try:
        expected = PG_EPOCH + timedelta(microseconds=us)
    except OverflowError:
        with pytest.raises(OverflowError):
            pg_timestamp(us)
        return
    got = pg_timestamp(us)
    assert got == expected and got.tzinfo is UTC


def test_pg_timestamp_at_the_ends_of_the_range() -> None:
    for us in (_FIRST_US, _LAST_US, 0, -1, 1):
        assert pg_timestamp(us) == PG_EPOCH + timedelta(microseconds=us)
    for us in (_FIRST_US - 1, _LAST_US + 1):
        with pytest.raises(OverflowError):
            pg_timestamp(us)


@pytest.mark.parametrize(
    ("values", "text_bytes"),
    [(7, 32), (7, 1500), (100, 0), (200, 0)],  # Sequin's row, its 1.6 KB variant, many small columns
)
def test_memory_estimate_covers_what_a_decoded_row_holds(values: int, text_bytes: int) -> None:
    """The buffer and the epoch budget bound memory only if the estimate is not below it."""
    import tracemalloc
    from decimal import Decimal

    from connectors.postgres.reader import change_memory

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


def test_a_change_pickles_and_is_immutable() -> None:
    ts = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    change = Change("update", "s", "t", ("id",), {"id": 1}, {"id": 0}, 77, 3, ts, 9)
    assert pickle.loads(pickle.dumps(change)) == change
    with pytest.raises(AttributeError):
        change.action = "insert"  # type: ignore[misc]


# -- the buffer --------------------------------------------------------------------------------------------


@dataclass
class ModelBuffer:
    """The buffer as it was: one (item, size) per put or mark, markers collapsing."""

    max_bytes: int
    items: list[tuple[Item, int]] = field(default_factory=list)
    bytes: int = 0
    high_water: int = 0
    wakeups: int = 0

    def put(self, item: Item, size: int) -> None:
        if type(item) is int and self.items and type(self.items[-1][0]) is int:
            self.items[-1] = (item, 0)
        else:
            self.items.append((item, size))
        self.bytes += size
        self.high_water = max(self.high_water, self.bytes)

    def take(self, max_items: int, finish_within: int) -> tuple[list[Item], int]:
        was_full = self.bytes >= self.max_bytes
        out: list[Item] = []
        taken = 0
        while self.items and (len(out) < max_items or (len(out) < max_items + finish_within
                                                        and type(out[-1]) is not int)):
            item, size = self.items.pop(0)
            out.append(item)
            taken += size
        self.bytes -= taken
        if was_full and self.bytes < self.max_bytes:
            self.wakeups += 1
        return out, taken


operations = st.lists(
    st.one_of(
        st.tuples(st.just("burst"), st.lists(st.one_of(st.none(), st.integers(1, 40)), max_size=8)),
        st.tuples(st.just("mark"), st.just([])),
        st.tuples(st.just("put"), st.just([st.integers(1, 40)])),
        st.tuples(st.just("take"), st.lists(st.integers(0, 6), min_size=2, max_size=2)),
    ),
    max_size=40,
)


@given(st.sampled_from([10, 60, 1000]), operations)
def test_buffer_bursts_behave_like_single_puts(max_bytes: int, ops: list[tuple[str, list[Any]]]) -> None:
    wakeups = [0]
    buffer = ChangeBuffer(max_bytes, on_room=lambda: wakeups.__setitem__(0, wakeups[0] + 1))
    model = ModelBuffer(max_bytes)
    lsn = count = 0
    for op, args in ops:
        if op == "burst":  # None: a marker, n: a change of n bytes; staged as the reader stages them
            items: list[Item] = []
            sizes: list[int] = []
            for size in args:
                if size is None:
                    lsn += 1
                    model.put(lsn, 0)
                    if items and type(items[-1]) is int:
                        items[-1] = lsn
                    else:
                        items.append(lsn)
                        sizes.append(0)
                else:
                    count += 1
                    model.put(_change(count), size)
                    items.append(_change(count))
                    sizes.append(size)
            buffer.put_many(items, sizes, sum(sizes))
        elif op == "mark":
            lsn += 1
            model.put(lsn, 0)
            buffer.mark(lsn)
        elif op == "put":
            count += 1
            model.put(_change(count), 7)
            buffer.put(_change(count), 7)
        else:
            max_items, finish_within = args
            if max_items:
                assert buffer.take(max_items, finish_within) == model.take(max_items, finish_within)
        assert (buffer.size, buffer.full, buffer.high_water, wakeups[0]) == (
            model.bytes, model.bytes >= max_bytes, model.high_water, model.wakeups)
    assert buffer.take(10**6) == model.take(10**6, 0)


def _change(n: int) -> Change:
    return Change("insert", "s", "t", ("id",), {"id": n}, None, n, 0, PG_EPOCH, n)


# -- the short path against the decoder, on real messages ------------------------------------------------

_HEADER = struct.Struct("!cQQq")  # XLogData: 'w', dataStart, walEnd, sendTime

WORKLOAD = [
    """CREATE TABLE mixed (id int PRIMARY KEY, s text, n numeric, ts timestamptz, j jsonb, d date, b bytea,
       a int[], big text, plain timestamp DEFAULT '2024-01-02 03:04:05.678901')""",
    "ALTER TABLE mixed ALTER big SET STORAGE EXTERNAL",
    "CREATE TABLE full_identity (k text PRIMARY KEY, v int)",
    "ALTER TABLE full_identity REPLICA IDENTITY FULL",
    "CREATE TABLE keyless (v int)",
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
    "ALTER TABLE mixed ADD COLUMN extra int DEFAULT 7",  # a new Relation message mid-stream
    "INSERT INTO mixed (id) VALUES (20)",
    "SELECT pg_logical_emit_message(true, 'walflow.heartbeat', 'not json')",
    "BEGIN; INSERT INTO keyless VALUES (3); TRUNCATE keyless, full_identity; INSERT INTO mixed (id) VALUES (21); COMMIT",
    "BEGIN; INSERT INTO mixed (id) SELECT g FROM generate_series(100, 140) g; DELETE FROM mixed WHERE id > 130; COMMIT",
]


@dataclass
class Captured:
    """A workload's XLogData messages as the walsender would send them, and a connection for types."""

    messages: list[bytes]
    commits: list[tuple[int, int]]  # (commit LSN, end LSN) of each transaction
    resolver: TypeResolver
    database: Database


@pytest.fixture(scope="module")
def captured(pg_server: Any) -> Iterator[Captured]:
    if not pg_server.running:
        pg_server.start()
    names = TestNames.for_test("reader_short_path")
    db = Database(pg_server, names)
    db.create()
    try:
        with db.connect() as conn:
            for statement in WORKLOAD:
                conn.execute(statement.replace("{slot}", names.slot).replace("{publication}", names.publication))
            rows = conn.execute(
                "SELECT (lsn - '0/0')::bigint, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                "'proto_version', '1', 'publication_names', %s, 'messages', 'true')",
                [names.slot, names.publication],
            ).fetchall()
        messages = []
        for lsn, data in rows:
            assert isinstance(lsn, int) and isinstance(data, bytes)
            messages.append(_HEADER.pack(b"w", lsn, lsn, 0) + data)
        commits = [struct.unpack_from("!xxQQ", m, 25) for m in messages if m[25:26] == b"C"]
        with psycopg.connect(conninfo(db.config(create=False), application_name="test"), autocommit=True) as meta:
            yield Captured(messages, [(c, e) for c, e in commits], TypeResolver(meta), db)
    finally:
        db.drop()


class FakeStream:
    """What the reader's burst loop reads from: the messages, then 'nothing received yet'."""

    def __init__(self, messages: list[bytes]) -> None:
        self._messages = iter(messages)

    def get_copy_data(self, _async: int) -> tuple[int, memoryview | bytes]:
        data = next(self._messages, None)
        return (0, b"") if data is None else (len(data), memoryview(bytearray(data)))

    def consume(self) -> None:
        pass

    def send(self, data: bytes) -> None:
        pass


def _reader(db: Database, resume: ResumePoint) -> SlotReader:
    return SlotReader(db.config(create=False), ReplicationSettings(heartbeat_interval_ms=0), resume)


def run_short(
    cap: Captured, messages: list[bytes], resume: ResumePoint, decoded: list[bytes] | None = None
) -> tuple[list[Item], int] | str:
    """The buffer after the burst loop read ``messages``, or the error it raised; what it left
    to the full decoder is appended to ``decoded``."""
    reader = _reader(cap.database, resume)
    if decoded is not None:
        full_path = reader._decode

        def spy(data: memoryview, resolver: TypeResolver) -> None:
            decoded.append(bytes(data))
            full_path(data, resolver)

        reader._decode = spy  # type: ignore[method-assign]
    try:
        stream = FakeStream(messages)
        while reader._read_burst(stream, cap.resolver):  # type: ignore[arg-type]
            pass
        return reader.buffer.take(10**9)
    except Exception as exc:  # noqa: BLE001 - compared with the other path's
        return f"{type(exc).__name__}: {exc}"
    finally:
        reader.stop()


def run_full(cap: Captured, messages: list[bytes], resume: ResumePoint) -> tuple[list[Item], int] | str:
    """The buffer after pgoutput's decoder and the reader's message handler took ``messages`` one by one."""
    reader = _reader(cap.database, resume)
    try:
        for data in messages:
            reader._decode(memoryview(data), cap.resolver)
        reader._flush()
        return reader.buffer.take(10**9)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    finally:
        reader.stop()


def assert_same_outcome(short: tuple[list[Item], int] | str, full: tuple[list[Item], int] | str) -> None:
    if isinstance(full, str) or isinstance(short, str):
        assert short == full
        return
    (short_items, short_size), (full_items, full_size) = short, full
    assert short_size == full_size
    assert len(short_items) == len(full_items)
    for a, b in zip(short_items, full_items, strict=True):
        assert type(a) is type(b)
        if not isinstance(a, Change) or not isinstance(b, Change):
            assert a == b
            continue
        assert a._replace(new=None, old=None) == b._replace(new=None, old=None)
        assert type(a.commit_ts) is type(b.commit_ts) and a.commit_ts.tzinfo is b.commit_ts.tzinfo
        for mine, theirs in ((a.new, b.new), (a.old, b.old)):
            assert (mine is None) == (theirs is None)
            if mine is not None and theirs is not None:
                assert list(mine) == list(theirs)
                assert all(same(mine[k], theirs[k]) for k in mine), (mine, theirs)


def test_the_workload_has_what_the_short_path_handles(captured: Captured) -> None:
    decoded: list[bytes] = []
    short = run_short(captured, captured.messages, ResumePoint(), decoded)
    assert not isinstance(short, str), short
    # Begin, Commit and every row change took the short path; Relation, Message, Truncate did not
    assert {m[25:26] for m in decoded} == {b"R", b"M", b"T"}
    assert len(decoded) == sum(1 for m in captured.messages if m[25:26] in (b"R", b"M", b"T"))
    changes = [item for item in short[0] if isinstance(item, Change)]
    actions = {(c.table, c.action, c.old is not None) for c in changes}
    assert {("mixed", "insert", False), ("mixed", "update", False), ("mixed", "update", True),
            ("mixed", "delete", True), ("full_identity", "update", True), ("full_identity", "delete", True),
            ("keyless", "insert", False), ("keyless", "truncate", False)} <= actions
    moved = next(c for c in changes if c.action == "update" and c.table == "mixed" and c.old is not None)
    assert moved.old == {"id": 1} and moved.new is not None and moved.new["id"] == 10  # K tuple: the key only
    toasted = next(c for c in changes if c.action == "update" and c.new is not None and c.new["id"] == 4)
    assert repr(toasted.new and toasted.new["big"]) == "UNCHANGED_TOAST"


def test_short_path_equals_decoder_path(captured: Captured) -> None:
    assert_same_outcome(run_short(captured, captured.messages, ResumePoint()),
                        run_full(captured, captured.messages, ResumePoint()))


def test_short_path_equals_decoder_path_when_resuming(captured: Captured) -> None:
    """Resumed at every transaction boundary, and inside the big last transaction."""
    ends = [end for _, end in captured.commits]
    last_commit = captured.commits[-1][0]
    resumes = [ResumePoint(end) for end in ends[::2]] + [
        ResumePoint(ends[-2], last_commit, idx) for idx in (0, 5, 40, 10**6)
    ]
    for resume in resumes:
        assert_same_outcome(run_short(captured, captured.messages, resume),
                            run_full(captured, captured.messages, resume))


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.data())
def test_short_path_equals_decoder_path_on_mutated_messages(captured: Captured, data: st.DataObject) -> None:
    """A changed, cut or lengthened message: both paths give the same changes or the same error."""
    messages = list(captured.messages)
    # the messages the short path reads: Begin, row changes, Commit
    candidates = [i for i, m in enumerate(messages) if m[25:26] in (b"B", b"C", b"I", b"U", b"D")]
    at = data.draw(st.sampled_from(candidates))
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
    assert_same_outcome(run_short(captured, messages, ResumePoint()), run_full(captured, messages, ResumePoint()))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(us=st.integers(_FIRST_US - 10**12, _LAST_US + 10**12) | st.integers(-(2**63), 2**63 - 1)
       | st.sampled_from([_FIRST_US, _LAST_US, _FIRST_US - 1, _LAST_US + 1, 0, -1]))
def test_commit_times_through_psycopg_are_pg_timestamp(captured: Captured, us: int) -> None:
    raw = struct.pack("!q", us)
    for load in (captured.resolver.commit_times(), _commit_time):
        try:
            expected = pg_timestamp(us)
        except OverflowError:
            with pytest.raises(psycopg.DataError):
                load(raw)
            continue
        got = load(raw)
        assert got == expected and got.tzinfo is expected.tzinfo
    assert captured.resolver.commit_times() is not _commit_time  # psycopg's loader: TimeZone is UTC
