"""Transaction markers without servers: the slot's changes and Commits through dispatch and
render, as a sink with ``transaction_markers`` receives and publishes them."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from connectors.nats.replay import _lsn
from core.errors import FatalError
from core.events import BARRIER, TRANSACTION_END, Commit, RawChange, ReadOf, Table
from core.ids import IdScheme
from core.message import Message
from tests.transforms.samples import ROOM, TS, TS_US, make_render, make_sink
from tests.transforms.test_dispatch import typed_table
from transforms.dispatch import Dispatch
from transforms.transactions import check_captured


def _refunds() -> Table:
    """A second table, for the per-table counts."""
    return dataclasses.replace(typed_table(relid=2), name="refunds", uid=typed_table().uid + 1000)


def _txn(table: Table, lsn: int, ids: range, xid: int = 7) -> list[RawChange | Commit]:
    changes: list[RawChange | Commit] = [
        RawChange("insert", table, (str(i).encode(), b"paid", b"1", b"2026-11-30 04:00:00+00", b"{}"), None, False,
                  lsn, n, TS, xid) for n, i in enumerate(ids)]
    return [*changes, Commit("app", lsn, xid, TS)]


def _published(batches: list[list[RawChange | Commit]], **sink: Any) -> list[list[Message]]:
    """What render makes of each batch, through dispatch, for a sink with markers."""
    config = make_sink(transaction_markers=True, **sink)
    dispatch, render = Dispatch(config, commits=True), make_render(config)
    return [render([items for _, items in dispatch.route(batch)], ROOM) for batch in batches]


def _kinds(messages: list[Message]) -> list[str]:
    return [m.subject.decode().rsplit(".", 1)[-1] if b"_transaction" in m.subject else json.loads(m.payload)["record"]
            ["id"].__str__() for m in messages if m is not TRANSACTION_END]


def test_each_transaction_is_between_its_begin_and_its_end_with_the_counts_published() -> None:
    orders, other = typed_table(), _refunds()
    (out,) = _published([[*_txn(orders, 500, range(2))[:-1], *_txn(other, 500, range(5, 6))]])
    assert _kinds(out) == ["begin", "0", "1", "5", "end"]
    begin, end = json.loads(out[0].payload), json.loads(out[-1].payload)
    assert begin == {"status": "BEGIN", "id": "7:500", "ts_ms": TS_US // 1000, "event_count": None,
                     "data_collections": None}
    assert end == {"status": "END", "id": "7:500", "ts_ms": TS_US // 1000, "event_count": 3, "data_collections": [
        {"data_collection": "public.orders", "event_count": 2}, {"data_collection": "public.refunds", "event_count": 1}]}
    assert (out[0].subject, out[-1].subject) == (b"sequin.app._transaction.begin", b"sequin.app._transaction.end")
    assert out[0].row == out[-1].row == BARRIER  # ordered against everything in the partition
    ids = IdScheme("app", "app-to-nats")
    assert (out[0].msg_id, out[-1].msg_id) == (ids.encode_marker("begin", 500), ids.encode_marker("end", 500))
    assert [_lsn(ids, m.msg_id) for m in (out[0], out[-1])] == [500, 500]  # the replay scan finds them
    assert ids.decode(out[0].msg_id) is None  # never taken for a change


def test_a_transaction_across_calls_and_one_with_nothing_published() -> None:
    orders = typed_table()
    whole = _txn(orders, 500, range(4))
    first, second = _published([whole[:2], [*whole[2:], *_txn(orders, 600, range(9, 10))]], actions=["insert"])
    assert _kinds(first) == ["begin", "0", "1"]
    assert _kinds(second) == ["2", "3", "end", "begin", "9", "end"]
    filtered = _published([[*(c._replace(action="delete") if type(c) is RawChange else c
                              for c in _txn(orders, 700, range(3)))]], actions=["insert"])
    assert filtered == [[]]  # nothing of it published: no markers


def test_atomic_markers_are_in_the_unit_and_reads_are_in_no_transaction() -> None:
    orders = typed_table()
    read = RawChange("read", orders, (b"42", b"paid", b"1", b"2026-11-30 04:00:00+00", b"{}"), None, False, 800, 0, TS,
                     0, ReadOf("app-to-nats", "b1", "[42]"))
    (out,) = _published([[*_txn(orders, 500, range(2)), read]], transactions="atomic")
    assert [m.subject.decode().rsplit(".", 1)[-1] if m is not TRANSACTION_END else "|" for m in out] == [
        "begin", "insert", "insert", "end", "|", "read", "|"]
    assert out[0].row == 0  # the batch is ordered whole: no barrier


def test_the_debezium_envelope_carries_each_events_place_in_its_transaction() -> None:
    orders, other = typed_table(), _refunds()
    (out,) = _published([[*_txn(orders, 500, range(2))[:-1], *_txn(other, 500, range(5, 6))]], envelope="debezium")
    blocks = [json.loads(m.payload)["transaction"] for m in out[1:-1]]
    assert blocks == [{"id": "7:500", "total_order": 1, "data_collection_order": 1},
                      {"id": "7:500", "total_order": 2, "data_collection_order": 2},
                      {"id": "7:500", "total_order": 3, "data_collection_order": 1}]
    (plain,) = _published([_txn(orders, 500, range(1))])
    assert "transaction" not in json.loads(plain[1].payload)  # Sequin's envelope stays Sequin's


def test_a_stream_that_would_not_store_the_markers_is_refused_at_start() -> None:
    sink = make_sink(transaction_markers=True)
    check_captured(sink, "app", "S", ("sequin.>",))
    with pytest.raises(FatalError, match=r"does not capture sequin\.app\._transaction\.\* .*add that subject"):
        check_captured(sink, "app", "S", ("sequin.app.*.*.*",))
