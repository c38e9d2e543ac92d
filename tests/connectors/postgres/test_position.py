"""The slot's positions, without a database: the rules that decide what is confirmed, and when.

Bytes in (hand-built CopyData through the real decoder), status updates out: what the
partition emits moves :class:`SlotPosition`, epochs confirm it, and the ``flush`` field of
the standby status update is read back from its bytes. The shells around it (partition,
session) are proven by ``test_source.py`` and the pipeline tests against a real server.
"""

from __future__ import annotations

import struct

import pytest

from connectors.postgres.decoder import Decoder, Item, ResumePoint
from connectors.postgres.position import SlotPosition
from core.events import RawChange
from tests import pgoutput_reference as ref
from tests.copydata import ORDERS, FakeCatalog, keepalive, text, transaction, xlog

_STATUS = struct.Struct("!cQQQqB")


def flush_of(update: bytes) -> tuple[int, int, bool]:
    """A status update's ``write``, ``flush`` and reply-requested fields."""
    kind, write, flush, apply, _, reply = _STATUS.unpack(update)
    assert kind == b"r" and apply == flush
    return write, flush, bool(reply)


def insert(i: int) -> ref.Insert:
    return ref.Insert(None, ORDERS.relid, text(str(i), "n"))


def decoded(*messages: bytes) -> list[Item]:
    decoder = Decoder(FakeCatalog(), ResumePoint())
    for message in [xlog(ORDERS, 1), *messages]:
        decoder.feed(message)
    return decoder.take()[0]


def emit(position: SlotPosition, items: list[Item], floor: int | None = None, now: float = 0.0) -> bool:
    """What the partition does with a batch (``source.py``): markers and changes move the position."""
    out = False
    for item in items:
        if isinstance(item, int):
            position.marker(item)
        elif isinstance(item, RawChange):
            position.commit_lsn, position.commit_idx = item.commit_lsn, item.commit_idx
            out = True
    return position.batch_end(out, floor, now)


def test_an_epochs_position_is_confirmed_only_once_the_next_epoch_calls() -> None:
    position = SlotPosition(ResumePoint())
    emit(position, decoded(*transaction(1000, 1100, insert(1))))
    state = position.epoch_end(None)
    assert state == {"lsn": 1100, "commit_lsn": None, "commit_idx": -1}
    assert position.confirmed == 0 and flush_of(position.status(1100)) == (1100, 0, False)
    assert position.epoch_complete()  # Bytewax called again: the epoch is acknowledged downstream
    assert position.confirm_unsent and flush_of(position.status(1100, reply=True)) == (1100, 1100, True)
    assert not position.confirm_unsent


def test_an_epoch_that_ends_inside_a_transaction_confirms_nothing_of_it() -> None:
    position = SlotPosition(ResumePoint())
    items = decoded(*transaction(1000, 1100, insert(1), insert(2)))
    emit(position, items[:1])  # the first change only: the transaction is open
    assert position.epoch_end(None) == {"lsn": 0, "commit_lsn": 1000, "commit_idx": 0}
    assert not position.epoch_complete() and position.confirmed == 0
    emit(position, items[1:])
    position.epoch_end(None)
    assert position.epoch_complete() and position.confirmed == 1100


def test_wal_with_nothing_to_publish_moves_the_slot_at_once_once_everything_is_confirmed() -> None:
    position = SlotPosition(ResumePoint())
    emit(position, decoded(*transaction(1000, 1100, insert(1))))
    assert not emit(position, decoded(keepalive(5000)))  # a change is in flight: wait for its epoch
    position.epoch_end(None)
    position.epoch_complete()
    assert position.confirmed == 5000  # the epoch ended after the keepalive's marker
    assert emit(position, decoded(keepalive(9000)))  # settled: a keepalive's walEnd is confirmed at once
    assert position.confirmed == 9000


def test_a_running_backfill_holds_the_slot_at_the_last_epoch_end_before_its_signal() -> None:
    position = SlotPosition(ResumePoint())
    for end in (1100, 2100, 3100):
        emit(position, decoded(*transaction(end - 100, end, insert(end))), floor=2500)
        position.epoch_end(floor=2500)
        position.epoch_complete()
    assert position.confirmed == 2100  # not 3100: the backfill's newest signal lies at 2500
    emit(position, decoded(*transaction(4000, 4100, insert(4))), floor=None)  # the backfill ended
    position.epoch_end(None)
    position.epoch_complete()
    assert position.confirmed == 4100


def test_nothing_before_the_first_epoch_end_is_confirmed_under_a_floor() -> None:
    position = SlotPosition(ResumePoint())
    emit(position, decoded(*transaction(1000, 1100, insert(1))))
    position.epoch_end(floor=50)
    assert not position.epoch_complete() and position.confirmed == 0


def test_nothing_up_to_the_sinks_replay_horizon_is_confirmed() -> None:
    position = SlotPosition(ResumePoint(), confirm_after=2000)
    emit(position, decoded(*transaction(1000, 1100, insert(1))))
    position.epoch_end(None)
    assert not position.epoch_complete() and position.confirmed == 0
    assert emit(position, decoded(keepalive(2500)))
    assert position.confirmed == 2500


def test_confirmed_never_moves_back() -> None:
    position = SlotPosition(ResumePoint(3000))
    emit(position, decoded(keepalive(2000)))  # an old walEnd, as after a server restart
    position.epoch_end(None)
    assert not position.epoch_complete() and position.confirmed == 3000


@pytest.mark.parametrize(("resume", "server", "start_at"), [
    (ResumePoint(), 5000, 5000),  # a new slot: start where the server stands
    (ResumePoint(6000), 5000, None),  # the server is behind (PG15 after a crash): walflow's own position wins
    (ResumePoint(4000), 5000, 5000),  # someone else confirmed past walflow: what lies between is gone
])
def test_a_session_starts_at_the_later_of_the_two_positions(resume: ResumePoint, server: int,
                                                            start_at: int | None) -> None:
    position = SlotPosition(resume)
    assert position.session_start(server) == start_at
    assert position.received == max(resume.lsn, server)


def test_a_session_resumes_where_the_last_one_handed_on() -> None:
    position = SlotPosition(ResumePoint(1000))
    position.session_end(ResumePoint(1100, 2000, 3))
    assert position.resume == ResumePoint(1100, 2000, 3)
    assert position.lsn == 1000  # the partition's emitted position is its own


def test_a_bounded_run_finishes_between_transactions_past_its_end() -> None:
    position = SlotPosition(ResumePoint(), stop_at=1100)
    items = decoded(*transaction(1000, 1100, insert(1), insert(2)))
    emit(position, items[:1])
    assert not position.finished
    emit(position, items[1:])
    assert position.finished
    assert not SlotPosition(ResumePoint(5000)).finished  # without stop_at: never


def test_a_confirm_delay_confirms_each_durable_position_only_once_it_has_waited_that_long() -> None:
    position = SlotPosition(ResumePoint(), confirm_delay=120.0)
    emit(position, decoded(*transaction(1000, 1100, insert(1))))
    position.epoch_end(None)
    assert not position.epoch_complete(10.0)  # durable downstream at t=10 s: not confirmed yet
    assert position.durable == 1100 and position.confirmed == 0
    emit(position, decoded(*transaction(2000, 2100, insert(2))))
    position.epoch_end(None)
    position.epoch_complete(70.0)  # the second durable at t=70 s
    assert not position.batch_end(False, None, 129.9) and position.confirmed == 0
    assert position.batch_end(False, None, 130.0) and position.confirmed == 1100
    assert flush_of(position.status(2100))[1] == 1100  # the server hears only what waited the delay
    assert not position.batch_end(False, None, 189.9) and position.confirmed == 1100
    assert position.batch_end(False, None, 190.0) and position.confirmed == 2100


def test_a_confirm_delay_keeps_a_bounded_number_of_positions_and_never_confirms_early() -> None:
    position = SlotPosition(ResumePoint(), confirm_delay=64.0)
    durable_at: dict[int, float] = {}
    for i in range(2000):  # an epoch every 0.1 s for 200 s
        now = i / 10
        start = 1000 * (i + 1)
        emit(position, decoded(*transaction(start, start + 100, insert(i))), now=now)
        position.epoch_end(None)
        position.epoch_complete(now)
        durable_at[start + 100] = now
        assert len(position._delayed) <= 66  # ~one per 64th of the delay
        if position.confirmed:
            assert now - durable_at[position.confirmed] >= 64.0  # waited at least the delay
            assert now - durable_at[position.confirmed] <= 64.0 + 1.0 + 0.1  # and at most a share more
    assert position.confirmed > 0 and position.durable == 2000 * 1000 + 100
