"""bench/streaming.py's consumer on hand-built pgoutput messages: what an exactly-once reader of
protocol 2 holds, publishes and drops (no server: the bench itself runs it on real WAL)."""

from __future__ import annotations

import struct

from bench.streaming import Consumer, percentile


def _insert(row_id: int, xid: int | None = None) -> bytes:
    """An Insert of a one-column row whose id is ``row_id``; ``xid`` is the prefix inside a stream block."""
    text = str(row_id).encode()
    prefix = b"" if xid is None else struct.pack("!I", xid)
    return b"I" + prefix + struct.pack("!IcHcI", 16384, b"N", 1, b"t", len(text)) + text


def _begin(xid: int) -> bytes:
    return b"B" + struct.pack("!QqI", 0x100, 0, xid)


COMMIT = b"C" + struct.pack("!BQQq", 0, 0x100, 0x108, 0)
STOP = b"E"


def _start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack("!IB", xid, first)


def _stream_commit(xid: int) -> bytes:
    return b"c" + struct.pack("!IBQQq", xid, 0, 0x200, 0x208, 0)


def _stream_abort(xid: int, subxid: int) -> bytes:
    return b"A" + struct.pack("!II", xid, subxid)


def _feed(consumer: Consumer, *messages: bytes) -> None:
    for i, message in enumerate(messages):
        consumer.message(message, 1_000 + i)


def test_a_transaction_sent_after_its_commit_is_published_as_it_arrives() -> None:
    c = Consumer()
    _feed(c, _begin(7), _insert(1), _insert(2), COMMIT)
    assert (c.published, c.peak_held_changes, c.held_changes) == (2, 0, 0)
    assert c.commits[7].commit_ns == 1_003 and c.commits[7].last_change_ns == 1_002
    assert not c.commits[7].streamed and c.commits[7].first_publishable_ns == 1_001


def test_a_streamed_transaction_is_held_until_stream_commit_then_published_whole() -> None:
    c = Consumer()
    _feed(c, _start(100, True), _insert(1, 100), _insert(2, 100), STOP)
    assert (c.published, c.held_changes) == (0, 2)
    _feed(c, _start(100, False), _insert(3, 100), STOP, _stream_commit(100))
    assert (c.published, c.held_changes, c.peak_held_changes, c.stream_blocks) == (3, 0, 3, 2)
    assert c.held_bytes == 0 and c.peak_held_bytes == sum(len(_insert(i, 100)) for i in (1, 2, 3))
    assert c.commits[100].streamed and c.commits[100].first_publishable_ns == c.commits[100].commit_ns


def test_a_whole_stream_abort_drops_everything_held_and_publishes_nothing() -> None:
    c = Consumer()
    _feed(c, _start(100, True), _insert(-1, 100), _insert(-2, 100), STOP, _stream_abort(100, 100))
    assert (c.published, c.dropped, c.held_changes, c.received_rolled_back) == (0, 2, 0, 2)
    assert 100 not in c.commits and c.stream_aborts == 1


def test_a_subtransaction_abort_drops_from_its_first_change_on_and_keeps_what_came_before() -> None:
    c = Consumer()
    # top 100 writes 1; savepoint 101 writes -2; nested 102 writes -3; then more of 101
    _feed(c, _start(100, True), _insert(1, 100), _insert(-2, 101), _insert(-3, 102), STOP,
          _start(100, False), _insert(-4, 101), STOP)
    _feed(c, _stream_abort(100, 102))  # the nested one: its change and what followed it
    assert (c.dropped, c.held_changes) == (2, 2)
    _feed(c, _stream_abort(100, 101))
    assert (c.dropped, c.held_changes, c.dropped_committed) == (3, 1, 0)
    _feed(c, _stream_abort(100, 103))  # a subtransaction none of whose changes was streamed
    assert c.held_changes == 1
    _feed(c, _start(100, False), _insert(5, 100), STOP, _stream_commit(100))
    assert (c.published, c.published_rolled_back, c.subxact_aborts) == (2, 0, 3)


def test_transactions_sent_after_commit_interleave_with_stream_blocks() -> None:
    c = Consumer()
    _feed(c, _start(100, True), _insert(1, 100), STOP, _begin(200), _insert(2), COMMIT,
          _start(100, False), _insert(3, 100), STOP, _stream_commit(100))
    assert c.published == 3 and set(c.commits) == {100, 200}
    assert c.commits[100].last_change_ns == 1_008 and c.commits[100].commit_ns == 1_009


def test_a_rolled_back_row_is_told_by_its_negative_id() -> None:
    c = Consumer()
    _feed(c, _begin(1), _insert(-5), _insert(5), COMMIT)
    assert (c.received_rolled_back, c.published_rolled_back) == (1, 1)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([3.0], 99) == 3.0
