"""The partition's side of backfills (:class:`connectors.postgres.backfill.Backfills`), without servers.

Signals are fed in WAL order as the decoder stages them; the runner's threads are played
by hand on a real ledger (:mod:`connectors.postgres.backfill_protocol`), which holds the
chunks they read and what the partition settled. What is checked: which rows a high watermark releases, where they
stand, how far the slot may be confirmed, what a snapshot and a resume carry, and what is
ignored (other runs' watermarks, other slots, unknown sinks, duplicate requests).
"""

from __future__ import annotations

from typing import Any

import pytest

from connectors.postgres.backfill import Admission, Backfills, BackfillState
from connectors.postgres.backfill_protocol import Entry, Handoff, Ledger
from connectors.postgres.chunks import Chunk
from connectors.postgres.decoder import Signal
from connectors.postgres.signals import BackfillRequest, Cursor, CursorSeal
from connectors.postgres.signals import Signal as Watermark
from core.events import UNCHANGED_TOAST, RawChange, RawRow, ReadOf, Table
from core.ids import row_key
from tests.transforms.samples import TS, make_sink, raw_change

SLOT = "wf_slot"
TABLE = Table("public", "orders", ("id", "status"), ("id",), ("id",), (bytes.decode, bytes.decode))
REQUEST = BackfillRequest("b1", "app-to-nats", "public.orders")


class _Ledger(Ledger):
    def begin(self, request: BackfillRequest, after: Cursor | None, rows: int) -> None:
        super().begin(request, after, rows)
        self.connected(request.id, TABLE, 0)  # as if its loop connected at once


class Runner:
    """The runner as the partition sees it: its run id and its handoff, no threads."""

    run_id = "this-run"

    def __init__(self, seal: CursorSeal | None = None) -> None:
        self.seal = seal or CursorSeal((), None)
        self.handoff = Handoff(_Ledger(SLOT, self.run_id, max_concurrent=8))
        with self.handoff as ledger:
            self.ledger = ledger  # one thread here: the tests look at it directly

    def hand(self, number: int, rows: Chunk, *, after: Cursor | None = None, last: bool = False,
             backfill: BackfillRequest = REQUEST) -> None:
        """What a table's loop does between chunk ``number``'s watermarks: its rows wait for the partition."""
        self.ledger.read(Watermark("low", SLOT, backfill, run=self.run_id, chunk=number, after=after), rows, last)

    @property
    def started(self) -> list[tuple[str, Cursor | None, int]]:
        return [(e.request.id, e.after, e.rows) for e in self.ledger.entries()]

    def entry(self, backfill: str = "b1") -> Entry:
        (found,) = [e for e in self.ledger.entries() if e.request.id == backfill]
        return found

    def stop(self) -> None:
        pass


def chunk(*ids: int, end: Cursor | None = None) -> Chunk:
    rows: list[RawRow] = [(str(i).encode(), b"new") for i in ids]
    return Chunk(TABLE, rows, [row_key([r[0]]) for r in rows], 100,
                 end if end is not None else ([str(ids[-1])] if ids else None))


def signal(kind: str, *, run: str | None = "this-run", number: int | None = None, after: Cursor | None = None,
           last: bool = False, error: str | None = None, rows: int = 0, request: BackfillRequest = REQUEST,
           slot: str = SLOT, lsn: int = 1000) -> Signal:
    content = Watermark(kind, slot, request, run=run, chunk=number, after=after, rows=rows,  # type: ignore[arg-type]
                        last=last, error=error).encode().encode()
    return Signal(lsn, TS, content)


def change(action: str, id_: str, **kw: Any) -> RawChange:
    row = {"id": id_.encode(), "status": b"changed"}
    if action == "delete":
        return raw_change("delete", old={"id": id_.encode()}, old_is_key=True, **kw)
    return raw_change(action, new=row, **kw)  # type: ignore[arg-type]


def feed(backfills: Backfills, item: Signal, position: int, out: list[RawChange]) -> int:
    """What the partition does with a signal: every read it releases, then ``done``; their memory."""
    release = backfills.on_signal(item, position)
    if release is None:
        return 0
    reads = release.take(1)  # in slices, as next_batch takes them
    while not release.empty:
        reads += release.take(1)
    out += reads
    release.done()
    return release.row_memory * len(reads)


def make(runner: Runner, resume: list[BackfillState] | None = None, **admission: Any) -> Backfills:
    rules = Admission({"app-to-nats": make_sink(source={"exclude_tables": ["public.secrets"]})},
                      **admission)
    return Backfills(SLOT, rules, runner, resume, resume_lsn=50)  # type: ignore[arg-type]


def requested() -> tuple[Runner, Backfills, list[RawChange]]:
    """A runner, the partition's side with backfill b1 requested at 100, and what it emits."""
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None), 100, out)
    return runner, backfills, out


def test_a_high_watermark_releases_the_rows_whose_key_did_not_change_in_its_window() -> None:
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None), 100, out)
    assert runner.started == [("b1", None, 0)] and backfills.floor == 100
    feed(backfills, signal("low", number=0), 200, out)
    assert backfills.watching and backfills.floor == 200
    backfills.observe(change("update", "2"))
    backfills.observe(change("delete", "3"))
    backfills.observe(change("insert", "9", table="customers"))  # another table: no effect
    runner.hand(0, chunk(1, 2, 3, 4))
    size = feed(backfills, signal("high", number=0, lsn=5000), 300, out)
    assert [(c.action, c.new, c.commit_lsn, c.commit_idx) for c in out] == [
        ("read", (b"1", b"new"), 5000, 1), ("read", (b"4", b"new"), 5000, 2)]
    assert [c.read for c in out] == [("app-to-nats", "b1", '["1"]'), ("app-to-nats", "b1", '["4"]')]
    # whole RawChanges, made without their class's __new__: every field in its place, none missing
    assert all(type(c) is RawChange and len(c) == len(RawChange._fields) for c in out)
    assert [(type(c.read), c.read and c.read.row_key) for c in out] == [(ReadOf, row_key(["1"])), (ReadOf, row_key(["4"]))]
    assert [(c.table, c.old, c.old_is_key, c.commit_ts, c.xid, c.annotations) for c in out] == [
        (TABLE, None, False, TS, 0, None)] * 2
    assert size == 200 and not backfills.watching
    assert runner.entry().rows == 2 and runner.entry().starts == {}  # settled: the runner may read on
    assert backfills.snapshot() == [{"request": {"id": "b1", "sink": "app-to-nats", "table": "public.orders",
                                                 "sort_column": None, "start_position": None},
                                     "after": ["4"], "rows": 2}]


def test_the_last_chunk_ends_the_backfill_and_lifts_the_floor() -> None:
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None), 100, out)
    feed(backfills, signal("low", number=7), 200, out)
    runner.hand(7, chunk(1))
    feed(backfills, signal("high", number=7, last=True), 300, out)
    assert len(out) == 1 and backfills.floor is None and backfills.snapshot() == []
    assert runner.started == []  # ended: another table may start
    # this run's signals of a backfill that ended are not a new backfill
    feed(backfills, signal("low", number=8), 400, out)
    assert runner.started == [] and backfills.floor is None


def test_an_earlier_runs_watermark_resumes_the_backfill_from_its_start_position() -> None:
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("low", run="dead-run", number=3, after=["500"], rows=500), 100, out)
    assert runner.started == [("b1", ["500"], 500)] and backfills.floor == 100
    # its later watermarks are history: no window, no rows, no new start
    feed(backfills, signal("high", run="dead-run", number=3, after=["500"]), 150, out)
    feed(backfills, signal("low", run="dead-run", number=4, after=["600"]), 160, out)
    assert out == [] and not backfills.watching and runner.started == [("b1", ["500"], 500)]
    assert backfills.floor == 100


def test_an_earlier_runs_sealed_position_resumes_where_it_stood_only_with_the_shared_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A table a sink masks has its positions sealed: with ``walflow.backfill.secret`` every run
    opens them; with a key of the dead run's own, the backfill starts again from the table's start."""
    low = Watermark("low", SLOT, REQUEST, run="dead-run", chunk=3, after=["500"], rows=500)
    for dead, this, started in (
        (CursorSeal([REQUEST.table], b"secret"), CursorSeal([REQUEST.table], b"secret"), [("b1", ["500"], 500)]),
        (CursorSeal([REQUEST.table], None), CursorSeal([REQUEST.table], None), [("b1", None, 0)]),
    ):
        runner = Runner(this)
        backfills = make(runner)
        with caplog.at_level("WARNING", logger="walflow.backfill"):
            feed(backfills, Signal(100, TS, low.encode(None, dead).encode()), 100, [])
        assert runner.started == started and backfills.floor == 100
    assert [r.getMessage() for r in caplog.records] == [
        "backfill b1 of public.orders for sink app-to-nats: starting again from the table's start: an earlier run "
        "sealed where it stood with a key of its own (a sink hides columns of the table); set walflow.backfill.secret "
        "to resume where it stopped"]


def test_this_runs_sealed_watermarks_match_their_chunks_and_resume_points() -> None:
    seal = CursorSeal([REQUEST.table], None)
    runner = Runner(seal)
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None), 100, out)
    for number, ids in ((0, (1, 2)), (1, (3, 4))):
        low = runner.ledger.next_read("b1")
        assert isinstance(low, Watermark) and low.chunk == number
        feed(backfills, Signal(200 + number, TS, low.encode(None, seal).encode()), 200 + number, out)
        high = runner.ledger.read(low, chunk(*ids), last=number == 1)
        assert (low.after is None) == ('"sealed"' not in high.encode(None, seal))
        feed(backfills, Signal(300 + number, TS, high.encode(None, seal).encode()), 300 + number, out)
    assert [c.new[0] for c in out if c.new] == [b"1", b"2", b"3", b"4"] and backfills.floor is None


def test_a_snapshot_resumes_where_it_stood_and_ignores_the_replayed_watermarks() -> None:
    runner = Runner()
    state: BackfillState = {"request": {"id": "b1", "sink": "app-to-nats", "table": "public.orders",
                                        "sort_column": None, "start_position": None}, "after": ["42"], "rows": 42}
    backfills = make(runner, [state])
    assert runner.started == [("b1", ["42"], 42)] and backfills.floor == 50
    out: list[RawChange] = []
    feed(backfills, signal("low", run="dead-run", number=9, after=["90"]), 100, out)
    assert backfills.floor == 50 and runner.started == [("b1", ["42"], 42)]


def test_a_chunk_it_cannot_trust_is_dropped_and_so_are_those_read_ahead_until_the_runner_starts_again() -> None:
    runner, backfills, out = requested()
    feed(backfills, signal("low", number=1), 200, out)
    runner.hand(0, chunk(1))
    feed(backfills, signal("high", number=0), 300, out)  # its low watermark was not seen
    assert out == [] and runner.entry().dropped and runner.entry().dropped_at is None
    assert runner.entry().untaken == {}  # its rows are let go at once
    runner.hand(2, chunk(2), after=["1"])  # read ahead, before the runner rewound
    feed(backfills, signal("high", number=2, after=["1"]), 320, out)
    assert out == [] and runner.entry().starts == {}
    low = runner.ledger.next_read("b1")  # again from where the stream stands
    assert isinstance(low, Watermark) and low.after is None
    feed(backfills, Signal(330, TS, low.encode().encode()), 330, out)
    high = runner.ledger.read(low, chunk(1, 2), last=False)
    feed(backfills, Signal(340, TS, high.encode().encode()), 340, out)
    assert [c.new for c in out] == [(b"1", b"new"), (b"2", b"new")]


def test_a_chunk_read_as_another_table_than_its_window_watched_is_read_again() -> None:
    """The window watches the table as the previous chunk was read; a reconnect may describe
    it anew (DDL): a chunk read so is dropped, and the next window watches the new table."""
    runner, backfills, out = requested()
    runner.hand(0, chunk(1))  # read between the watermarks below
    feed(backfills, signal("low", number=0), 200, out)
    feed(backfills, signal("high", number=0), 210, out)
    assert len(out) == 1
    renamed = Table("public", "orders_v2", ("id", "status"), ("id",), ("id",), (bytes.decode, bytes.decode))
    feed(backfills, signal("low", number=1, after=["1"]), 300, out)
    backfills.observe(change("update", "2", table="orders_v2"))  # not watched: the window is on orders
    runner.hand(1, Chunk(renamed, [(b"2", b"new")], [row_key([b"2"])], 100, ["2"]), after=["1"])
    feed(backfills, signal("high", number=1, after=["1"]), 310, out)
    assert len(out) == 1 and runner.entry().dropped and runner.entry().dropped_at == ["1"]
    feed(backfills, signal("low", number=2, after=["1"]), 400, out)
    backfills.observe(change("update", "2", table="orders_v2"))
    runner.hand(2, Chunk(renamed, [(b"2", b"new"), (b"3", b"new")], [row_key([b"2"]), row_key([b"3"])], 100,
                         ["3"]), after=["1"])
    feed(backfills, signal("high", number=2, after=["1"]), 410, out)
    assert [c.new for c in out[1:]] == [(b"3", b"new")]


@pytest.mark.parametrize("what", ["truncate", "unknown key"])
def test_a_truncate_or_a_change_without_a_key_in_the_window_has_the_chunk_read_again(what: str) -> None:
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None), 100, out)
    feed(backfills, signal("low", number=0), 200, out)
    if what == "truncate":
        backfills.observe(raw_change("truncate", new=None))
    else:  # an untouched TOASTed key value that no row of the change holds
        backfills.observe(raw_change("update", new={"id": UNCHANGED_TOAST, "status": b"x"}))
    runner.hand(0, chunk(1))
    feed(backfills, signal("high", number=0), 300, out)
    assert out == [] and runner.entry().dropped


def test_an_untouched_toasted_key_is_taken_from_the_old_row() -> None:
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None), 100, out)
    feed(backfills, signal("low", number=0), 200, out)
    backfills.observe(raw_change("update", new={"id": UNCHANGED_TOAST, "status": b"x"},
                                 old={"id": b"1", "status": b"y"}))
    runner.hand(0, chunk(1, 2))
    feed(backfills, signal("high", number=0), 300, out)
    assert [c.new for c in out] == [(b"2", b"new")]


def test_ignored_signals() -> None:
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None, slot="someone_else"), 100, out)
    feed(backfills, Signal(100, TS, b"not json"), 100, out)
    feed(backfills, signal("request", run=None, request=BackfillRequest("b2", "unknown-sink", "public.x")), 100, out)
    assert runner.started == []
    feed(backfills, signal("request", run=None), 100, out)
    feed(backfills, signal("request", run=None, request=BackfillRequest("b3", "app-to-nats", "public.orders")),
                        110, out)
    # a second request for the same table and sink is a backfill of its own (it may differ, or follow a finished one)
    assert runner.started == [("b1", None, 0), ("b3", None, 0)]


def test_an_error_ends_the_backfill_without_rows() -> None:
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None), 100, out)
    feed(backfills, signal("high", last=True, error="table public.orders was dropped"), 200, out)
    assert out == [] and runner.started == [] and backfills.floor is None


def test_a_chunk_counts_as_emitted_only_once_all_its_reads_are_out() -> None:
    runner = Runner()
    backfills = make(runner)
    out: list[RawChange] = []
    feed(backfills, signal("request", run=None), 100, out)
    feed(backfills, signal("low", number=0), 200, out)
    runner.hand(0, chunk(1, 2, 3))
    release = backfills.on_signal(signal("high", number=0), 300)
    assert release is not None and len(release.take(2)) == 2 and not release.empty
    assert backfills.snapshot()[0]["after"] is None and 0 in runner.entry().starts  # a resume reads it again
    assert len(release.take(2)) == 1 and release.empty
    release.done()
    assert backfills.snapshot()[0]["after"] == ["3"] and runner.entry().rows == 3 and not runner.entry().starts


def test_a_request_runs_only_as_the_config_allows() -> None:
    """Anyone may write a request: a sink the config lacks, a table the sink does not read and
    requests past max_pending are refused and reported, never started."""
    runner = Runner()
    reported: list[tuple[str, str]] = []
    backfills = make(runner, max_pending=2, report=lambda prefix, reason, _: reported.append((prefix, reason)))
    out: list[RawChange] = []
    for id_, sink, table in [("b1", "app-to-nats", "public.secrets"), ("b2", "nobody", "public.orders"),
                             ("b3", "app-to-nats", "orders"), ("b4", "app-to-nats", "public.orders"),
                             ("b5", "app-to-nats", "public.orders"), ("b6", "app-to-nats", "public.orders")]:
        feed(backfills, signal("request", run=None, request=BackfillRequest(id_, sink, table)), 100, out)
    assert [started[0] for started in runner.started] == ["b4", "b5"]
    assert reported == [("walflow.backfill", "refused")] * 3 + [("walflow.backfill", "too_many")]
    feed(backfills, signal("request", run=None, request=BackfillRequest("b7", "app-to-nats", "public.orders"),
                           slot="another"), 100, out)
    assert len(reported) == 4  # another slot's signal is not input to refuse


def test_with_a_key_an_unsigned_signal_is_reported_and_not_acted_on() -> None:
    runner = Runner()
    reported: list[str] = []
    backfills = make(runner, key=b"key", report=lambda prefix, reason, _: reported.append(reason))
    feed(backfills, signal("request", run=None), 100, [])
    feed(backfills, Signal(100, TS, b"[]"), 100, [])
    assert runner.started == [] and reported == ["unauthenticated", "malformed"]
    signed = Watermark("request", SLOT, REQUEST).encode(b"key").encode()
    feed(backfills, Signal(100, TS, signed), 100, [])
    assert runner.started == [("b1", None, 0)]


def test_a_snapshots_backfill_the_config_no_longer_allows_is_dropped() -> None:
    runner = Runner()
    state: BackfillState = {"request": {"id": "b9", "sink": "app-to-nats", "table": "public.secrets",
                                        "sort_column": None, "start_position": None}, "after": None, "rows": 0}
    backfills = make(runner, [state])
    assert runner.started == [] and backfills.floor is None
