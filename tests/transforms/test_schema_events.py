"""Schema events without servers: the shape comparison (a new version is not a new shape), what
dispatch sends each partition, the event's payload and id, the stream check that keeps a late
partition from storing a second copy, and the baselines a restart compares against."""

from __future__ import annotations

import json
import pickle
from base64 import b64decode
from typing import Any

import pytest

from connectors.postgres.types import TypeSpecs, loaders_for
from core.events import BARRIER, TRANSACTION_END, ColumnShape, Commit, RawChange, ReadOf, SchemaChange, Shape, Table
from core.ids import IdScheme
from core.subjects import covers, schema_pattern, schema_subject
from core.wire import DESCRIBE, SCHEMA, Crossing, opened
from tests.transforms.samples import ROOM, TS, TS_US, make_database, make_sink
from transforms.dispatch import Dispatch
from transforms.render import Render
from transforms.schema_events import (
    RECENT_CHANGES,
    SchemaEvents,
    SchemaTracker,
    baselines,
    last_changes,
    payload,
    shape_json,
    shape_of,
    what_changed,
)
from transforms.shape import Shaping

INT4, INT8, TEXT, VARCHAR = 23, 20, 25, 1043
SINK = make_sink(schema_events=True, partition_count=3, destination={"type": "nats", "host": "nats",
                                                                       "subject_prefix": "wf"})


def version(columns: tuple[tuple[str, str, int], ...] = (("id", "integer", INT4), ("note", "text", TEXT)),
            key: tuple[str, ...] = ("id",), identity: str = "default", name: str = "orders", relid: int = 1) -> Table:
    """A table version as the catalog describes one: every call a new version (a new uid)."""
    types = TypeSpecs(tuple(oid for _, _, oid in columns), ())
    return Table("public", name, tuple(c for c, _, _ in columns), key, key, loaders_for(types), "app", relid,
                 loaders_for, types, type_names=tuple(t for _, t, _ in columns), replica_identity=identity)


def change(table: Table, lsn: int, idx: int = 0, row: int = 1, read: ReadOf | None = None) -> RawChange:
    new = tuple(str(row).encode() if c == "id" else b"x" for c in table.columns)
    return RawChange("insert" if read is None else "read", table, new, None, False, lsn, idx, TS, 9, read)


class Memory:
    """The sink's KV memory as the tracker sees it: what it was asked to remember."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}

    def __call__(self, table: str, record: dict[str, Any]) -> None:
        self.records[table] = json.loads(json.dumps(record))  # as it comes back from the bucket


def dispatch_with(memory: Memory, recorded: list[dict[str, Any]] | None = None, confirmed: int = 0,
                  sink: Any = SINK) -> Dispatch:
    return Dispatch(sink, schema=SchemaTracker(baselines(recorded or [], confirmed), memory))


def schema_items(routed: list[tuple[str, Crossing]]) -> list[tuple[str, SchemaChange]]:
    return [(key, item[1]) for key, items in routed for item in opened(items) if item[0] == SCHEMA]  # type: ignore[misc]


# -- the shape comparison ------------------------------------------------------------------------


def test_a_shape_is_the_columns_types_keys_and_replica_identity() -> None:
    table = version((("id", "integer", INT4), ("code", "character varying(20)", VARCHAR)), key=("id",),
                    identity="full")
    assert shape_of(table) == Shape((ColumnShape("id", "integer", True), ColumnShape("code", "character varying(20)",
                                                                                      False)), "full")
    assert shape_of(version()) == shape_of(version())  # two versions, one shape


@pytest.mark.parametrize(("after", "words"), [
    (version((("id", "integer", INT4), ("note", "text", TEXT), ("extra", "integer", INT4))), "+extra"),
    (version((("id", "integer", INT4),)), "-note"),
    (version((("id", "bigint", INT8), ("note", "text", TEXT))), "id integer → bigint"),
    (version(identity="full"), "replica identity default → full"),
    (version(key=("id", "note")), "note now a key column"),
    (version((("note", "text", TEXT), ("id", "integer", INT4))), "column order"),
], ids=["add column", "drop column", "alter type", "replica identity", "key", "order"])
def test_every_kind_of_change_is_a_new_shape(after: Table, words: str) -> None:
    before = shape_of(version())
    assert shape_of(after) != before
    assert what_changed(before, shape_of(after)) == words


def test_a_type_modifier_is_part_of_the_type() -> None:
    narrow = version((("id", "integer", INT4), ("code", "character varying(20)", VARCHAR)))
    wide = version((("id", "integer", INT4), ("code", "character varying(50)", VARCHAR)))
    assert shape_of(narrow) != shape_of(wide)


# -- the tracker and dispatch --------------------------------------------------------------------


def test_the_first_sight_of_a_table_records_its_shape_and_publishes_nothing() -> None:
    memory = Memory()
    routed = dispatch_with(memory).route([change(version(), 100, i, row=i) for i in range(6)])
    assert schema_items(routed) == []
    assert memory.records == {"public.orders": {"schema": "public", "table": "orders", "changes": [],
                                                "shape": shape_json(shape_of(version()))}}


def test_a_new_version_of_the_same_shape_publishes_nothing() -> None:
    """A reconnect or a relcache invalidation: a new Relation message, the same table."""
    memory = Memory()
    dispatch = dispatch_with(memory)
    dispatch.route([change(version(), 100, i, row=i) for i in range(6)])
    recorded = dict(memory.records)
    routed = dispatch.route([change(version(), 200, i, row=i) for i in range(6)])
    assert schema_items(routed) == []
    assert memory.records == recorded


def test_a_new_shape_reaches_every_partition_after_its_description_and_before_its_first_change() -> None:
    memory = Memory()
    dispatch = dispatch_with(memory)
    dispatch.route([change(version(), 100, i, row=i) for i in range(12)])
    wider = version((("id", "integer", INT4), ("note", "text", TEXT), ("extra", "integer", INT4)))
    routed = dispatch.route([change(wider, 300, i, row=i) for i in range(12)])
    expected = SchemaChange("public", "orders", shape_of(version()), shape_of(wider), 300, 0, TS_US)
    events = schema_items(routed)
    assert sorted(key for key, _ in events) == ["0", "1", "2"]  # every partition that gets a change of it
    assert all(event == expected for _, event in events)  # one position for all: the first change's
    for _, items in routed:
        heads = [item[0] for item in opened(items)]
        described = heads.index(DESCRIBE)
        assert heads[described + 1] == SCHEMA
        assert type(heads[described + 2]) is int  # the first change of the new version follows
    assert memory.records["public.orders"]["shape"] == shape_json(shape_of(wider))
    assert memory.records["public.orders"]["changes"] == [{
        "commit_lsn": 300, "commit_idx": 0, "commit_timestamp": "2026-11-30T04:00:00.123456Z",
        "old": shape_json(shape_of(version())), "new": shape_json(shape_of(wider))}]


def test_a_later_partition_gets_the_event_with_its_first_change_of_the_version() -> None:
    dispatch = dispatch_with(Memory())
    dispatch.route([change(version(), 100, 0, row=1)])
    wider = version(identity="full")
    first = dispatch.route([change(wider, 300, 0, row=1)])
    later = dispatch.route([change(wider, 400, i, row=r) for i, r in enumerate(range(2, 30))])
    assert len(schema_items(first)) == 1
    events = schema_items(first) + schema_items(later)
    assert sorted(key for key, _ in events) == ["0", "1", "2"]  # each partition once
    assert {(event.commit_lsn, event.commit_idx) for _, event in events} == {(300, 0)}


def test_reads_and_tables_the_sink_does_not_read_are_not_looked_at() -> None:
    memory = Memory()
    sink = make_sink(schema_events=True, source={"include_tables": ["public.orders"]})
    dispatch = dispatch_with(memory, sink=sink)
    dispatch.route([change(version(name="other", relid=2), 100), change(version(), 101)])
    routed = dispatch.route([change(version(identity="full"), 200, read=ReadOf(sink.name, "b1", "[1]"))])
    assert schema_items(routed) == []
    assert list(memory.records) == ["public.orders"]
    assert memory.records["public.orders"]["shape"]["replica_identity"] == "default"  # the read's version: not it


def test_only_the_latest_changes_are_kept_in_a_record() -> None:
    memory = Memory()
    dispatch = dispatch_with(memory)
    for n in range(RECENT_CHANGES + 3):
        columns = (("id", "integer", INT4), *((f"c{i}", "text", TEXT) for i in range(n)))
        dispatch.route([change(version(columns), 100 + n)])
    changes = memory.records["public.orders"]["changes"]
    assert [c["commit_lsn"] for c in changes] == [100 + n for n in range(3, RECENT_CHANGES + 3)]


# -- restarts: the baselines ---------------------------------------------------------------------


def recorded_after(*versions: tuple[Table, int]) -> list[dict[str, Any]]:
    """The table's record after a run that saw ``versions`` (each with its first change's LSN)."""
    memory = Memory()
    dispatch = dispatch_with(memory)
    for table, lsn in versions:
        dispatch.route([change(table, lsn)])
    return list(memory.records.values())


def test_a_restart_compares_against_the_shape_at_the_confirmed_position() -> None:
    v1, v2, v3 = version(), version(identity="full"), version(identity="nothing")
    records = recorded_after((v1, 100), (v2, 200), (v3, 300))
    assert baselines(records, 400)["public.orders"][1] == shape_of(v3)  # nothing will be replayed
    assert baselines(records, 300)["public.orders"][1] == shape_of(v2)  # v3's first change is replayed
    assert baselines(records, 150)["public.orders"][1] == shape_of(v1)  # both are


def test_a_change_made_while_stopped_is_reported_and_a_replayed_one_again() -> None:
    records = recorded_after((version(), 100))
    dispatch = dispatch_with(Memory(), records, confirmed=200)
    assert [e.new for _, e in schema_items(dispatch.route([change(version(identity="full"), 300)]))] == \
        [shape_of(version(identity="full"))]
    replayed = recorded_after((version(), 100), (version(identity="full"), 200))
    dispatch = dispatch_with(Memory(), replayed, confirmed=200)
    assert [(e.commit_lsn, e.new) for _, e in schema_items(dispatch.route([change(version(identity="full"), 200)]))] \
        == [(200, shape_of(version(identity="full")))]
    dispatch = dispatch_with(Memory(), replayed, confirmed=201)  # a plain restart: the same shape
    assert schema_items(dispatch.route([change(version(identity="full"), 300)])) == []


@pytest.mark.parametrize("record", [
    {}, {"schema": "public", "table": "orders"}, {"schema": 1, "table": "orders", "shape": {}, "changes": []},
    {"schema": "public", "table": "orders", "changes": [], "shape": {"columns": [{"name": "id"}],
                                                                      "replica_identity": "default"}},
    {"schema": "public", "table": "orders", "changes": "no", "shape": {"columns": [], "replica_identity": "d"}},
])
def test_a_record_that_is_not_walflows_is_left_out(record: dict[str, Any]) -> None:
    assert baselines([record], 0) == {}


def test_status_words_each_tables_last_change() -> None:
    records = recorded_after((version(), 100), (version((("id", "bigint", INT8), ("note", "text", TEXT))), 0x1_0000_0200))
    assert last_changes(records) == [("public.orders", "id integer → bigint (the first change of the new shape at "
                                      "commit LSN 1/200, commit_idx 0, committed 2026-11-30T04:00:00.123456Z)")]
    assert last_changes(recorded_after((version(), 100))) == []  # recorded, never changed


# -- the event a partition publishes -------------------------------------------------------------


CHANGE = SchemaChange("public", "orders", shape_of(version()), shape_of(version(identity="full")), 300, 2, TS_US)


def events(stored: dict[str, Any] | None = None) -> tuple[SchemaEvents, list[str]]:
    asked: list[str] = []

    def last(subject: str) -> dict[str, Any] | None:
        asked.append(subject)
        return stored

    return SchemaEvents(SINK, "app", last), asked


def test_the_event_is_a_barrier_on_the_tables_schema_subject() -> None:
    schema_events, asked = events()
    message = schema_events.message(CHANGE)
    assert message is not None
    assert message.subject == b"wf.app.public.orders.schema" and asked == ["wf.app.public.orders.schema"]
    assert message.row == BARRIER
    assert message.labels == ("public.orders", "schema")
    assert b64decode(message.msg_id) == b"app/app-to-nats/schema/300:2"
    ids = IdScheme("app", "app-to-nats")
    assert ids.decode(message.msg_id) is None and not ids.is_read(message.msg_id)  # the replay scan passes over it
    assert IdScheme("app", "app-to-nats", "sequin").decode(message.msg_id) is None
    assert json.loads(message.payload) == payload(CHANGE, "app", message.msg_id) == {
        "action": "schema",
        "table": {"schema": "public", "name": "orders"},
        "old": {"columns": [{"name": "id", "type": "integer", "key": True}, {"name": "note", "type": "text",
                                                                             "key": False}],
                "replica_identity": "default"},
        "new": {"columns": [{"name": "id", "type": "integer", "key": True}, {"name": "note", "type": "text",
                                                                             "key": False}],
                "replica_identity": "full"},
        "metadata": {"database_name": "app", "commit_lsn": 300, "commit_idx": 2,
                     "commit_timestamp": "2026-11-30T04:00:00.123456Z", "idempotency_key": message.msg_id},
    }


@pytest.mark.parametrize(("stored", "published"), [
    (None, True),
    ({"new": shape_json(CHANGE.old), "metadata": {"commit_lsn": 100, "commit_idx": 0}}, True),  # an older event
    ({"new": shape_json(CHANGE.new), "metadata": {"commit_lsn": 300, "commit_idx": 2}}, False),  # this one
    ({"new": shape_json(CHANGE.new), "metadata": {"commit_lsn": 250, "commit_idx": 0}}, False),  # reports the shape
    ({"new": shape_json(CHANGE.old), "metadata": {"commit_lsn": 400, "commit_idx": 0}}, False),  # a later one
    ({"new": "nonsense", "metadata": {"commit_lsn": "300"}}, True),  # not walflow's
], ids=["none", "older", "same", "same-shape", "later", "foreign"])
def test_the_stream_decides_whether_a_copy_is_needed(stored: dict[str, Any] | None, published: bool) -> None:
    assert (events(stored)[0].message(CHANGE) is not None) is published


def test_render_puts_the_event_right_before_the_first_change_and_it_crosses_pickled() -> None:
    database = make_database()
    shaping = Shaping(SINK, database, 0, None, None, ("wf.>",))
    render = Render(SINK, database, shaping, schema_events=events()[0])
    dispatch = dispatch_with(Memory())
    dispatch.route([change(version(), 100)])
    wider = version((("id", "integer", INT4), ("note", "text", TEXT), ("extra", "integer", INT4)))
    routed = dispatch.route([change(wider, 300, i, row=i) for i in range(9)])
    assert len(routed) == 3
    ids = set()
    for _, items in routed:
        messages = render([pickle.loads(pickle.dumps(items))], ROOM)  # as between processes
        assert [m.subject.rsplit(b".", 1)[1] for m in messages] == [b"schema"] + [b"insert"] * (len(messages) - 1)
        assert [m.row == BARRIER for m in messages] == [True] + [False] * (len(messages) - 1)
        assert json.loads(messages[0].payload)["new"]["columns"][-1] == {"name": "extra", "type": "integer",
                                                                         "key": False}
        assert json.loads(messages[1].payload)["record"]["extra"] == "x"
        ids.add(messages[0].msg_id)
    assert len(ids) == 1  # every partition's copy is one JetStream message


def test_a_stream_capturing_the_database_takes_schema_events() -> None:
    assert schema_subject("wf", "app", "public", "orders") == "wf.app.public.orders.schema"
    assert covers("wf.app.>", schema_pattern("wf", "app"))
    assert not covers("wf.app.*.*.insert", schema_pattern("wf", "app"))


def test_in_an_atomic_sink_the_event_is_in_its_transactions_unit_before_the_change() -> None:
    sink = make_sink(schema_events=True, transactions="atomic")
    database = make_database()
    render = Render(sink, database, Shaping(sink, database, 0, None, None, ("sequin.>",)),
                    schema_events=SchemaEvents(sink, "app", lambda subject: None))
    dispatch = Dispatch(sink, schema=SchemaTracker({}, Memory()), commits=True)
    dispatch.route([change(version(), 100), Commit("app", 100, 9, TS)])
    (routed,) = dispatch.route([change(version(identity="full"), 200), Commit("app", 200, 9, TS)])
    messages = render([routed[1]], ROOM)
    assert [m.subject.rsplit(b".", 1)[-1] for m in messages] == [b"schema", b"insert", b""]
    assert messages[2] is TRANSACTION_END
