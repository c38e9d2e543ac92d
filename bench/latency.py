"""Latency with walflow running live: pgbench offers single-row transactions, commit to JetStream.

A change's latency is the JetStream storage timestamp of its message (nanoseconds, from
the delivery metadata) minus its commit timestamp (``metadata.commit_timestamp`` in the
payload, as Postgres recorded the commit). Both clocks are this machine's.

The load comes from ``pgbench`` (shipped with the server binaries), not from Python: on a
small machine a Python generator takes a large share of the CPU walflow needs and falls
behind its own schedule, so its bursts end up in the latencies. pgbench runs a custom
script (:data:`MIX_SCRIPT`, Sequin's 60/30/10 mix) from ``clients`` sessions; a phase with
a rate uses pgbench's throttling (``-R``: transactions scheduled by a Poisson process over
all clients), and pgbench's per-transaction log says how late each one started against
that schedule (its *schedule lag*, reported beside the latencies). A phase without a rate
goes as fast as pgbench can.

Phases run one after another, each settled before the next: after pgbench exits, the
phase ends at ``pg_current_wal_lsn()``; once walflow's slot is confirmed past it (walflow
confirms only what JetStream acknowledged), the stream's last sequence is the phase's
boundary. Every message thus belongs to exactly one phase by its stream sequence, and the
count comes from what was stored; pgbench's count of transactions is kept beside it (the
script changes exactly one row per transaction, so the two must agree).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.jetstream import JetStream
from bench.monitor import CpuSnapshot, MemorySampler, SlotLagSampler, cpu_seconds
from bench.walflow import DEPLOYMENTS, Target, Walflow, write_config
from connectors.postgres.protocol import str_to_lsn
from embedded import wait_for

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

#: Sequin's mix on ``benchmark_records``, one single-row transaction per script run: 60 %
#: inserts, 30 % updates, 10 % deletes, chosen at random. pgbench keeps a client's variables
#: from one run of the script to the next, so each client tracks its own live rows: the ids
#: ``base + k * clients + client_id`` for ``lo <= k < hi``. Inserts take the next ``k`` (no
#: two clients collide), updates a random live row, deletes the oldest: every statement
#: changes exactly one row. ``base`` (above every id so far), ``clients``, ``pad`` (length of
#: ``string_field``), ``lo`` and ``hi`` (0) come from ``-D``.
MIX_SCRIPT = r"""
\set r random(1, 100)
\if :r <= 60 or :hi = :lo
\set id :base + :hi * :clients + :client_id
\set hi :hi + 1
INSERT INTO benchmark_records (id, string_field, numeric_field, timestamp_field, json_field)
VALUES (:id::int, rpad(md5(random()::text), :pad::int, md5(:id::text)), round((random() * 1e6)::numeric, 2), now(),
        jsonb_build_object('client', :client_id::int, 'seq', :hi::int, 'tag', 'bench'));
\elif :r <= 90
\set id :base + random(:lo, :hi - 1) * :clients + :client_id
UPDATE benchmark_records
   SET string_field = rpad(md5(random()::text), :pad::int, md5(:id::text)), numeric_field = numeric_field + 1,
       updated_at = now()
 WHERE id = :id::int;
\else
\set id :base + :lo * :clients + :client_id
\set lo :lo + 1
DELETE FROM benchmark_records WHERE id = :id::int;
\endif
""".lstrip()

INSTALL_HINT = "pgbench ships with the PostgreSQL server binaries (Debian: postgresql-15, beside initdb)"


@dataclass(frozen=True)
class Phase:
    label: str
    rate: int | None  # transactions (= changes) per second offered; None: as fast as pgbench goes
    seconds: float


def find_pgbench(bindir: Path) -> Path:
    """``pgbench`` next to the server's own binaries (as ``pg_recvlogical`` is found)."""
    path = bindir / "pgbench"
    if not path.is_file():
        raise RuntimeError(f"latency: no pgbench in {bindir}; {INSTALL_HINT}")
    return path


def percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank p50/p95/p99 and max, in the unit of ``values``."""
    if not values:
        return {}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {"p50": rank(0.50), "p95": rank(0.95), "p99": rank(0.99), "max": ordered[-1]}


def commit_ns(payload: bytes) -> int:
    """The commit timestamp in walflow's payload, in ns since the epoch (for a backfill's
    read: its chunk's high watermark, written right after the chunk's ``SELECT``)."""
    stamp = json.loads(payload)["metadata"]["commit_timestamp"]
    return int((datetime.fromisoformat(stamp) - _EPOCH) // _US * 1000)


@dataclass(frozen=True)
class Pgbench:
    """How to start pgbench against the latency database."""

    binary: Path
    dsn: str
    script: Path
    clients: int
    pad: int

    def argv(self, phase: Phase, base: int, log_prefix: Path | None) -> list[str]:
        conn = conninfo_to_dict(self.dsn)
        jobs = max(1, min(self.clients, os.cpu_count() or 1))
        argv = [
            str(self.binary), "-h", str(conn.get("host", "127.0.0.1")), "-p", str(conn.get("port", 5432)),
            "-U", str(conn.get("user", "postgres")),
            "-n", "-M", "prepared", "-c", str(self.clients), "-j", str(jobs), "-f", str(self.script),
            "-T", str(max(1, round(phase.seconds))),
            "-D", f"base={base}", "-D", f"clients={self.clients}", "-D", f"pad={self.pad}", "-D", "lo=0", "-D", "hi=0",
        ]  # fmt: skip
        if phase.rate is not None:
            argv += ["-R", str(phase.rate)]
        if log_prefix is not None:
            argv += ["-l", f"--log-prefix={log_prefix}"]
        return [*argv, str(conn.get("dbname", "postgres"))]


def run_latency(
    js: JetStream, workdir: Path, target: Target, *, dsn: str, pgbench: Path, phases: list[Phase], clients: int,
    pad: int, timeout: float,
) -> dict[str, Any]:
    """walflow (one worker) running live through ``phases``; latency percentiles per phase."""
    config = write_config(workdir / f"{target.stream}.yaml", target)
    script = workdir / "latency-mix.sql"
    script.write_text(MIX_SCRIPT)
    generator = Pgbench(pgbench, dsn, script, clients, pad)
    ranges: list[tuple[Phase, int, int, dict[str, Any]]] = []
    with Walflow(config, DEPLOYMENTS["w1"]) as wf, psycopg.connect(dsn, autocommit=True) as conn:
        memory = MemorySampler(wf.pids)
        lag = SlotLagSampler(dsn, target.slot)
        memory.start()
        lag.start()
        try:
            # one change before the phases: walflow is up and publishing once it is stored
            conn.execute("INSERT INTO benchmark_records (id, string_field) VALUES (-1, 'warm-up')")
            wait_for(lambda: js.last_seq(target.stream) >= 1, timeout=timeout, what="walflow's first message",
                     check=wf.check, interval=0.05)
            last = _settle(conn, js, target, wf, timeout)
            cpu_start = sum(cpu_seconds(p) for p in wf.pids)
            for i, phase in enumerate(phases):
                row = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM benchmark_records").fetchone()
                assert row is not None
                figures = _offer(generator, phase, int(row[0]), workdir / f"pgbench-{i}", lag.started)
                stopped = time.monotonic()
                end = _settle(conn, js, target, wf, timeout)
                figures["slot_confirmed_after_s"] = round(time.monotonic() - stopped, 3)
                ranges.append((phase, last + 1, end, figures))
                last = end
            cpu_end = sum(cpu_seconds(p) for p in wf.pids)
        finally:
            memory.stop()
            lag.stop()
    by_seq = {m.seq: m for m in js.read(target.stream)}
    result: dict[str, Any] = {
        "deployment": DEPLOYMENTS["w1"].label,
        "generator": f"pgbench -c {clients} -M prepared, Sequin's 60/30/10 mix, one change per transaction",
        "peak_rss_mb": round(memory.peak_process / 2**20, 1),
        "cpu_us_per_change": round((cpu_end - cpu_start) * 1e6 / max(last - 1, 1), 2),
        "slot_lag": [(t, round(b / 2**20, 3)) for t, b in lag.series],
        "phases": {},
    }
    for phase, first, end, figures in ranges:
        messages = [by_seq[seq] for seq in range(first, end + 1)]
        commits = [commit_ns(m.data) for m in messages]
        latencies = [(m.time_ns - c) / 1e6 for m, c in zip(messages, commits, strict=True)]
        last_stored = max((m.time_ns for m in messages), default=0)
        span = (last_stored - min(commits)) / 1e9 if messages else 0.0
        stopped_ns = figures.pop("stopped_ns")
        result["phases"][phase.label] = {
            **figures,
            "changes": len(messages),
            # how long after pgbench's exit the phase's last change was stored (0: walflow kept up)
            "drained_after_s": round(max(last_stored - stopped_ns, 0) / 1e9, 3) if messages else None,
            # the end-to-end rate: from the phase's first commit to its last stored message
            "first_commit_to_last_stored_per_s": round(len(messages) / span) if span > 0 else None,
            "latency_ms": {k: round(v, 2) for k, v in percentiles(latencies).items()},
            **_by_second(commits, latencies),
        }
    return result


def _by_second(commits: list[int], latencies: list[float]) -> dict[str, Any]:
    """Latency per second of the phase (by commit time): whether a tail is the phase's steady
    state or one stall (another job taking the machine for a moment shows as one bad second)."""
    if not commits:
        return {}
    first = min(commits)
    seconds: dict[int, list[float]] = {}
    for commit, ms in zip(commits, latencies, strict=True):
        seconds.setdefault((commit - first) // 10**9, []).append(ms)
    rows = [(s, len(v), percentiles(v)) for s, v in sorted(seconds.items())]
    p99s = sorted(p["p99"] for _, _, p in rows)
    return {
        "p99_of_seconds_ms": {"median": round(p99s[len(p99s) // 2], 2), "max": round(p99s[-1], 2)},
        "by_second": [[s, n, round(p["p50"], 1), round(p["p99"], 1), round(p["max"], 1)] for s, n, p in rows],
    }


def _settle(conn: psycopg.Connection[tuple[Any, ...]], js: JetStream, target: Target, wf: Walflow,
            timeout: float) -> int:
    """Wait until walflow's slot is confirmed past everything committed so far; then the
    stream holds all of it, and its last sequence is returned."""
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    lsn = str_to_lsn(str(row[0]))

    def confirmed() -> bool:
        state = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [target.slot]
        ).fetchone()
        return state is not None and state[0] is not None and str_to_lsn(str(state[0])) >= lsn

    wait_for(confirmed, timeout=timeout, what=f"slot {target.slot} to pass {row[0]}", check=wf.check, interval=0.05)
    return js.last_seq(target.stream)


#: pgbench's summary lines that the results keep.
_SUMMARY = {
    "transactions": re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE),
    "failed": re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE),
    "tps": re.compile(r"^tps = ([\d.]+)", re.MULTILINE),
    "latency_avg_ms": re.compile(r"^latency average = ([\d.]+) ms", re.MULTILINE),
    "lag_avg_ms": re.compile(r"^rate limit schedule lag: avg ([\d.]+)", re.MULTILINE),
}


def _offer(generator: Pgbench, phase: Phase, base: int, log_prefix: Path, origin: float) -> dict[str, Any]:
    """Run pgbench for one phase; what it achieved, its schedule lag and CPU, and how busy the
    machine was (times relative to ``origin``, the slot-lag series' start, for the chart)."""
    throttled = phase.rate is not None
    argv = generator.argv(phase, base, log_prefix if throttled else None)
    machine = CpuSnapshot.take()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=phase.seconds + 120, check=False)
    stopped = time.monotonic()
    stopped_ns = time.time_ns()
    shares = CpuSnapshot.take().shares_since(machine)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    pgbench_cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {' '.join(argv)}\n{done.stderr.strip()[-2000:]}")
    summary: dict[str, float] = {}
    for key, pattern in _SUMMARY.items():
        if match := pattern.search(done.stdout):
            summary[key] = float(match.group(1))
    schedule_lag: dict[str, float] | None = None
    if throttled:
        lags = _log_lags(log_prefix)
        schedule_lag = {k: round(v, 2) for k, v in percentiles(lags).items()}
        if "lag_avg_ms" in summary:
            schedule_lag = {"avg": summary["lag_avg_ms"], **schedule_lag}
    return {
        "offered_per_s": phase.rate,
        "achieved_per_s": round(summary.get("tps", 0.0)),
        "transactions": int(summary.get("transactions", 0)),
        "failed_transactions": int(summary.get("failed", 0)),
        "pgbench_latency_avg_ms": summary.get("latency_avg_ms"),
        "schedule_lag_ms": schedule_lag,
        # pgbench's own CPU, in cores: what the generator took from walflow and the servers
        "pgbench_cpu_cores": round(pgbench_cpu / max(stopped - start, 1e-9), 3),
        **shares,
        "lag_from_s": round(start - origin, 3),
        "lag_to_s": round(stopped - origin, 3),
        "stopped_ns": stopped_ns,
    }


def _log_lags(prefix: Path) -> list[float]:
    """Schedule lag (ms) of every transaction in pgbench's logs for one phase (one file per
    thread: ``client tx time script epoch us lag``); the logs are removed once read."""
    lags: list[float] = []
    for path in sorted(prefix.parent.glob(f"{prefix.name}.*")):
        with path.open() as log:
            for line in log:
                fields = line.split()
                if len(fields) >= 7 and fields[2].isdigit():
                    lags.append(int(fields[6]) / 1000)
        path.unlink()
    return lags
