"""keep_thread_state: one Python thread state per engine worker thread, for the thread's life.

The flows run at ``-w 2`` (``cluster_main`` with two worker threads, the engine's own
threads, as in production). A ``threading.local`` value is the observable: it lives
exactly as long as the thread state, so it survives from one item to the next only when
the thread state does.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, cluster_main

from core.threads import keep_thread_state, thread_state_address, thread_state_pinned

_ITEMS = 400


class _Source(TestingSource[int]):
    """A testing source that pins the worker thread's thread state in ``list_parts`` (or not)."""

    def __init__(self, items: list[int], pin: bool, calls: list[tuple[int, bool]]) -> None:
        super().__init__(items, batch_size=1)
        self._pin = pin
        self._calls = calls

    def list_parts(self) -> list[str]:
        # Bytewax calls list_parts once on every worker thread while it builds the flow.
        pinned = keep_thread_state() if self._pin else False
        self._calls.append((threading.get_native_id(), pinned))
        return super().list_parts()  # type: ignore[no-any-return]


def _run(pin: bool) -> tuple[list[tuple[int, bool]], dict[int, list[tuple[bool, bool, int]]]]:
    """Run the flow at -w 2; per native thread, what each item saw: (fresh local?, pinned?, tstate)."""
    local = threading.local()
    calls: list[tuple[int, bool]] = []
    seen: list[tuple[int, bool, bool, int]] = []

    def look(x: int) -> int:
        fresh = not hasattr(local, "mark")
        local.mark = True
        seen.append((threading.get_native_id(), fresh, thread_state_pinned(), thread_state_address()))
        return x

    out: list[Any] = []
    flow = Dataflow("threads")
    stream = op.input("in", flow, _Source(list(range(_ITEMS)), pin, calls))
    op.output("out", op.map("look", stream, look), TestingSink(out))
    cluster_main(flow, [], 0, worker_count_per_proc=2, epoch_interval=timedelta(milliseconds=50))
    assert sorted(out) == list(range(_ITEMS))
    by_thread: dict[int, list[tuple[bool, bool, int]]] = defaultdict(list)
    for tid, fresh, pinned, address in seen:
        by_thread[tid].append((fresh, pinned, address))
    return calls, by_thread


def test_one_thread_state_per_worker_thread_once_kept() -> None:
    calls, by_thread = _run(pin=True)
    # list_parts ran once on each of the two worker threads, neither of them the main thread.
    assert len(calls) == 2 and len({tid for tid, _ in calls}) == 2
    assert threading.main_thread().native_id not in {tid for tid, _ in calls}
    assert all(pinned for _, pinned in calls)
    ((tid, items),) = by_thread.items()  # one partition: every item on one worker thread
    assert tid in {t for t, _ in calls}
    assert len(items) == _ITEMS
    fresh = [f for f, _, _ in items]
    assert fresh.count(True) == 1 and fresh[0]  # the local was set once and survived every item
    assert all(p for _, p, _ in items)
    assert len({address for _, _, address in items}) == 1


def test_without_it_each_callback_gets_a_new_thread_state() -> None:
    """The control: without keep_thread_state the engine's thread drops its thread state between calls."""
    calls, by_thread = _run(pin=False)
    assert len(calls) == 2
    ((_, items),) = by_thread.items()
    fresh = [f for f, _, _ in items]
    # The source emits one item per activation, and every activation takes the GIL afresh.
    assert fresh.count(True) > _ITEMS // 2
    assert not any(p for _, p, _ in items)


def test_no_op_on_the_main_thread() -> None:
    assert keep_thread_state() is False
    assert thread_state_pinned() is False


def test_idempotent_on_a_thread() -> None:
    results: list[bool] = []

    def body() -> None:
        results.extend([keep_thread_state(), keep_thread_state(), thread_state_pinned()])

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert results == [True, False, True]
