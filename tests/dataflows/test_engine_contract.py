"""The Bytewax behaviour walflow's delivery guarantee stands on, pinned.

walflow confirms a snapshot's LSN to Postgres when the source partition is next called.
That is safe only because Bytewax calls a source partition in epoch e+1 after every sink
partition has finished epoch e — for a ``FixedPartitionedSink``, after its ``snapshot()``
(where walflow's sink waits for the last JetStream acks) has returned. Bytewax documents
no such hook (bytewax/bytewax#229); if an upgrade changes this, these tests fail instead
of the slot silently moving past changes JetStream never stored.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import cluster_main

TOTAL = 20_000


class Ledger:
    """What the sink has made durable, and every time the source found the rule broken."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.written: dict[str, list[int]] = {}
        self.durable: set[int] = set()
        self.checks = 0
        self.violations: list[str] = []


class _Part(StatefulSourcePartition[int, int]):
    def __init__(self, ledger: Ledger, start: int) -> None:
        self.ledger = ledger
        self.next = start
        self.unconfirmed: int | None = None

    def _check(self) -> None:
        """What walflow does here: confirm the previous snapshot. It must be durable by now."""
        if self.unconfirmed is None:
            return
        with self.ledger.lock:
            missing = [i for i in range(self.unconfirmed) if i not in self.ledger.durable]
            self.ledger.checks += 1
            if missing:
                self.ledger.violations.append(f"snapshot at {self.unconfirmed}: {len(missing)} items not durable")
        self.unconfirmed = None

    def next_batch(self) -> list[int]:
        self._check()
        if self.next >= TOTAL:
            raise StopIteration
        batch = list(range(self.next, min(self.next + 100, TOTAL)))
        self.next = batch[-1] + 1
        return batch

    def next_awake(self) -> datetime | None:
        return None

    def snapshot(self) -> int:
        self._check()
        self.unconfirmed = self.next
        return self.next


class _Source(FixedPartitionedSource[int, int]):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def list_parts(self) -> list[str]:
        return ["slot"]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _Part:
        return _Part(self.ledger, resume_state or 0)


class _SinkPart(StatefulSinkPartition[int, None]):
    """Slow on purpose: the wider the window, the likelier a broken rule shows."""

    def __init__(self, ledger: Ledger, name: str) -> None:
        self.ledger = ledger
        self.name = name

    def write_batch(self, values: list[int]) -> None:
        time.sleep(0.001)
        with self.ledger.lock:
            self.ledger.written.setdefault(self.name, []).extend(values)

    def snapshot(self) -> None:
        time.sleep(0.01)  # like waiting for the epoch's last acks
        with self.ledger.lock:
            self.ledger.durable.update(self.ledger.written.pop(self.name, []))


class _Sink(FixedPartitionedSink[int, None]):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def list_parts(self) -> list[str]:
        return ["p0", "p1", "p2", "p3"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _SinkPart:
        return _SinkPart(self.ledger, for_part)


@pytest.mark.slow
@pytest.mark.parametrize("recovery", [False, True], ids=["without-recovery", "with-recovery"])
def test_source_is_called_again_only_after_the_sinks_finished_the_epoch(recovery: bool, tmp_path: Path) -> None:
    ledger = Ledger()
    flow = Dataflow("contract")
    items = op.input("inp", flow, _Source(ledger))
    keyed = op.key_on("key", items, lambda i: str(i % 7))
    op.output("out", keyed, _Sink(ledger))
    config = None
    if recovery:
        init_db_dir(tmp_path, 2)
        config = RecoveryConfig(tmp_path)
    cluster_main(flow, [], 0, epoch_interval=timedelta(milliseconds=20), recovery_config=config,
                 worker_count_per_proc=2)
    assert ledger.violations == []
    assert ledger.checks >= 10  # the rule was really exercised, epoch after epoch
    assert len(ledger.durable) == TOTAL
