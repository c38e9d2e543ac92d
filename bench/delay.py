"""The cost of ``destination.confirm_delay_ms``: the slot lag it keeps, and none in throughput.

The same steady offered load (pgbench at a fixed rate, :data:`bench.latency.MIX_SCRIPT`,
one change per transaction) through walflow (one worker) twice in one run: once with
``confirm_delay_ms: 0`` (the bench's usual config) and once with a delay D. The load runs for
``2 × D + RAMP_S * 2`` seconds; its *steady part* starts ``D + RAMP_S`` seconds after pgbench
started (by then the delayed slot has begun to be confirmed: its lag has reached rate × D)
and ends when pgbench exits. Both runs are measured over the same part of their load:

- stored changes/s: messages whose JetStream storage timestamp lies in the steady part;
- commit → stored latency p50/p99 of the changes committed in it (as :mod:`bench.latency`:
  the storage timestamp minus the payload's commit timestamp);
- walflow's CPU µs per change (pgbench's start to the stream holding the run's last change)
  and peak RSS;
- the slot lag (:class:`bench.monitor.SlotLagSampler`): median and max bytes in the steady
  part, and the same in seconds of WAL at the offered rate (bytes ÷ (rate × WAL bytes per
  change of the run)); beside it the lag the delay should add, rate × D × bytes per change.

Nothing here waits for ``confirmed_flush_lsn``: with a delay the slot is confirmed only D
after JetStream's acks, so a run ends once its stream holds pgbench's transactions (every
one changes one row), and the sampler's confirmed LSN says whether the slot moved meanwhile.
With more than one pair (``--delay-pairs``) the order alternates (0, D, D, 0, 0, D, …).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import yaml

from bench.jetstream import JetStream
from bench.latency import MIX_SCRIPT, Pgbench, Phase, _offer, commit_ns, find_pgbench, percentiles
from bench.monitor import MemorySampler, SlotLagSampler, cpu_seconds
from bench.walflow import DEPLOYMENTS, Target, Walflow, write_config
from bench.workloads import create_slots, current_lsn, drop_database, prepare_database
from embedded import wait_for

if TYPE_CHECKING:
    from bench.runner import Bench

#: Seconds after the delay before the steady part starts (the first confirmation, a share of
#: the delay later, and an epoch); the load also runs this much longer, twice.
RAMP_S = 2.0
DATABASE = "bench_delay"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--confirm-delay-s``, ``--delay-rate``, ``--delay-pairs`` (fields of ``bench.runner.Options``)."""
    from bench.runner import FULL, QUICK

    group = parser.add_argument_group("delay (the cost of destination.confirm_delay_ms)")
    group.add_argument("--confirm-delay-s", type=float,
                       help=f"D, the delayed run's confirm_delay_ms in seconds; the load runs 2 × D + {2 * RAMP_S:g} s "
                       f"[full {FULL.confirm_delay_s:g}, quick {QUICK.confirm_delay_s:g}]")
    group.add_argument("--delay-rate", type=int, help=f"pgbench's offered rate, transactions/s [{FULL.delay_rate:,}]")
    group.add_argument("--delay-pairs", type=int,
                       help=f"pairs of runs (0, D), interleaved: 0 D, D 0, ... [{FULL.delay_pairs}]")


def load_seconds(delay_s: float) -> float:
    """How long pgbench offers the load: the ramp to the delayed lag, then at least the delay again."""
    return round(2 * delay_s + 2 * RAMP_S)


def _delayed_config(path: Path, target: Target, delay_ms: int) -> Path:
    """The bench's config for ``target`` with its sink's ``confirm_delay_ms`` set to ``delay_ms``."""
    write_config(path, target)
    config = yaml.safe_load(path.read_text())
    for sink in config["sinks"]:
        sink["destination"]["confirm_delay_ms"] = delay_ms
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _median(values: list[int]) -> float | None:
    return statistics.median(values) if values else None


def measure_once(js: JetStream, workdir: Path, target: Target, *, dsn: str, generator: Pgbench, rate: int,
                 delay_s: float, confirm_delay_ms: int, timeout: float) -> dict[str, Any]:
    """One walflow (1 worker) run under ``rate`` for :func:`load_seconds` with ``confirm_delay_ms``."""
    seconds = load_seconds(delay_s)
    config = _delayed_config(workdir / f"{target.stream}.yaml", target, confirm_delay_ms)
    with Walflow(config, DEPLOYMENTS["w1"]) as wf, psycopg.connect(dsn, autocommit=True) as conn:
        memory = MemorySampler(wf.pids)
        lag = SlotLagSampler(dsn, target.slot)
        memory.start()
        lag.start()
        try:
            row = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM benchmark_records").fetchone()
            assert row is not None
            base = int(row[0])
            # one change before the load: walflow is up and publishing once it is stored
            conn.execute("INSERT INTO benchmark_records (id, string_field) VALUES (%s, 'warm-up')", [-base])
            wait_for(lambda: js.last_seq(target.stream) >= 1, timeout=timeout, what="walflow's first message",
                     check=wf.check, interval=0.05)
            first_seq = js.last_seq(target.stream) + 1
            cpu_start = sum(cpu_seconds(p) for p in wf.pids)
            lsn_start = current_lsn(conn)
            figures = _offer(generator, Phase(f"{rate}/s", rate, seconds), base, workdir / f"pgbench-{target.slot}",
                             lag.started)
            lsn_end = current_lsn(conn)
            stopped = time.monotonic()
            # the stream, never the slot: a delayed slot is confirmed only confirm_delay_ms after the acks
            expected = first_seq - 1 + figures["transactions"]
            wait_for(lambda: js.last_seq(target.stream) >= expected, timeout=timeout,
                     what=f"{figures['transactions']:,} messages in {target.stream}", check=wf.check, interval=0.05)
            stored_after = time.monotonic() - stopped
            cpu_end = sum(cpu_seconds(p) for p in wf.pids)
        finally:
            memory.stop()
            lag.stop()
    messages = [m for m in js.read(target.stream) if m.seq >= first_seq]
    stopped_ns = int(figures.pop("stopped_ns"))
    began_ns = stopped_ns - round((figures["lag_to_s"] - figures["lag_from_s"]) * 1e9)
    steady_from_ns, steady_s = began_ns + round((delay_s + RAMP_S) * 1e9), (stopped_ns - began_ns) / 1e9 - delay_s - RAMP_S
    commits = [commit_ns(m.data) for m in messages]
    latencies = [(m.time_ns - c) / 1e6 for m, c in zip(messages, commits, strict=True) if c >= steady_from_ns]
    stored = sum(1 for m in messages if steady_from_ns <= m.time_ns <= stopped_ns)
    steady = (figures["lag_from_s"] + delay_s + RAMP_S, figures["lag_to_s"])
    lags = [b for t, b in lag.series if steady[0] <= t <= steady[1]]
    bytes_per_change = (lsn_end - lsn_start) / max(figures["transactions"], 1)
    wal_per_s = rate * bytes_per_change

    def in_seconds(value: float | None) -> float | None:
        return round(value / wal_per_s, 2) if value is not None and wal_per_s else None

    median_lag, max_lag = _median(lags), max(lags, default=None)
    return {
        "confirm_delay_ms": confirm_delay_ms,
        **figures,
        "load_s": seconds,
        "steady_s": round(steady_s, 2),
        "messages": len(messages),
        "stored_after_s": round(stored_after, 3),
        "stored_per_s": round(stored / steady_s) if steady_s > 0 else None,
        "latency_ms": {k: round(v, 2) for k, v in percentiles(latencies).items()},
        "cpu_us_per_change": round((cpu_end - cpu_start) * 1e6 / max(len(messages), 1), 2),
        "peak_rss_mb": round(memory.peak_process / 2**20, 1),
        "wal_bytes_per_change": round(bytes_per_change, 1),
        "slot_lag_median_bytes": round(median_lag) if median_lag is not None else None,
        "slot_lag_max_bytes": max_lag,
        "slot_lag_median_s": in_seconds(median_lag),
        "slot_lag_max_s": in_seconds(max_lag),
        # the WAL the delay alone should keep: D seconds of it at the offered rate
        "predicted_delay_lag_bytes": round(rate * confirm_delay_ms / 1000 * bytes_per_change),
        **lag.progress(*steady),
        "slot_lag": [(t, round(b / 2**20, 3)) for t, b in lag.series],
    }


def order(pairs: int, delay_ms: int) -> list[int]:
    """The runs' ``confirm_delay_ms``: (0, D), then (D, 0), alternating."""
    return [d for i in range(pairs) for d in ((0, delay_ms) if i % 2 == 0 else (delay_ms, 0))]


def cost(runs: list[dict[str, Any]], delay_ms: int) -> dict[str, Any]:
    """The delayed runs against the undelayed (means over pairs): what the delay added."""

    def mean(delay: int, pick: Callable[[dict[str, Any]], float | None]) -> float | None:
        values = [v for r in runs if r["confirm_delay_ms"] == delay and (v := pick(r)) is not None]
        return statistics.fmean(values) if values else None

    out: dict[str, Any] = {}
    for key, pick in (
        ("stored_per_s", lambda r: r["stored_per_s"]),
        ("p50_ms", lambda r: r["latency_ms"].get("p50")),
        ("p99_ms", lambda r: r["latency_ms"].get("p99")),
        ("cpu_us_per_change", lambda r: r["cpu_us_per_change"]),
        ("peak_rss_mb", lambda r: r["peak_rss_mb"]),
        ("slot_lag_median_bytes", lambda r: r["slot_lag_median_bytes"]),
        ("slot_lag_max_bytes", lambda r: r["slot_lag_max_bytes"]),
        ("predicted_delay_lag_bytes", lambda r: r["predicted_delay_lag_bytes"]),
    ):
        plain, delayed = mean(0, pick), mean(delay_ms, pick)
        out[key] = {"0": plain, str(delay_ms): delayed,
                    "added": round(delayed - plain, 2) if plain is not None and delayed is not None else None}
    added, predicted = out["slot_lag_median_bytes"]["added"], out["predicted_delay_lag_bytes"][str(delay_ms)]
    out["added_lag_over_predicted"] = round(added / predicted, 3) if added is not None and predicted else None
    return out


def measure(suite: Bench, say: Callable[[str], None]) -> dict[str, Any]:
    """The delay part of a bench run: :func:`order`'s runs, each with a slot and stream of its own."""
    o = suite.options
    delay_ms = round(o.confirm_delay_s * 1000)
    pgbench = find_pgbench(suite.pg.bindir)
    dsn = suite.pg.dsn(DATABASE)
    prepare_database(suite.pg.dsn(), DATABASE, dsn, [])
    script = suite.workdir / "delay-mix.sql"
    script.write_text(MIX_SCRIPT)
    generator = Pgbench(pgbench, dsn, script, o.clients, o.pad)
    result: dict[str, Any] = {
        "deployment": DEPLOYMENTS["w1"].label, "offered_per_s": o.delay_rate, "confirm_delay_ms": delay_ms,
        "load_s": load_seconds(o.confirm_delay_s), "steady_from_s": o.confirm_delay_s + RAMP_S,
        "generator": f"pgbench -c {o.clients} -M prepared -R {o.delay_rate}, Sequin's 60/30/10 mix",
        "runs": [],
    }
    try:
        for i, delay in enumerate(order(o.delay_pairs, delay_ms)):
            slot = f"wf_delay_{i}"
            create_slots(dsn, [slot])  # now: it streams this run's load only
            target = suite.target(DATABASE, slot, f"delay_{i}")
            label = f"delay: confirm_delay_ms {delay:,}"
            say(f"{label}, {o.delay_rate:,}/s for {result['load_s']:g}s")
            run = measure_once(suite.js, suite.workdir, target, dsn=dsn, generator=generator, rate=o.delay_rate,
                               delay_s=o.confirm_delay_s, confirm_delay_ms=delay, timeout=suite.timeout(0))
            suite.js.delete_stream(target.stream)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
            suite.check_noise(label, run)
            if run["messages"] != run["transactions"] or run["failed_transactions"]:
                suite.warnings.append(f"{label}: the stream holds {run['messages']:,} changes for pgbench's "
                                      f"{run['transactions']:,} transactions ({run['failed_transactions']} failed)")
            if delay and not run["slot_confirmed_moves"]:
                suite.warnings.append(f"{label}: the slot was never confirmed in the steady part")
            say(f"{label}: {run['stored_per_s'] or 0:,} stored/s, p99 {run['latency_ms'].get('p99')} ms, "
                f"{run['cpu_us_per_change']} µs/change, slot lag median "
                f"{(run['slot_lag_median_bytes'] or 0) / 2**20:.1f} MB ({run['slot_lag_median_s']} s of WAL)")
            result["runs"].append(run)
        result["cost"] = cost(result["runs"], delay_ms)
        return result
    finally:
        drop_database(suite.pg.dsn(), DATABASE)


def _mb(value: float | None) -> str:
    return "–" if value is None else f"{value / 2**20:,.1f}"


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.{digits}f}"
    return f"{int(value):,}"


def markdown(delay: dict[str, Any] | None) -> list[str]:
    """The report's section: each run, then what the delay added."""
    if not delay:
        return []
    d_ms = delay["confirm_delay_ms"]
    lines = [
        "",
        f"## The confirm delay's cost (walflow {delay['deployment']} live, confirm_delay_ms 0 against {d_ms:,})",
        "",
        (f"Load: {delay['generator']}, {delay['load_s']:g} s per run, same run, one after the other. Steady part: "
         f"from {delay['steady_from_s']:g} s after pgbench's start to its end. Stored/s by JetStream's storage "
         "timestamps, latency commit → stored of the changes committed in it; CPU from pgbench's start to the "
         "stream holding the run's last change; slot lag pg_current_wal_lsn() − confirmed_flush_lsn, in MB and "
         "in seconds of WAL at the offered rate; predicted: offered rate × confirm_delay_ms × WAL bytes per change."),
        "",
        ("| confirm_delay_ms | achieved/s | stored/s (steady) | p50 ms | p99 ms | CPU µs/change | peak RSS MB "
         "| WAL B/change | slot lag median MB (s) | max MB (s) | predicted by the delay MB "
         "| slot confirmed: moves / longest still s | machine CPU busy / others' |"),
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in delay["runs"]:
        ms = run["latency_ms"]
        lines.append(
            f"| {run['confirm_delay_ms']:,} | {_cell(run['achieved_per_s'])} | {_cell(run['stored_per_s'])} "
            f"| {_cell(ms.get('p50'))} | {_cell(ms.get('p99'))} | {_cell(run['cpu_us_per_change'])} "
            f"| {_cell(run['peak_rss_mb'])} | {_cell(run['wal_bytes_per_change'])} "
            f"| {_mb(run['slot_lag_median_bytes'])} ({_cell(run['slot_lag_median_s'], 2)}) "
            f"| {_mb(run['slot_lag_max_bytes'])} ({_cell(run['slot_lag_max_s'], 2)}) "
            f"| {_mb(run['predicted_delay_lag_bytes'])} "
            f"| {_cell(run['slot_confirmed_moves'])} / {_cell(run['slot_confirmed_still_max_s'], 2)} "
            f"| {_cell(run['machine_cpu_busy'], 2)} / {_cell(run['other_processes_cpu'], 2)} |"
        )
    c = delay.get("cost")
    if c:
        lag = c["slot_lag_median_bytes"]
        lines += [
            "",
            (f"The delay added {_mb(lag['added'])} MB of slot lag (median; predicted "
             f"{_mb(c['predicted_delay_lag_bytes'][str(d_ms)])} MB, measured / predicted "
             f"{_cell(c['added_lag_over_predicted'], 2)}), {_cell(c['stored_per_s']['added'])} stored/s, "
             f"{_cell(c['p99_ms']['added'], 2)} ms of p99, {_cell(c['cpu_us_per_change']['added'], 2)} µs of CPU "
             f"per change and {_cell(c['peak_rss_mb']['added'])} MB of peak RSS."),
        ]
    return lines
