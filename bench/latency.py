"""Latency with walflow running live: paced single-row transactions, commit to JetStream.

A change's latency is the JetStream storage timestamp of its message (nanoseconds, from
the delivery metadata) minus its commit timestamp (``metadata.commit_timestamp`` in the
payload, as Postgres recorded the commit). Both clocks are this machine's.

The generator offers a fixed rate: several clients, each with its own schedule derived
from the phase's start (op ``k`` of client ``c`` is due at ``start + (k * clients + c) /
rate``), so a late op does not push the ones after it back: the offered rate does not
drift, and how late the generator itself ran is reported. A phase without a rate goes
as fast as the clients can. Phases run one after another, each drained before the next,
so every message belongs to exactly one phase by its stream sequence.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.jetstream import JetStream, StoredMessage
from bench.monitor import CpuSnapshot, MemorySampler, SlotLagSampler, cpu_seconds
from bench.walflow import DEPLOYMENTS, Target, Walflow, write_config

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class Phase:
    label: str
    rate: int | None  # changes per second offered; None: as fast as the clients go
    seconds: float


class Client:
    """One session writing Sequin's mix (60/30/10) over its own ids, one change per transaction."""

    def __init__(self, dsn: str, index: int, clients: int, pad: int) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.index = index
        self.clients = clients
        self.pad = pad
        self.i = 0  # ops so far, across phases
        self.lo = self.hi = 0  # live rows: ids lo..hi-1 (times clients, plus index)
        self.ops = 0
        self.late_max = 0.0
        self.error: BaseException | None = None

    def _id(self, k: int) -> int:
        return k * self.clients + self.index

    def one(self) -> None:
        text = f"{self.i:032x}".ljust(self.pad, "x")
        if self.i % 10 < 6 or self.hi == self.lo:
            self.conn.execute(
                "INSERT INTO benchmark_records (id, string_field, numeric_field, timestamp_field, json_field) "
                "VALUES (%s, %s, %s, now(), %s::jsonb)",
                [self._id(self.hi), text, self.i * 1.5, json.dumps({"client": self.index, "seq": self.i})],
            )
            self.hi += 1
        elif self.i % 10 < 9:
            k = self.lo + (self.i * 7919) % (self.hi - self.lo)
            self.conn.execute(
                "UPDATE benchmark_records SET string_field = %s, numeric_field = numeric_field + 1, "
                "updated_at = now() WHERE id = %s",
                [text, self._id(k)],
            )
        else:
            self.conn.execute("DELETE FROM benchmark_records WHERE id = %s", [self._id(self.lo)])
            self.lo += 1
        self.i += 1

    def run_phase(self, start: float, end: float, rate: int | None) -> None:
        self.ops = 0
        self.late_max = 0.0
        try:
            while True:
                now = time.monotonic()
                if rate is not None:
                    due = start + (self.ops * self.clients + self.index) / rate
                    if due >= end:
                        return
                    if due > now:
                        time.sleep(due - now)  # pacing by the clock, not a wait for a condition
                    else:
                        self.late_max = max(self.late_max, now - due)
                elif now >= end:
                    return
                self.one()
                self.ops += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the phase
            self.error = exc


def percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank p50/p95/p99 and max, in the unit of ``values``."""
    if not values:
        return {}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {"p50": rank(0.50), "p95": rank(0.95), "p99": rank(0.99), "max": ordered[-1]}


def _commit_ns(message: StoredMessage) -> int:
    stamp = json.loads(message.data)["metadata"]["commit_timestamp"]
    return int((datetime.fromisoformat(stamp) - _EPOCH) // _US * 1000)


def run_latency(
    js: JetStream, workdir: Path, target: Target, *, dsn: str, phases: list[Phase], clients: int, pad: int,
    timeout: float,
) -> dict[str, Any]:
    """walflow (one worker) running live through ``phases``; latency percentiles per phase."""
    config = write_config(workdir / f"{target.stream}.yaml", target)
    writers = [Client(dsn, c, clients, pad) for c in range(clients)]
    ranges: list[tuple[Phase, int, int, dict[str, Any]]] = []
    try:
        with Walflow(config, DEPLOYMENTS["w1"]) as wf:
            memory = MemorySampler(wf.pids)
            lag = SlotLagSampler(dsn, target.slot)
            memory.start()
            lag.start()
            try:
                # one change before the phases: walflow is up and publishing once it is stored
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("INSERT INTO benchmark_records (id, string_field) VALUES (-1, 'warm-up')")
                expected = 1
                _drain(js, target.stream, expected, wf, timeout)
                cpu_start = sum(cpu_seconds(p) for p in wf.pids)
                for phase in phases:
                    ops, figures = _offer(writers, phase, lag.started)
                    stopped = time.monotonic()
                    _drain(js, target.stream, expected + ops, wf, timeout)
                    figures["drained_after_s"] = round(time.monotonic() - stopped, 3)
                    ranges.append((phase, expected + 1, expected + ops, figures))
                    expected += ops
                cpu_end = sum(cpu_seconds(p) for p in wf.pids)
            finally:
                memory.stop()
                lag.stop()
    finally:
        for w in writers:
            w.conn.close()
    by_seq = {m.seq: m for m in js.read(target.stream)}
    result: dict[str, Any] = {
        "deployment": DEPLOYMENTS["w1"].label,
        "peak_rss_mb": round(memory.peak_process / 2**20, 1),
        "cpu_us_per_change": round((cpu_end - cpu_start) * 1e6 / max(expected - 1, 1), 2),
        "slot_lag": [(t, round(b / 2**20, 3)) for t, b in lag.series],
        "phases": {},
    }
    for phase, first, last, generator in ranges:
        messages = [by_seq[seq] for seq in range(first, last + 1)]
        commits = [_commit_ns(m) for m in messages]
        latencies = [(m.time_ns - c) / 1e6 for m, c in zip(messages, commits, strict=True)]
        span = (max(m.time_ns for m in messages) - min(commits)) / 1e9
        result["phases"][phase.label] = {
            **generator,
            # the end-to-end rate: from the phase's first commit to its last stored message
            "first_commit_to_last_stored_per_s": round(len(messages) / span) if span > 0 else None,
            "latency_ms": {k: round(v, 2) for k, v in percentiles(latencies).items()},
        }
    return result


def _offer(writers: list[Client], phase: Phase, origin: float) -> tuple[int, dict[str, Any]]:
    """Run one phase on every client at once; the changes made, and what the generator achieved
    (times relative to ``origin``, the slot-lag series' start, for the chart)."""
    machine = CpuSnapshot.take()
    start = time.monotonic() + 0.05
    end = start + phase.seconds
    threads = [threading.Thread(target=w.run_phase, args=(start, end, phase.rate)) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stopped = time.monotonic()
    for w in writers:
        if w.error is not None:
            raise RuntimeError(f"latency generator failed: {w.error}") from w.error
    ops = sum(w.ops for w in writers)
    return ops, {
        "offered_per_s": phase.rate,
        "achieved_per_s": round(ops / (stopped - start)),
        "changes": ops,
        "generator_late_max_ms": round(max(w.late_max for w in writers) * 1000, 1),
        **CpuSnapshot.take().shares_since(machine),
        "lag_from_s": round(start - origin, 3),
        "lag_to_s": round(stopped - origin, 3),
    }


def _drain(js: JetStream, stream: str, count: int, wf: Walflow, timeout: float) -> None:
    """Wait until the stream holds ``count`` messages (walflow alive, within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while (have := js.count(stream)) < count:
        wf.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"latency run: {have}/{count} messages after {timeout:.0f}s")
        time.sleep(0.05)
