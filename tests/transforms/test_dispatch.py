"""The split around Bytewax's exchange, without servers: the slot worker's dispatch step
(filter, group key, partition, compact items, table descriptions) and a sink partition's
render step (items → the same messages the envelope makes from the change itself),
also when every item went through pickle as between processes, or crossed sealed."""

from __future__ import annotations

import dataclasses
import json
import pickle
from datetime import timedelta
from typing import Any
from zlib import adler32

import pytest

from connectors.postgres.types import TypeSpecs, loaders_for
from core.events import UNCHANGED_TOAST, Commit, OversizedValue, RawChange, RawValue, ReadOf, Table
from core.metrics import Metrics
from core.wire import COMMIT, DESCRIBE, FORGET, Crossing, Item, commit_time, opened, pack, pack_commit, sealed
from tests.transforms.samples import ROOM, TS, make_database, make_render, make_sink, raw_change
from transforms.convert import convert, convert_fields
from transforms.dispatch import Dispatch
from transforms.envelope import Envelope
from transforms.group import GroupKey

INT4, TEXT, NUMERIC, TIMESTAMPTZ, JSONB = 23, 25, 1700, 1184, 3802


def typed_table(relid: int = 1, database: str = "app") -> Table:
    """A table as the catalog describes one: loaders that rebuild elsewhere from TypeSpecs."""
    types = TypeSpecs((INT4, TEXT, NUMERIC, TIMESTAMPTZ, JSONB), ())
    return Table("public", "orders", ("id", "status", "amount", "at", "doc"), ("id",), ("id",), loaders_for(types),
                 database, relid, loaders_for, types)


def change(table: Table, row_id: int, action: Any = "insert", idx: int = 0, read: ReadOf | None = None) -> RawChange:
    new = (str(row_id).encode(), b"paid", b"12.50", b"2026-11-30 04:00:00+00", b'{"a": [1, null]}')
    if action == "delete":
        return RawChange(action, table, None, (new[0], None, None, None, None), True, 100 + row_id, idx, TS, 9,
                         read)
    return RawChange(action, table, new, None, False, 100 + row_id, idx, TS, 9, read)


def flat(routed: list[tuple[str, Crossing]]) -> list[tuple[str, Item]]:
    """Dispatch's lists as (partition, item) pairs, in order."""
    return [(key, item) for key, items in routed for item in opened(items)]


def by_partition(routed: list[tuple[str, Crossing]]) -> dict[str, list[Item]]:
    out: dict[str, list[Item]] = {}
    for key, item in flat(routed):
        out.setdefault(key, []).append(item)
    return out


def test_each_partition_gets_a_table_description_once_before_its_first_change() -> None:
    table = typed_table()
    dispatch = Dispatch(make_sink(partition_count=3))
    routed = dispatch.route([change(table, i, idx=i) for i in range(30)])
    routed += dispatch.route([change(table, i, action="update", idx=i) for i in range(30)])
    parts = by_partition(routed)
    assert len(parts) == 3  # 30 rows spread over every partition
    for items in parts.values():
        assert items[0] == (DESCRIBE, table)
        assert sum(1 for item in items if item[0] == DESCRIBE) == 1


def test_a_row_keeps_one_partition_the_one_its_group_key_hashes_to() -> None:
    table = typed_table()
    sink = make_sink(partition_count=4)
    dispatch, key = Dispatch(sink), GroupKey(sink)
    changes = [change(table, 7, idx=0), change(table, 7, action="update", idx=1), change(table, 7, "delete", idx=2)]
    routed = [(k, item) for k, item in flat(dispatch.route(changes)) if type(item[0]) is int]
    assert {k for k, _ in routed} == {str(adler32(key(changes[0]).encode()) % 4)}
    assert [item[6] for _, item in routed] == [0, 1, 2]  # commit order kept


def test_what_the_sink_does_not_publish_or_another_database_wrote_never_crosses() -> None:
    metrics = Metrics()
    dispatch = Dispatch(make_sink(actions=["insert"]), metrics)
    ours, theirs = typed_table(), typed_table(relid=2, database="crm")
    routed = flat(dispatch.route([change(ours, 1, "delete"), change(theirs, 2), change(ours, 3)]))
    assert [item[0] for _, item in routed] == [DESCRIBE, ours.uid]
    filtered = metrics.changes_filtered.labels("app-to-nats", "public.orders", "delete")._value.get()
    assert filtered == 1  # the other database's change is not this sink's, so not counted as filtered


def test_a_new_version_of_a_relation_forgets_the_old_one_where_it_was_described() -> None:
    old = typed_table()
    new = dataclasses.replace(old, uid=old.uid + 1)
    dispatch = Dispatch(make_sink(partition_count=2))
    first = flat(dispatch.route([change(old, i) for i in range(10)]))
    had = {k for k, item in first if item[0] == DESCRIBE}
    routed = dispatch.route([change(new, 1)])
    forgets = [(k, item) for k, item in flat(routed) if item[0] == FORGET]
    assert sorted(forgets) == sorted((k, (FORGET, old.uid)) for k in had)
    for _, items in routed:  # on each partition, the old version is forgotten before the new one arrives
        kinds = [item[0] for item in opened(items)]
        assert DESCRIBE not in kinds or kinds.index(FORGET) < kinds.index(DESCRIBE)


def test_a_backfills_table_does_not_supersede_the_streams() -> None:
    stream = typed_table()
    chunk = dataclasses.replace(stream, uid=stream.uid + 1)
    dispatch = Dispatch(make_sink(partition_count=1))
    read = ReadOf("app-to-nats", "b1", '["1"]')
    routed = flat(dispatch.route([change(stream, 1), change(chunk, 1, "read", read=read), change(stream, 2)]))
    assert [item[0] for _, item in routed] == [DESCRIBE, stream.uid, DESCRIBE, chunk.uid, stream.uid]


@pytest.mark.parametrize("crossing", ["same process", "pickled", "sealed"])
def test_render_makes_the_messages_the_envelope_makes_from_the_changes(crossing: str) -> None:
    table = typed_table()
    sink, db = make_sink(partition_count=2), make_database()
    changes = [change(table, i, idx=i) for i in range(6)] + [change(table, 3, "delete", idx=9)]
    changes.append(change(table, 4, "read", read=ReadOf(sink.name, "b1", '["4"]')))
    later = [change(table, i, "update", idx=20 + i) for i in range(6)]  # a batch without descriptions
    envelope = Envelope(sink, db)
    expected = {c.commit_lsn * 100 + c.commit_idx: envelope(convert(c)) for c in changes + later}
    dispatch = Dispatch(sink, crosses=crossing == "sealed")
    renders = {key: make_render(sink, db) for key in ("0", "1")}
    published = []
    for batch in (changes, later):
        for key, items in dispatch.route(batch):
            if crossing == "sealed":
                assert isinstance(items, bytes) == (batch is later)  # a description is Bytewax's to pickle
            if crossing != "same process":
                items = pickle.loads(pickle.dumps(items))
            published += renders[key]([items], ROOM)
    assert len(published) == len(changes) + len(later)
    assert sorted(published, key=lambda m: m.msg_id) == sorted(expected.values(), key=lambda m: m.msg_id)
    # each message names its row, the same for every change of one row: the publisher's fence
    by_row = {(m.row, json.loads(m.payload)["record"]["id"]) for m in published}
    assert all(row for row, _ in by_row) and len({row for row, _ in by_row}) == len({i for _, i in by_row}) == 6


@pytest.mark.parametrize("value", [UNCHANGED_TOAST, OversizedValue(10, 0)], ids=["toast", "oversized"])
def test_a_list_holding_a_marker_crosses_unsealed_and_whole(value: RawValue) -> None:
    table = typed_table()
    marked = RawChange("update", table, (b"1", value, None, None, None), None, False, 1, 0, TS, 9)
    items: list[Item] = [pack(change(table, 2)), pack(marked)]
    assert sealed(items) is items
    assert opened(sealed(items[:1])) == items[:1]


def test_a_packed_change_converts_as_the_change_does() -> None:
    raw = raw_change("update", new={"id": b"7", "status": b"paid"}, old={"id": b"6"}, old_is_key=True, idx=3)
    read = raw._replace(action="read", read=ReadOf("s", "b", '["7"]'), annotations=b'{"a":1}')
    for change_ in (raw, read):
        _, *fields, row = pickle.loads(pickle.dumps(pack(change_, 42)))
        assert row == 42
        fields[6] = commit_time(fields[6])
        fields[8] = None if fields[8] is None else ReadOf(*fields[8])
        assert convert_fields(fields[0], change_.table, *fields[1:]) == convert(change_)


def test_a_change_before_its_table_is_described_stops_with_the_reason() -> None:
    table = typed_table()
    with pytest.raises(RuntimeError, match="was not described to this partition first"):
        make_render()([[pack(change(table, 1))]], ROOM)


def test_a_partition_holds_only_the_versions_in_use() -> None:
    render = make_render()
    tables = [dataclasses.replace(typed_table(), uid=u) for u in range(1, 50)]
    dispatch = Dispatch(make_sink(partition_count=1))
    for table in tables:  # a reconnect or DDL per batch: a new version each time
        render([items for _, items in dispatch.route([change(table, 1)])], ROOM)
    assert render.versions == 1


def test_versions_never_superseded_are_bounded_and_described_again_when_needed() -> None:
    """Finished backfills' tables (one lineage each) are never superseded: past the bound
    the oldest is forgotten where it was described, and described again if used again."""
    dispatch = Dispatch(make_sink(partition_count=1), max_versions=3)
    render = make_render()
    first = typed_table()
    chunks = [dataclasses.replace(first, uid=first.uid + i) for i in range(1, 6)]
    routed = dispatch.route([change(first, 1)])
    for i, chunk in enumerate(chunks):
        routed += dispatch.route([change(chunk, 1, "read", read=ReadOf("app-to-nats", f"b{i}", '["1"]'))])
    routed += dispatch.route([change(first, 2)])  # the stream's version, forgotten meanwhile: described again
    messages = render([items for _, items in routed], ROOM)
    assert len(messages) == 7 and render.versions <= 3
    assert [item for _, item in flat(routed)].count((DESCRIBE, first)) == 2


def _txn(table: Table, commit_lsn: int, rows: range, action: Any = "insert") -> list[RawChange]:
    return [change(table, i, action, idx=n)._replace(commit_lsn=commit_lsn) for n, i in enumerate(rows)]


def _commit(commit_lsn: int, database: str = "app") -> Commit:
    return Commit(database, commit_lsn, 9, TS)


def test_a_sink_in_commit_order_gets_each_transactions_end_after_its_last_change() -> None:
    table, theirs = typed_table(), typed_table(relid=2, database="crm")
    dispatch = Dispatch(make_sink(transactions="atomic", actions=["insert"]), commits=True)
    first = dispatch.route(_txn(table, 500, range(3))[:2])  # a transaction across two batches
    rest = dispatch.route([*_txn(table, 500, range(3))[2:], _commit(500),
                           *_txn(table, 600, range(2), "delete"), _commit(600),  # nothing of it published
                           *_txn(theirs, 700, range(2)), _commit(700, "crm"),  # another database's
                           change(table, 9, read=ReadOf("app-to-nats", "b1", "[9]")), _commit(800)])
    items = [item for _, item in flat(first + rest)]
    assert {key for key, _ in flat(first + rest)} == {"0"}  # one partition: commit order
    kinds = [item[5] if type(item[0]) is int else item[0] for item in items]
    assert kinds == [DESCRIBE, 500, 500, 500, COMMIT, 109]  # the read (at 109) is in no transaction
    assert items[4] == pack_commit(_commit(500)) == (COMMIT, 500, 9, (TS - commit_time(0)) // timedelta(microseconds=1))


def test_a_sink_not_in_commit_order_passes_over_the_slots_commits() -> None:
    table = typed_table()
    plain = Dispatch(make_sink(partition_count=2), commits=True)
    routed = flat(plain.route([*_txn(table, 500, range(4)), _commit(500)]))
    assert [item for _, item in routed if item[0] == COMMIT] == []
    assert sum(1 for _, item in routed if type(item[0]) is int) == 4


def test_a_sink_in_commit_order_refuses_more_partitions() -> None:
    with pytest.raises(ValueError, match="remove partition_count"):
        make_sink(transaction_markers=True, partition_count=4)
    assert make_sink(transaction_markers=True).partitions == 1
