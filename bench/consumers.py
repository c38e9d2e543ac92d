"""The consumers that read one workload's WAL: the source ceiling, walflow, the sink ceilings.

Catch-up method: the workload is already in the WAL (each consumer has its own slot made
before it), so a consumer's rate is how fast it can drain a backlog, not how fast a
generator writes.

- **source ceiling**: ``pg_recvlogical`` with pgoutput and the same publication, writing
  to ``/dev/null`` and exiting at the workload's end LSN: Postgres's decoding and the
  replication protocol, with no consumer work at all.
- **walflow end to end**: from the first to the last message JetStream stored (its own
  timestamps), and the wall time from process start; CPU per change from ``/proc`` between
  the first stored message and the last (startup excluded); peak RSS; slot lag.
- **sink ceilings**: walflow's messages read back from its stream and published again
  into a fresh stream, once with nats-py's ``publish_async`` and once with walflow's own
  :class:`AckPublisher`: how fast Python can get these exact payloads acknowledged.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nats
import psycopg

from bench.jetstream import JetStream, StoredMessage
from bench.monitor import CpuSnapshot, MemorySampler, SlotLagSampler, cpu_seconds
from bench.walflow import Deployment, Target, Walflow, write_config
from bench.workloads import current_lsn
from config.schema import NatsDestination
from connectors.nats.connection import connect
from connectors.nats.publisher import AckPublisher
from connectors.postgres.protocol import lsn_to_str, str_to_lsn
from core.events import Message
from embedded import ServerError, wait_for
from transforms import route

#: How often the stream's message count is polled while walflow runs.
POLL_INTERVAL = 0.05


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


def walflow_catchup(
    js: JetStream, workdir: Path, target: Target, deployment: Deployment, *, dsn: str, changes: int,
    end_lsn: int | None, timeout: float, initial_backfill: bool = False,
) -> dict[str, Any]:
    """Run walflow until its stream holds all ``changes``; measure what it took.

    ``end_lsn`` None: the slot must pass the server's WAL position at the moment the stream
    is complete (a backfill writes its own watermarks, so where its WAL ends is known only then).
    """
    config = write_config(workdir / f"{target.stream}.yaml", target, initial_backfill=initial_backfill)
    with Walflow(config, deployment) as wf:
        began = time.monotonic()
        memory = MemorySampler(wf.pids)
        lag = SlotLagSampler(dsn, target.slot)
        memory.start()
        lag.start()
        try:
            # CPU is counted from the first stored message on: startup (imports, connecting,
            # building the dataflow) is a constant, not a cost per change.
            baseline: tuple[int, float, CpuSnapshot] | None = None  # stored count, walflow CPU s, machine
            deadline = began + timeout
            while (count := js.count(target.stream)) < changes:
                wf.check()
                if baseline is None and count > 0:
                    baseline = (count, sum(cpu_seconds(p) for p in wf.pids), CpuSnapshot.take())
                    first_at = time.monotonic() - lag.started
                if time.monotonic() > deadline:
                    raise RuntimeError(f"walflow {deployment.label}: {count}/{changes} messages after {timeout:.0f}s")
                time.sleep(POLL_INTERVAL)
            done = time.monotonic()
            cpu_end = sum(cpu_seconds(p) for p in wf.pids)
            if baseline is None:  # everything arrived between two polls
                baseline = (0, 0.0, CpuSnapshot.take())
                first_at = done - lag.started
            if end_lsn is None:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    end_lsn = current_lsn(conn)
            shares = CpuSnapshot.take().shares_since(baseline[2])
            # The slot is confirmed one to two epochs after JetStream has the messages: how
            # long until Postgres may drop the workload's WAL.
            try:
                wait_for(lambda: _slot_confirmed(dsn, target.slot) >= end_lsn, timeout=10, what="the slot",
                         interval=0.1)
                slot_caught_up: float | None = round(time.monotonic() - began, 3)
            except ServerError:  # not within 10 s: reported as null, not a failed run
                slot_caught_up = None
        finally:
            memory.stop()
            lag.stop()
    stored = js.count(target.stream)  # duplicates would show here, after the run settled
    first, last = js.first_last_time(target.stream)
    stored_span = (last - first).total_seconds()
    cpu_changes = changes - baseline[0]
    return {
        "deployment": deployment.label,
        "messages": stored,
        "changes_per_s": round((changes - 1) / stored_span) if stored_span > 0 else None,
        "first_to_last_stored_s": round(stored_span, 3),
        "wall_incl_startup_s": round(done - began, 3),
        "changes_per_s_incl_startup": round(changes / (done - began)),
        "cpu_us_per_change": round((cpu_end - baseline[1]) * 1e6 / cpu_changes, 2) if cpu_changes > 0 else None,
        "cpu_total_s": round(cpu_end, 2),
        **shares,
        "peak_rss_mb": round(memory.peak_process / 2**20, 1),
        "peak_rss_total_mb": round(memory.peak_total / 2**20, 1),
        "slot_confirmed_after_s": slot_caught_up,
        # while the stream filled: whether the slot kept moving, and how far it trailed
        **lag.progress(first_at, done - lag.started),
        "slot_lag": [(t, round(b / 2**20, 3)) for t, b in lag.series],
    }


def _unescape(token: str) -> str:
    """The name a subject token stands for (``core/tokens.py``'s rule, reversed)."""
    return "" if token == "%" else unquote(token, errors="surrogatepass")


def _as_made(messages: list[StoredMessage], prefix: str) -> tuple[str, list[Message]]:
    """walflow's messages as its envelope made them, read back from their subjects, and the
    database they name: a publisher given another prefix puts them where a fresh stream takes them."""
    cut, database = len(prefix) + 1, ""
    out: list[Message] = []
    for m in messages:
        database, schema, table, action = (_unescape(token) for token in m.subject[cut:].split("."))
        out.append(Message(schema, table, action, m.data, m.msg_id))
    return database, out


async def _publish_async(url: str, prefix: str, database: str, messages: list[Message], window: int) -> float:
    nc = await nats.connect(url, connect_timeout=5)
    try:
        js = nc.jetstream(publish_async_max_pending=window)
        subjects = [route.subject(prefix, database, m.schema, m.table, m.action) for m in messages]
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


async def _ack_publisher(
    host: str, port: int, prefix: str, database: str, messages: list[Message], window: int, batch: int
) -> float:
    nc = await connect(NatsDestination.model_validate({"type": "nats", "host": host, "port": port}), name="bench")
    try:
        publisher = AckPublisher(
            nc, subject_prefix=prefix, database=database, window=window, ack_timeout=10.0, label="bench"
        )
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
    host, port = js.url.removeprefix("nats://").rsplit(":", 1)
    results: dict[str, Any] = {"messages": len(messages), "window": window,
                               "avg_payload_bytes": round(sum(len(m.data) for m in messages) / max(len(messages), 1))}
    runs: dict[str, Callable[[str, str, list[Message]], Coroutine[Any, Any, float]]] = {
        "publish_async": lambda prefix, db, msgs: _publish_async(js.url, prefix, db, msgs, window),
        "ack_publisher": lambda prefix, db, msgs: _ack_publisher(host, int(port), prefix, db, msgs, window, batch),
    }
    database, made = _as_made(messages, source_prefix)
    for name, publish in runs.items():
        prefix = f"ceil_{name}_{tag}"
        stream = prefix.upper()
        js.add_stream(stream, [f"{prefix}.>"])
        try:
            machine = CpuSnapshot.take()
            seconds = js.run(publish(prefix, database, made))
            shares = CpuSnapshot.take().shares_since(machine)
            stored = js.count(stream)
            if stored != len(messages):
                raise RuntimeError(f"{name}: the stream holds {stored} of {len(messages)} messages")
        finally:
            js.delete_stream(stream)
        results[name] = {"seconds": round(seconds, 3), "msgs_per_s": round(len(messages) / seconds), **shares}
    return results
