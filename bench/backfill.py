"""Backfills: how fast walflow reads a table's existing rows into JetStream, beside COPY.

The table holds ``rows`` rows of a workload's shape, written and vacuumed before walflow's
slot exists (:func:`bench.workloads.write_rows`), so the rows reach walflow only through the
backfill, never through the WAL as well. walflow (one worker) then starts with its sink's
``initial_backfill: true``: it asks for the table, reads it in keyset chunks between
watermarks (``connectors/postgres/backfill_table.py``, ``walflow.backfill``'s settings as shipped)
and publishes every row as a ``read``.

- **walflow's rate** is rows over the time from the first read to the last message
  JetStream stored. A read's payload carries the commit timestamp of its chunk's high
  watermark, written right after the chunk's ``SELECT``, so the first message stored says
  when the first chunk had been read; startup (imports, connecting, the request through the
  slot) is not in it, and is in the rate from process start kept beside it.
- **The ceiling** is ``COPY (SELECT * FROM benchmark_records) TO STDOUT`` through psycopg,
  every block read and thrown away: Postgres handing the same rows to a Python client as
  text (the format the backfill reads them in), with nothing done to them. It runs before
  and after walflow on the same table, and the faster counts: on a noisy machine one slow
  moment must not flatter walflow's ratio.
- **The slot** must keep moving while a backfill runs (the partition holds it back only to
  the newest chunk's low watermark): :meth:`bench.monitor.SlotLagSampler.progress` counts
  its confirmed LSN's advances and the longest it stood still while the stream filled.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.consumers import walflow_catchup
from bench.jetstream import JetStream
from bench.latency import commit_ns
from bench.monitor import CpuSnapshot
from bench.walflow import DEPLOYMENTS, Target

#: What the ceiling reads: every column, as the backfill does, in the server's own order.
COPY_QUERY = "COPY (SELECT * FROM benchmark_records) TO STDOUT"
#: A backfill this long (seconds) must have moved its slot: walflow confirms each epoch
#: (1 s) up to the newest chunk's low watermark, so a slot that stood still is held back.
SLOT_STILL_S = 5.0


def copy_table(dsn: str) -> dict[str, Any]:
    """One ``COPY … TO STDOUT`` of the whole table, the data discarded; its rows and rate."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        machine = CpuSnapshot.take()
        began = time.perf_counter()
        with cur.copy(COPY_QUERY) as copy:
            for _block in copy:
                pass
        seconds = time.perf_counter() - began
        shares = CpuSnapshot.take().shares_since(machine)
        rows = cur.rowcount
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds), **shares}


def _read_times(js: JetStream, stream: str) -> tuple[float, float, list[str]]:
    """The first read's time (its chunk's high watermark's commit), the last message's
    storage time (seconds since the epoch), and the actions of those two (both must be reads)."""
    first, last = js.first_last(stream)
    assert last.time is not None and first.data is not None and last.data is not None
    actions = [str(json.loads(data)["action"]) for data in (first.data, last.data)]
    return commit_ns(first.data) / 1e9, last.time.timestamp(), actions


def measure(js: JetStream, workdir: Path, target: Target, *, dsn: str, rows: int, timeout: float) -> dict[str, Any]:
    """COPY, walflow's backfill of the table, COPY again; the figures of all three."""
    copies = [copy_table(dsn)]
    run = walflow_catchup(js, workdir, target, DEPLOYMENTS["w1"], dsn=dsn, changes=rows, end_lsn=None,
                          timeout=timeout, initial_backfill=True)
    first_read, last_stored, actions = _read_times(js, target.stream)
    copies.append(copy_table(dsn))
    seconds = last_stored - first_read
    best = max(copies, key=lambda c: int(c["rows_per_s"]))
    rate = round(rows / seconds) if seconds > 0 else None
    return {
        "copy": {"rows_per_s": best["rows_per_s"], "runs": copies},
        "walflow": {
            **run,
            "rows_per_s": rate,
            "first_read_to_last_stored_s": round(seconds, 3),
            "first_last_actions": actions,
        },
        "walflow_over_copy": round(rate / best["rows_per_s"], 3) if rate else None,
    }


def problems(run: dict[str, Any], rows: int) -> list[str]:
    """What is wrong with walflow's backfill run beyond its speed: rows missing or twice,
    messages that are not reads, a slot that did not move."""
    found: list[str] = []
    if run["messages"] != rows or set(run["first_last_actions"]) != {"read"}:
        found.append(f"the stream holds {run['messages']:,} messages for {rows:,} rows "
                     f"(the first and last: {', '.join(run['first_last_actions'])})")
    if not run["slot_confirmed_moves"] and run["first_read_to_last_stored_s"] > SLOT_STILL_S:
        found.append(f"the slot's confirmed LSN did not move in the {run['first_read_to_last_stored_s']:.1f} s "
                     "the stream took to fill")
    return found
