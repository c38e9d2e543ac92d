"""Helpers for tests that read a slot: a partition driven as Bytewax would, and flows to run.

They hand tests converted changes (:func:`transforms.convert.convert`), as the flow's sinks see them.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import psycopg
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, run_main

from config.schema import DatabaseConfig, ReplicationSettings, SinkConfig
from connectors.postgres.source import PostgresSource, Slot, SlotPartition, SourceState
from core.events import Change, Commit, RawChange
from core.runtime import Runtime
from transforms.convert import convert


@contextmanager
def partition(
    db: DatabaseConfig, settings: ReplicationSettings | None = None, resume: SourceState | None = None,
    sinks: tuple[SinkConfig, ...] = (),
) -> Iterator[SlotPartition]:
    """A source partition built and closed as Bytewax does, for tests that drive it by hand."""
    part = PostgresSource([Slot(db, sinks)], settings or ReplicationSettings(), Runtime()).build_part(
        "pg", db.slot.name, resume)
    try:
        yield part
    finally:
        part.close()


def drain(part: SlotPartition, until: Callable[[list[Change]], bool], timeout: float = 60.0) -> list[Change]:
    """Poll ``next_batch`` (as Bytewax's idle poll does) until ``until(changes)`` or the deadline."""
    out: list[Change] = []
    deadline = time.monotonic() + timeout
    while not until(out):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s with {len(out)} changes")
        batch = part.next_batch()
        out.extend(convert(change) for change in batch if type(change) is RawChange)  # no Commit: no sinks here
        if not batch:
            time.sleep(0.005)
    return out


def drain_snapshotting(
    part: SlotPartition, until: Callable[[list[Change], SourceState], bool], timeout: float = 60.0
) -> tuple[list[Change], SourceState]:
    """Like :func:`drain`, with a snapshot after every call, as if every batch were an epoch."""
    states: list[SourceState] = []

    def done(out: list[Change]) -> bool:
        states.append(part.snapshot())
        return until(out, states[-1])

    return drain(part, done, timeout), states[-1]


def _converted(item: RawChange | Commit) -> Change | None:
    return convert(item) if type(item) is RawChange else None


def run_flow(
    db: DatabaseConfig, stop_at_lsn: int, recovery: Path | None = None, settings: ReplicationSettings | None = None
) -> list[Change]:
    """Run a dataflow source → list until everything committed before ``stop_at_lsn`` came out."""
    out: list[Change] = []
    flow = Dataflow("test_pg_source")
    changes = op.input("pg", flow, PostgresSource([Slot(db, stop_at_lsn=stop_at_lsn)], settings or ReplicationSettings(), Runtime()))
    op.output("out", op.filter_map("convert", changes, _converted), TestingSink(out))
    config = None
    if recovery is not None:
        if not recovery.exists():
            recovery.mkdir(parents=True)
            init_db_dir(recovery, 1)
        config = RecoveryConfig(str(recovery))
    run_main(flow, epoch_interval=timedelta(milliseconds=100), recovery_config=config)
    return out


def rows(changes: list[Change]) -> list[tuple[str, str, object]]:
    """(action, table, id) per change: a compact view for order assertions."""
    return [(c.action, c.table, (c.new or c.old or {}).get("id")) for c in changes]


_XLOGDATA = struct.Struct("!cQQq")  # 'w', dataStart, walEnd, sendTime


def slot_messages(
    conn: psycopg.Connection[Any], slot: str, publication: str, *, upto: int | None = None, consume: bool = False
) -> list[bytes]:
    """The slot's pgoutput messages (up to LSN ``upto``) framed as the walsender sends them: XLogData
    with the message's LSN as dataStart and walEnd. ``consume`` moves the slot past them."""
    function = "pg_logical_slot_get_binary_changes" if consume else "pg_logical_slot_peek_binary_changes"
    rows = conn.execute(
        f"SELECT (lsn - '0/0')::bigint, data FROM {function}(%s, %s::text::pg_lsn, NULL, "
        "'proto_version', '1', 'publication_names', %s, 'messages', 'true')",
        [slot, None if upto is None else f"{upto >> 32:X}/{upto & 0xFFFFFFFF:X}", publication],
    ).fetchall()
    out = []
    for lsn, data in rows:
        assert isinstance(lsn, int) and isinstance(data, bytes)
        out.append(_XLOGDATA.pack(b"w", lsn, lsn, 0) + data)
    return out
