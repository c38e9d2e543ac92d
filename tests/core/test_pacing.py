"""EpochPacer: a source partition that does not spin while its next epoch waits on the probe.

The unit tests drive the pacer with explicit times, as Bytewax 0.21.1 calls a partition
(``next_batch`` then ``next_awake``, then ``snapshot`` when the epoch's interval has
elapsed). The engine test runs a real ``-w 2`` flow whose sink partition on the other
worker blocks ~1 s in ``snapshot`` (as the JetStream sink does while it waits for acks)
and bounds the CPU the process uses meanwhile.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition
from bytewax.testing import cluster_main

from core.pacing import EpochPacer

_S = timedelta(seconds=1)


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def test_polls_at_once_inside_an_epoch_and_at_the_boundary_instead_of_just_before() -> None:
    pacer = EpochPacer(100.0, _S)
    pacer.polled(100.5)
    assert pacer.next_awake(100.5, None) is None
    assert pacer.next_awake(100.5, 0.005) == _at(100.505)
    pacer.polled(100.996)
    assert pacer.next_awake(100.996, None) == _at(101.0)  # within the guard: wake at the boundary


def test_holds_at_the_boundary_then_learns_a_longer_wait() -> None:
    pacer = EpochPacer(100.0, _S, hold=timedelta(milliseconds=20), max_hold=_S)
    pacer.polled(101.0)
    assert pacer.next_awake(101.0, None) == _at(101.02)  # the snapshot follows in this activation
    pacer.snapshotted(101.001)
    pacer.polled(101.3)  # the probe passed at 101.3: the partition spun from 101.02
    assert pacer.spins == 1
    assert abs(pacer.hold - 0.301) < 1e-6
    pacer.polled(102.001)  # the next boundary is one interval after the snapshot
    assert pacer.next_awake(102.001, None) == _at(102.001 + pacer.hold)


def test_a_wait_shorter_than_the_hold_shrinks_it() -> None:
    pacer = EpochPacer(100.0, _S, hold=timedelta(milliseconds=100))
    pacer.polled(101.0)
    pacer.next_awake(101.0, None)
    pacer.snapshotted(101.0)
    pacer.polled(101.1)  # woken by the hold: the wait was shorter
    assert pacer.spins == 0
    assert abs(pacer.hold - 0.075) < 1e-9


def test_a_poll_the_scheduler_woke_late_is_no_spin() -> None:
    """On a loaded machine the thread wakes a few ms after its hold: not a wait the hold missed."""
    pacer = EpochPacer(100.0, _S, hold=timedelta(milliseconds=1500), max_hold=timedelta(seconds=2))
    pacer.polled(101.0)
    pacer.next_awake(101.0, None)
    pacer.snapshotted(101.0)
    pacer.polled(102.504)  # 4 ms late, as measured with eight busy processes on two cores
    assert pacer.spins == 0
    pacer.polled(103.0)
    pacer.next_awake(103.0, None)
    pacer.snapshotted(103.0)
    pacer.polled(104.5)  # the 1.125 s hold outlasted by 375 ms: a spin
    assert pacer.spins == 1


def test_max_hold_bounds_what_a_long_wait_teaches() -> None:
    pacer = EpochPacer(100.0, _S, max_hold=timedelta(milliseconds=200))
    pacer.polled(101.0)
    pacer.next_awake(101.0, None)
    pacer.snapshotted(101.0)
    pacer.polled(104.0)
    assert pacer.hold == 0.2


def test_learns_the_interval_from_two_snapshots() -> None:
    pacer = EpochPacer(100.0)
    for t in (100.5, 101.002):
        pacer.polled(t)
        assert pacer.next_awake(t, None) is None  # not paced before it knows the interval
    pacer.snapshotted(101.002)
    pacer.polled(102.003)
    pacer.next_awake(102.003, None)
    pacer.snapshotted(102.003)
    pacer.polled(102.9)
    assert pacer.next_awake(102.9, None) is None
    pacer.polled(103.0)
    assert pacer.next_awake(103.0, None) == _at(103.004)  # the boundary: 102.003 + 1.001
    pacer.polled(103.004)
    assert pacer.next_awake(103.004, None) == _at(103.004 + pacer.hold)


def test_a_hold_no_snapshot_followed_lengthens_the_interval() -> None:
    pacer = EpochPacer(100.0)
    pacer.snapshotted(100.0)
    pacer.snapshotted(100.9)  # learned 0.9 s, the engine's is 1 s
    pacer.polled(100.901)
    pacer.polled(101.81)
    assert pacer.next_awake(101.81, None) is not None  # a hold, but the engine did not snapshot
    pacer.polled(101.82)
    assert pacer.misses == 1
    assert pacer.next_awake(101.82, None) is not None  # past the corrected boundary: hold again
    pacer.snapshotted(101.82)


# --- the engine test ------------------------------------------------------------------

_BLOCK = 1.0
_EPOCH = timedelta(milliseconds=200)


class _Partition(StatefulSourcePartition[int, int]):
    """An item every 20 ms for 2.5 s; polled every 5 ms when idle, at once after an item, as walflow's source."""

    def __init__(self, pacer: EpochPacer | None, threads: dict[str, int]) -> None:
        threads["source"] = threading.get_ident()
        self._pacer = pacer
        self._start = time.time()
        self._n = 0
        self._idle = False
        self.polls = 0  # calls of next_batch and next_awake: what spinning through a wait shows, whatever the load

    def next_batch(self) -> list[int]:
        self.polls += 1
        now = time.time()
        if self._pacer is not None:
            self._pacer.polled(now)
        if now - self._start >= 2.5:
            raise StopIteration
        due = int((now - self._start) / 0.02)
        out = list(range(self._n, due))
        self._n = max(self._n, due)
        self._idle = not out
        return out

    def next_awake(self) -> datetime | None:
        self.polls += 1
        delay = 0.005 if self._idle else None
        if self._pacer is None:
            return None if delay is None else datetime.fromtimestamp(time.time() + delay, UTC)
        return self._pacer.next_awake(time.time(), delay)

    def snapshot(self) -> int:
        if self._pacer is not None:
            self._pacer.snapshotted(time.time())
        return self._n


class _Source(FixedPartitionedSource[int, int]):
    def __init__(self, paced: bool, threads: dict[str, int]) -> None:
        self._paced = paced
        self._threads = threads
        self.pacer: EpochPacer | None = None
        self.part: _Partition | None = None

    def list_parts(self) -> list[str]:
        return ["p"]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _Partition:
        if self._paced:
            self.pacer = EpochPacer(time.time(), _EPOCH, hold=timedelta(seconds=1.5), max_hold=timedelta(seconds=2))
        self.part = _Partition(self.pacer, self._threads)
        return self.part


class _SinkPartition(StatefulSinkPartition[Any, None]):
    def __init__(self, blocks: bool, threads: dict[str, int]) -> None:
        self._blocks = blocks
        self._threads = threads

    def write_batch(self, items: list[Any]) -> None:
        pass

    def snapshot(self) -> None:
        if self._blocks and "sink" not in self._threads:  # the first epoch's end waits ~1 s
            self._threads["sink"] = threading.get_ident()
            time.sleep(_BLOCK)


class _Sink(FixedPartitionedSink[Any, None]):
    """Two partitions: "a" on worker 0 with the source, "b" on worker 1; every item goes to "b"."""

    def __init__(self, threads: dict[str, int]) -> None:
        self._threads = threads

    def list_parts(self) -> list[str]:
        return ["a", "b"]

    def part_fn(self, item_key: str) -> int:
        return 1

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _SinkPartition:
        return _SinkPartition(for_part == "b", self._threads)


def _cpu_while_the_sink_blocks(paced: bool) -> tuple[float, _Source, dict[str, int]]:
    threads: dict[str, int] = {}
    source = _Source(paced, threads)
    flow = Dataflow("pacing")
    keyed = op.key_on("key", op.input("in", flow, source), lambda _: "k")
    op.output("out", keyed, _Sink(threads))
    start = time.process_time()
    cluster_main(flow, [], 0, worker_count_per_proc=2, epoch_interval=_EPOCH)
    return time.process_time() - start, source, threads


@pytest.mark.alone
def test_a_paced_source_does_not_spin_while_a_sink_snapshot_blocks() -> None:
    cpu, source, threads = _cpu_while_the_sink_blocks(paced=True)
    assert threads["sink"] != threads["source"]  # the wait is on another worker: the source's is free
    assert source.pacer is not None and source.pacer.spins <= 1
    # Paced, the run costs ~0.2 s of CPU; spinning through the wait alone takes up to a second.
    assert cpu < 0.5, cpu


@pytest.mark.slow
@pytest.mark.alone
def test_control_an_unpaced_source_spins_through_the_wait() -> None:
    """Counted in polls, not CPU seconds: a loaded machine gives a spinning thread less CPU,
    but it is still called far more often (~720 calls against ~100 paced, under load too)."""
    _, unpaced, threads = _cpu_while_the_sink_blocks(paced=False)
    assert threads["sink"] != threads["source"]
    _, paced, _ = _cpu_while_the_sink_blocks(paced=True)
    assert unpaced.part is not None and paced.part is not None
    assert unpaced.part.polls > 3 * paced.part.polls, (unpaced.part.polls, paced.part.polls)  # ~7x measured
