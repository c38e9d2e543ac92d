"""The consumers that read one workload's WAL: the source ceiling, walflow, the sink ceilings.

Catch-up method: the workload is already in the WAL (each consumer has its own slot made
before it), so a consumer's rate is how fast it can drain a backlog, not how fast a
generator writes.

- **source ceiling**: ``pg_recvlogical`` with pgoutput and the same publication, writing
  to ``/dev/null`` and exiting at the workload's end LSN: Postgres's decoding and the
  replication protocol, with no consumer work at all.
- **walflow end to end**: from the first to the last message JetStream stored (its own
  timestamps), and the wall time from process start; CPU per change from ``/proc`` between
  the first stored message and the last (startup excluded), per process and per thread;
  which process holds the slot (the one with the slot's reader thread) and how many
  changes each published (its ``/metrics``); peak RSS; slot lag. One run may read several
  databases (:func:`walflow_feeds`): then per database as well.
- **sink ceilings**: walflow's messages read back from its stream and published again
  into a fresh stream, once with nats-py's ``publish_async`` and once with walflow's own
  :class:`AckPublisher`: how fast Python can get these exact payloads acknowledged.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nats
import psycopg

from bench.jetstream import JetStream, StoredMessage
from bench.monitor import CpuSnapshot, MemorySampler, ProcessCpu, SlotLagSampler
from bench.walflow import DATABASE_NAME, Deployment, Shaping, Target, Walflow, counts, write_config
from bench.workloads import current_lsn
from config.schema import NatsDestination
from connectors.nats.connection import connect
from connectors.nats.publisher import AckPublisher
from connectors.postgres.protocol import lsn_to_str, str_to_lsn
from core.message import Message
from core.subjects import subject
from embedded import ServerError, wait_for

#: How often the stream's message count is polled while walflow runs.
POLL_INTERVAL = 0.05
#: How long the slot may take to be confirmed past the workload once the stream holds it
#: (one to two epochs: Bytewax's default epoch, without ``-s``, is 10 s).
SLOT_CONFIRM_TIMEOUT = 30.0


def source_ceiling(
    recvlogical: Path, *, port: int, database: str, slot: str, publication: str, end_lsn: int, changes: int
) -> dict[str, Any]:
    """``pg_recvlogical`` over the workload, timed from start to its exit at ``end_lsn``."""
    argv = [
        str(recvlogical), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", database,
        "-S", slot, "--plugin=pgoutput", "-o", "proto_version=1", "-o", f"publication_names={publication}",
        "--start", "-f", "/dev/null", f"--endpos={lsn_to_str(end_lsn)}", "--no-loop",
    ]  # fmt: skip
    machine = CpuSnapshot.take()
    began = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    seconds = time.monotonic() - began
    if result.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({result.returncode}): {result.stderr.strip()}")
    return {"seconds": round(seconds, 3), "changes_per_s": round(changes / seconds),
            **CpuSnapshot.take().shares_since(machine)}


def _slot_confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
    return str_to_lsn(str(row[0])) if row and row[0] else 0


@dataclass(frozen=True)
class Feed:
    """One database a walflow run reads: where to, and what it must deliver. ``end_lsn`` None:
    the slot must pass the server's WAL position at the moment the stream is complete (a
    backfill writes its own watermarks, so where its WAL ends is known only then)."""

    target: Target
    dsn: str
    changes: int
    end_lsn: int | None


def _confirmed_past(feed: Feed, lsn: int) -> Callable[[], bool]:
    return lambda: _slot_confirmed(feed.dsn, feed.target.slot) >= lsn


def reader_thread(slot: str) -> str:
    """The OS name of the thread that reads ``slot`` (``walflow-reader-<slot>``, as
    ``bench/threadnames`` names it): the process that has it holds the slot."""
    return f"reader-{slot}"[:15]


def walflow_catchup(
    js: JetStream, workdir: Path, target: Target, deployment: Deployment, *, dsn: str, changes: int,
    end_lsn: int | None, timeout: float, initial_backfill: bool = False, shaping: Shaping | None = None,
) -> dict[str, Any]:
    """Run walflow until its stream holds all ``changes``; measure what it took. ``shaping``:
    the sink's shaping (:data:`bench.walflow.SHAPINGS`), None for none."""
    run = walflow_feeds(js, workdir, [Feed(target, dsn, changes, end_lsn)], deployment, timeout=timeout,
                        initial_backfill=initial_backfill, shaping=shaping)
    (database,) = run.pop("databases").values()
    return {**run, **database}


def walflow_feeds(
    js: JetStream, workdir: Path, feeds: list[Feed], deployment: Deployment, *, timeout: float,
    initial_backfill: bool = False, names: tuple[str, ...] = (DATABASE_NAME,), shaping: Shaping | None = None,
) -> dict[str, Any]:
    """Run walflow over ``feeds`` (one config: a database and a sink per feed, named by
    ``names``) until every stream holds its changes; measure what it took, in all and per
    database, per process and per thread."""
    config = write_config(workdir / f"{feeds[0].target.stream}.yaml", [f.target for f in feeds],
                          initial_backfill=initial_backfill, names=names, shaping=shaping)
    total = sum(f.changes for f in feeds)
    with Walflow(config, deployment) as wf:
        began = time.monotonic()
        memory = MemorySampler(wf.pids)
        lags = [SlotLagSampler(f.dsn, f.target.slot) for f in feeds]
        memory.start()
        for lag in lags:
            lag.start()
        try:
            # CPU is counted from the first stored message on: startup (imports, connecting,
            # building the dataflow) is a constant, not a cost per change.
            baseline: tuple[int, list[ProcessCpu | None], CpuSnapshot] | None = None  # stored, walflow, machine
            deadline = began + timeout
            while (count := sum(js.count(f.target.stream) for f in feeds)) < total:
                wf.check()
                if baseline is None and count > 0:
                    baseline = (count, [ProcessCpu.take(p) for p in wf.pids], CpuSnapshot.take())
                    first_at = time.monotonic()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"walflow {deployment.label}: {count}/{total} messages after {timeout:.0f}s")
                time.sleep(POLL_INTERVAL)
            done = time.monotonic()
            cpu_end = [ProcessCpu.take(p) for p in wf.pids]
            if baseline is None:  # everything arrived between two polls
                baseline = (0, [None] * len(cpu_end), CpuSnapshot.take())
                first_at = done
            shares = CpuSnapshot.take().shares_since(baseline[2])
            end_lsns: list[int] = []
            for feed in feeds:
                if feed.end_lsn is None:
                    with psycopg.connect(feed.dsn, autocommit=True) as conn:
                        end_lsns.append(current_lsn(conn))
                else:
                    end_lsns.append(feed.end_lsn)
            # The slot is confirmed one to two epochs after JetStream has the messages: how
            # long until Postgres may drop the workload's WAL (Bytewax's default epoch is 10 s).
            caught_up: list[float | None] = []
            for feed, end in zip(feeds, end_lsns, strict=True):
                try:
                    wait_for(_confirmed_past(feed, end), timeout=SLOT_CONFIRM_TIMEOUT, what="the slot",
                             interval=0.1)
                    caught_up.append(round(time.monotonic() - began, 3))
                except ServerError:  # not within the timeout: reported as null, not a failed run
                    caught_up.append(None)
            metrics = wf.metrics()
        finally:
            memory.stop()
            for lag in lags:
                lag.stop()
        pids = wf.pids
    cpu_changes = total - baseline[0]

    def per_change(seconds: float) -> float | None:
        return round(seconds * 1e6 / cpu_changes, 2) if cpu_changes > 0 else None

    databases: dict[str, Any] = {}
    spans: list[tuple[float, float]] = []
    for name, feed, lag, confirmed in zip(names, feeds, lags, caught_up, strict=True):
        stored = js.count(feed.target.stream)  # duplicates would show here, after the run settled
        first, last = js.first_last_time(feed.target.stream)
        spans.append((first.timestamp(), last.timestamp()))
        stored_span = (last - first).total_seconds()
        databases[name] = {
            "slot": feed.target.slot,
            "stream": feed.target.stream,
            "changes": feed.changes,
            "messages": stored,
            "changes_per_s": round((feed.changes - 1) / stored_span) if stored_span > 0 else None,
            "first_to_last_stored_s": round(stored_span, 3),
            "slot_confirmed_after_s": confirmed,
            # while the streams filled: whether the slot kept moving, and how far it trailed
            **lag.progress(first_at - lag.started, done - lag.started),
            "slot_lag": [(t, round(b / 2**20, 3)) for t, b in lag.series],
        }
    processes = _processes(pids, baseline[1], cpu_end, metrics, memory, feeds, total, per_change)
    for name, feed in zip(names, feeds, strict=True):
        databases[name]["slot_process"] = next((p["index"] for p in processes if feed.target.slot in p["slots"]), None)
    span = max(last for _, last in spans) - min(first for first, _ in spans)
    cpu_total = sum(c.total for c in cpu_end)
    return {
        "deployment": deployment.label,
        "messages": sum(d["messages"] for d in databases.values()),
        "changes_per_s": round((total - 1) / span) if span > 0 else None,
        "first_to_last_stored_s": round(span, 3),
        "wall_incl_startup_s": round(done - began, 3),
        "changes_per_s_incl_startup": round(total / (done - began)),
        "cpu_us_per_change": per_change(cpu_total - sum(c.total for c in baseline[1] if c is not None)),
        "cpu_total_s": round(cpu_total, 2),
        **shares,
        "peak_rss_mb": round(memory.peak_process / 2**20, 1),
        "peak_rss_total_mb": round(memory.peak_total / 2**20, 1),
        "processes": processes,
        "databases": databases,
    }


def _processes(
    pids: list[int], start: list[ProcessCpu | None], end: list[ProcessCpu], metrics: list[dict[str, Any] | None],
    memory: MemorySampler, feeds: list[Feed], total: int, per_change: Callable[[float], float | None],
) -> list[dict[str, Any]]:
    """Each process of a run: the slots it reads (the reader threads it has), its CPU per
    change of the run and per thread, what it published (its /metrics) and its peak RSS.
    ``cpu_us_per_published`` divides its CPU by its own share of the published changes."""
    out: list[dict[str, Any]] = []
    for i, (pid, before, after, m) in enumerate(zip(pids, start, end, metrics, strict=True)):
        seconds, named = after.since(before)
        published = counts(m, "walflow_changes_published_total", "sink") if m is not None else None
        share = sum(published.values()) / total if published is not None and total else None
        us = per_change(seconds)
        threads = [
            {"name": name, "threads": n, "cpu_us_per_change": per_change(spent)}
            for name, (n, spent) in sorted(named.items(), key=lambda item: -item[1][1])
        ]
        out.append({
            "index": i,
            "pid": pid,
            "slots": [f.target.slot for f in feeds if reader_thread(f.target.slot) in named],
            "cpu_us_per_change": us,
            "published": published,
            "published_share": round(share, 4) if share is not None else None,
            "cpu_us_per_published": round(us / share, 2) if us is not None and share else None,
            "received": sum(counts(m, "walflow_changes_received_total", "table").values()) if m is not None else None,
            "peak_rss_mb": round(memory.peak_each.get(pid, 0) / 2**20, 1),
            "threads": threads,
        })
    return out


def _unescape(token: str) -> str:
    """The name a subject token stands for (``core/tokens.py``'s rule, reversed)."""
    return "" if token == "%" else unquote(token, errors="surrogatepass")


def _as_made(messages: list[StoredMessage], source_prefix: str, prefix: str) -> list[Message]:
    """walflow's messages as its envelope made them, read back from their subjects and moved
    under ``prefix``, where a fresh stream takes them."""
    cut = len(source_prefix) + 1
    out: list[Message] = []
    for m in messages:
        database, schema, table, action = (_unescape(token) for token in m.subject[cut:].split("."))
        out.append(Message(subject(prefix, database, schema, table, action).encode(), m.data, m.msg_id,
                           (f"{schema}.{table}", action)))
    return out


async def _publish_async(url: str, messages: list[Message], window: int) -> float:
    nc = await nats.connect(url, connect_timeout=5)
    try:
        js = nc.jetstream(publish_async_max_pending=window)
        subjects = [m.subject.decode() for m in messages]
        began = time.perf_counter()
        futures = [
            await js.publish_async(subject, m.payload, headers={"Nats-Msg-Id": m.msg_id})
            for subject, m in zip(subjects, messages, strict=True)
        ]
        await js.publish_async_completed()
        seconds = time.perf_counter() - began
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            raise RuntimeError(f"publish_async: {len(failed)} message(s) failed, e.g. {failed[0]}")
        return seconds
    finally:
        await nc.close()


async def _ack_publisher(nats_keys: dict[str, Any], messages: list[Message], window: int, batch: int) -> float:
    nc = await connect(NatsDestination.model_validate({"type": "nats", **nats_keys}), name="bench")
    try:
        publisher = AckPublisher(nc, window=window, ack_timeout=10.0, label="bench")
        await publisher.start()
        began = time.perf_counter()
        for i in range(0, len(messages), batch):
            await publisher.publish(messages[i : i + batch])
        await publisher.settle()
        seconds = time.perf_counter() - began
        await publisher.close()
        return seconds
    finally:
        # walflow's connection logs every disconnect as a warning, a deliberate close included
        quiet = logging.getLogger("walflow.nats")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            await nc.close()
        finally:
            quiet.setLevel(level)


def sink_ceilings(
    js: JetStream, messages: list[StoredMessage], *, source_prefix: str, tag: str, window: int, batch: int = 1000
) -> dict[str, Any]:
    """Publish walflow's own messages again, into a fresh stream per publisher."""
    results: dict[str, Any] = {"messages": len(messages), "window": window,
                               "avg_payload_bytes": round(sum(len(m.data) for m in messages) / max(len(messages), 1))}
    runs: dict[str, Callable[[list[Message]], Coroutine[Any, Any, float]]] = {
        "publish_async": lambda msgs: _publish_async(js.url, msgs, window),
        "ack_publisher": lambda msgs: _ack_publisher(js.destination, msgs, window, batch),
    }
    for name, publish in runs.items():
        prefix = f"ceil_{name}_{tag}"
        stream = prefix.upper()
        made = _as_made(messages, source_prefix, prefix)
        js.add_stream(stream, [f"{prefix}.>"])
        try:
            machine = CpuSnapshot.take()
            seconds = js.run(publish(made))
            shares = CpuSnapshot.take().shares_since(machine)
            stored = js.count(stream)
            if stored != len(messages):
                raise RuntimeError(f"{name}: the stream holds {stored} of {len(messages)} messages")
        finally:
            js.delete_stream(stream)
        results[name] = {"seconds": round(seconds, 3), "msgs_per_s": round(len(messages) / seconds), **shares}
    return results
