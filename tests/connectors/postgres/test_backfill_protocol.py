"""The runner protocol (:mod:`connectors.postgres.backfill_protocol`) as events in, commands out.

No database, no thread, no clock: each test plays the partition and a table's loop on a
:class:`Ledger` (chunks read, high watermarks taken, chunks emitted or dropped, reconnects)
and checks the signals it says to write and what it holds. The last tests check the
:class:`Handoff`'s waits with a real thread.
"""

from __future__ import annotations

import threading

from connectors.postgres import signals
from connectors.postgres.backfill_progress import figures, progress_text
from connectors.postgres.backfill_protocol import DONE, Handoff, Ledger
from connectors.postgres.chunks import Chunk
from connectors.postgres.signals import BackfillRequest, Cursor, Signal
from core.events import RawRow, Table
from core.ids import row_key

SLOT, RUN = "wf_slot", "run-1"
TABLE = Table("public", "orders", ("id", "status"), ("id",), ("id",), (bytes.decode, bytes.decode))
B1, B2, B3 = (BackfillRequest(f"b{i}", "app-to-nats", "public.orders") for i in (1, 2, 3))


def chunk(*ids: int) -> Chunk:
    rows: list[RawRow] = [(str(i).encode(), b"x") for i in ids]
    return Chunk(TABLE, rows, [row_key([r[0]]) for r in rows], 100, [str(ids[-1])] if ids else None)


def running(*requests: BackfillRequest, max_concurrent: int = 2) -> Ledger:
    ledger = Ledger(SLOT, RUN, max_concurrent)
    for request in requests:
        ledger.begin(request, None, 0)
    ledger.turns(now=0.0)
    for request in requests:
        ledger.connected(request.id, TABLE, 1000)
    return ledger


def low(ledger: Ledger, backfill: str = "b1") -> Signal:
    step = ledger.next_read(backfill)
    assert isinstance(step, Signal) and step.kind == "low" and step.chunk is not None, step
    return step


def read(ledger: Ledger, *ids: int, last: bool = False, backfill: str = "b1") -> tuple[Signal, Signal]:
    """One chunk of a table's loop: its low watermark, then the high one after its rows were read."""
    start = low(ledger, backfill)
    return start, ledger.read(start, chunk(*ids), last)


def test_turns_come_under_max_concurrent_and_the_waiting_write_checkpoints() -> None:
    ledger = Ledger(SLOT, RUN, max_concurrent=2)
    ledger.begin(B1, None, 0)
    ledger.begin(B2, ["7"], 7)
    ledger.begin(B3, ["30"], 30)
    ledger.begin(B1, ["99"], 99)  # a repeat: ignored
    assert [(t.request.id, t.after, t.rows) for t in ledger.turns(now=5.0)] == [("b1", None, 0), ("b2", ["7"], 7)]
    assert ledger.turns(now=6.0) == []
    assert ledger.checkpoints() == [Signal("low", SLOT, B3, run=RUN, after=["30"], rows=30)]
    ledger.settled("b1", None, 0, "ended")
    assert [t.request.id for t in ledger.turns(now=7.0)] == ["b3"] and ledger.checkpoints() == []
    assert ledger.next_read("b1") == DONE


def test_a_chunk_goes_low_read_high_take_emitted() -> None:
    ledger = running(B1)
    start, high = read(ledger, 1, 2, 3)
    assert start == Signal("low", SLOT, B1, run=RUN, chunk=0, after=None, rows=0, estimate=1000)
    assert high == Signal("high", SLOT, B1, run=RUN, chunk=0, after=None, rows=0, estimate=1000)
    assert signals.decode(high.encode().encode(), SLOT) == high  # the wire format, unchanged
    assert ledger.described("b1") is TABLE
    taken = ledger.take("b1", 0)
    assert taken is not None and taken.keys == [row_key([b"1"]), row_key([b"2"]), row_key([b"3"])]
    assert ledger.take("b1", 0) is None  # once
    ledger.settled("b1", 0, 3, "emitted")
    assert low(ledger) == Signal("low", SLOT, B1, run=RUN, chunk=1, after=["3"], rows=3, estimate=1000)


def test_it_reads_one_chunk_ahead_and_no_more() -> None:
    ledger = running(B1)
    read(ledger, 1, 2)
    read(ledger, 3, 4)
    assert ledger.next_read("b1") is None  # two handed, none settled: wait
    ledger.take("b1", 0)
    assert ledger.next_read("b1") is None  # taken is not settled
    ledger.settled("b1", 0, 2, "emitted")
    assert low(ledger).after == ["4"]


def test_after_the_last_chunk_it_waits_until_the_partition_ends_the_backfill() -> None:
    ledger = running(B1)
    _, high = read(ledger, 1, last=True)
    assert high.last
    assert ledger.next_read("b1") is None
    ledger.take("b1", 0)
    ledger.settled("b1", 0, 1, "ended")
    assert ledger.next_read("b1") == DONE and ledger.entries() == []


def test_a_dropped_chunk_and_those_read_after_it_are_read_again_from_its_start() -> None:
    ledger = running(B1)
    read(ledger, 1, 2)
    ledger.take("b1", 0)
    ledger.settled("b1", 0, 2, "emitted")
    read(ledger, 3, 4)  # chunk 1, from ["2"]
    read(ledger, 5, 6)  # chunk 2, from ["4"]: read ahead
    ledger.settled("b1", 1, 0, "dropped")
    again = low(ledger)
    assert (again.chunk, again.after, again.rows) == (3, ["2"], 2)
    assert ledger.take("b1", 2) is None  # forgotten: its high watermark releases nothing
    ledger.settled("b1", 2, 0, "dropped")  # and settling it changes nothing
    assert ledger.entries()[0].starts == {} and not ledger.entries()[0].dropped


def test_a_dropped_last_chunk_is_read_again() -> None:
    ledger = running(B1)
    read(ledger, 1, last=True)
    ledger.settled("b1", 0, 0, "dropped")
    assert low(ledger).after is None


def test_a_reconnect_reads_again_from_the_oldest_chunk_not_taken() -> None:
    ledger = running(B1)
    read(ledger, 1, 2)
    read(ledger, 3, 4)
    ledger.take("b1", 0)  # being emitted: it will be whole, so it is not read again
    ledger.lost("b1")
    assert low(ledger).after == ["2"]


def test_a_reconnect_with_every_chunk_taken_goes_on_from_the_last_read() -> None:
    ledger = running(B1)
    read(ledger, 1, 2)
    ledger.take("b1", 0)
    ledger.lost("b1")
    assert low(ledger).after == ["2"]
    ledger.settled("b1", 0, 2, "emitted")  # forgotten by the reconnect: not counted twice
    assert ledger.entries()[0].rows == 0


def test_a_reconnect_after_a_drop_still_reads_again_from_the_dropped_chunk() -> None:
    ledger = running(B1)
    read(ledger, 1, 2)
    read(ledger, 3, 4)
    ledger.settled("b1", 0, 0, "dropped")
    ledger.lost("b1")  # before the loop saw the drop
    assert low(ledger).after is None


def test_an_end_says_where_it_stood_and_why() -> None:
    ledger = running(B1)
    read(ledger, 1, 2)
    ledger.take("b1", 0)
    ledger.settled("b1", 0, 2, "emitted")
    assert ledger.ending(B1, "table public.orders was dropped") == Signal(
        "high", SLOT, B1, run=RUN, after=["2"], rows=2, estimate=1000, last=True,
        error="table public.orders was dropped")
    ledger.settled("b1", None, 0, "ended")
    assert ledger.ending(B1, "gone").error == "gone"  # one that ended already: still said


def test_chunk_numbers_are_one_sequence_for_the_run() -> None:
    ledger = running(B1, B2)
    assert [low(ledger, b).chunk for b in ("b1", "b2", "b1")] == [0, 1, 2]


def test_a_read_of_a_backfill_that_ended_meanwhile_is_not_kept() -> None:
    ledger = running(B1)
    start = low(ledger)
    ledger.settled("b1", None, 0, "ended")
    assert ledger.read(start, chunk(1), last=False).chunk == start.chunk and ledger.entries() == []


def test_progress_figures() -> None:
    ledger = running(B1, max_concurrent=1)
    ledger.begin(B2, None, 0)
    read(ledger, *range(1, 101))
    ledger.take("b1", 0)
    ledger.settled("b1", 0, 100, "emitted")
    got = figures(ledger.entries(), now=10.0)
    assert got == [
        {"id": "b1", "sink": "app-to-nats", "table": "public.orders", "state": "running", "rows": 100,
         "estimate": 1000, "rows_per_s": 10.0, "eta_s": 90.0},
        {"id": "b2", "sink": "app-to-nats", "table": "public.orders", "state": "waiting", "rows": 0,
         "estimate": 0, "rows_per_s": 0.0, "eta_s": None},
    ]
    assert progress_text(got[0]) == "public.orders → app-to-nats: 100/~1,000 rows, 10 rows/s, ETA 90s"


# -- the handoff's waits ----------------------------------------------------------------------


def test_a_waiting_loop_wakes_when_the_partition_settles_a_chunk() -> None:
    ledger = running(B1)
    read(ledger, 1)
    read(ledger, 2)
    handoff = Handoff(ledger)
    got: list[Cursor | None] = []

    def loop() -> None:
        step = handoff.wait(lambda led: led.next_read("b1"))
        assert isinstance(step, Signal)
        got.append(step.after)

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and got == []
    with handoff as partition:
        partition.settled("b1", 0, 1, "emitted")
    thread.join(5)
    assert got == [["2"]]


def test_a_wait_ends_at_stop_or_timeout() -> None:
    handoff = Handoff(running(B1, B2, max_concurrent=2))
    assert handoff.wait(lambda led: led.turns(1.0) or None, timeout=0.05) is None
    thread = threading.Thread(target=lambda: handoff.wait(lambda led: None))
    thread.start()
    handoff.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert handoff.wait(lambda led: "now") is None  # stopped: nothing more
