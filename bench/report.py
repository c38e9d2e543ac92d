"""The results as JSON (every figure), a markdown table (ceilings beside walflow and the
issue's targets) and a PNG chart (rates, slot lag over time, latency percentiles)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The issue's targets.
TARGET_RSS_MB = 200
TARGET_CPU_US = 20
TARGET_P99_MS = 100
TARGET_RATE = 35_000
TARGET_CEILING_SHARE = 0.9
#: Issue 12: a backfill of (a)'s rows, rows/s into JetStream.
TARGET_BACKFILL_RATE = 50_000
#: The backfill whose rate the target is about.
BACKFILL_TARGETED = "backfill-100B"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.{digits}f}"
    return f"{int(value):,}"


def _walflow_runs(results: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(workload, deployment key, run) for every catch-up run."""
    return [
        (name, key, run)
        for name, workload in results["workloads"].items()
        for key, run in workload["walflow"].items()
    ]


def _backfill_runs(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(table shape, walflow's run) for every backfill."""
    return [(name, b["walflow"]) for name, b in results.get("backfill", {}).items()]


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issues 7 and 12 with the measured figure and whether it is met."""
    rows: list[dict[str, Any]] = []

    def add(what: str, measured: float | None, target: str, ok: Callable[[float], bool]) -> None:
        rows.append({"target": what, "measured": measured, "goal": target,
                     "met": None if measured is None else bool(ok(measured))})

    mixed = results["workloads"].get("mixed-100B")
    if mixed and "w1" in mixed["walflow"]:
        add("(a) changes/s, 1 worker", mixed["walflow"]["w1"]["changes_per_s"], f"≥ {TARGET_RATE:,}",
            lambda v: v >= TARGET_RATE)
    for name, workload in results["workloads"].items():
        run = workload["walflow"].get("w1")
        sink = workload.get("sink_ceiling", {}).get("publish_async")
        if run is None or sink is None:
            continue
        ceiling = min(workload["source_ceiling"]["changes_per_s"], sink["msgs_per_s"])
        add(f"{name}: 1 worker / min(source, publish_async)", round(run["changes_per_s"] / ceiling, 2),
            f"≥ {TARGET_CEILING_SHARE} (of {ceiling:,}/s)", lambda v: v >= TARGET_CEILING_SHARE)
    if mixed and "w1" in mixed["walflow"]:
        add("(a) walflow CPU µs/change, 1 worker", mixed["walflow"]["w1"]["cpu_us_per_change"],
            f"≤ {TARGET_CPU_US}", lambda v: v <= TARGET_CPU_US)
    phase = results.get("latency", {}).get("phases", {}).get("5000/s")
    if phase:
        add("p99 latency at 5k/s (ms)", phase["latency_ms"].get("p99"), f"≤ {TARGET_P99_MS}",
            lambda v: v <= TARGET_P99_MS)
    targeted = results.get("backfill", {}).get(BACKFILL_TARGETED)
    if targeted:
        add(f"{BACKFILL_TARGETED} rows/s, 1 worker", targeted["walflow"]["rows_per_s"], f"≥ {TARGET_BACKFILL_RATE:,}",
            lambda v: v >= TARGET_BACKFILL_RATE)
    peaks = [run["peak_rss_mb"] for _, _, run in _walflow_runs(results)]
    peaks += [run["peak_rss_mb"] for _, run in _backfill_runs(results)]
    if "latency" in results:
        peaks.append(results["latency"]["peak_rss_mb"])
    if peaks:
        add("peak RSS of a walflow process, every run (MB)", max(peaks), f"≤ {TARGET_RSS_MB}",
            lambda v: v <= TARGET_RSS_MB)
    return rows


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"# walflow benchmark {results['date']}{' (quick)' if results['quick'] else ''}",
        "",
        (f"{env['cpus']} CPUs, load {env['loadavg_start']} at start / {env['loadavg_end']} at end; "
        f"PostgreSQL {env['postgres']}, NATS {env['nats']}, Python {env['python']}, "
        f"walflow {env['git_commit'][:10]}{' (modified)' if env['git_modified'] else ''}; {results['seconds']:.0f} s in all."),
        "",
        "## Throughput (catch-up: the workload is in the WAL before each consumer starts)",
        "",
        ("changes/s; walflow from the first to the last message JetStream stored (in brackets: "
        "from process start, startup included)."),
        "",
        ("| workload | changes | row B | source ceiling pg_recvlogical | sink ceiling publish_async "
        "| sink ceiling AckPublisher | walflow 1 worker | walflow -w 2 | walflow 2 processes "
        "| CPU µs/change (1 worker) | peak RSS MB | machine CPU busy / others' (1 worker) |"),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, w in results["workloads"].items():
        sink = w.get("sink_ceiling", {})
        cells = []
        for key in ("w1", "w2", "p2"):
            run = w["walflow"].get(key)
            cells.append(f"{_fmt(run['changes_per_s'])} ({_fmt(run['changes_per_s_incl_startup'])})" if run else "–")
        w1 = w["walflow"].get("w1", {})
        peak = max((r["peak_rss_mb"] for r in w["walflow"].values()), default=None)
        lines.append(
            f"| {name} | {_fmt(w['changes'])} | {_fmt(round(w['avg_row_bytes']))} "
            f"| {_fmt(w['source_ceiling']['changes_per_s'])} "
            f"| {_fmt(sink.get('publish_async', {}).get('msgs_per_s'))} "
            f"| {_fmt(sink.get('ack_publisher', {}).get('msgs_per_s'))} "
            f"| {' | '.join(cells)} | {_fmt(w1.get('cpu_us_per_change'))} | {_fmt(peak)} "
            f"| {_fmt(w1.get('machine_cpu_busy'), 2)} / {_fmt(w1.get('other_processes_cpu'), 2)} |"
        )
    lines += [
        "",
        "### walflow runs",
        "",
        ("| workload | deployment | changes/s stored | incl. startup | wall s | CPU µs/change | peak RSS MB "
        "(process / all) | slot confirmed after s | machine CPU busy / others' |"),
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, _key, run in _walflow_runs(results):
        lines.append(
            f"| {name} | {run['deployment']} | {_fmt(run['changes_per_s'])} | {_fmt(run['changes_per_s_incl_startup'])} "
            f"| {_fmt(run['wall_incl_startup_s'])} | {_fmt(run['cpu_us_per_change'])} "
            f"| {_fmt(run['peak_rss_mb'])} / {_fmt(run['peak_rss_total_mb'])} | {_fmt(run['slot_confirmed_after_s'])} "
            f"| {_fmt(run.get('machine_cpu_busy'), 2)} / {_fmt(run.get('other_processes_cpu'), 2)} |"
        )
    if not results["workloads"]:  # a run without catch-up (--only latency): title and environment only
        del lines[3:]
    lines += _backfill_markdown(results)
    latency = results.get("latency")
    if latency:
        lines += [
            "",
            "## Latency (walflow live, 1 worker): commit timestamp → JetStream storage timestamp",
            "",
            (f"Load: {latency.get('generator', 'pgbench')}; a rate is pgbench's own throttling (-R, Poisson "
            "arrivals), its schedule lag how late transactions started against that schedule."),
            "",
            ("| offered | achieved/s | changes | p50 ms | p95 ms | p99 ms | max ms | first commit → last stored /s "
            "| p99 of each second: median / worst ms | drained after s | pgbench schedule lag avg / p99 / max ms "
            "| pgbench CPU cores | machine CPU busy / others' |"),
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for label, phase in latency["phases"].items():
            ms = phase["latency_ms"]
            lag = phase.get("schedule_lag_ms")
            lag_cell = f"{_fmt(lag.get('avg'), 2)} / {_fmt(lag.get('p99'))} / {_fmt(lag.get('max'))}" if lag else "–"
            seconds = phase.get("p99_of_seconds_ms", {})
            lines.append(
                f"| {label} | {_fmt(phase['achieved_per_s'])} | {_fmt(phase['changes'])} | {_fmt(ms.get('p50'))} "
                f"| {_fmt(ms.get('p95'))} | {_fmt(ms.get('p99'))} | {_fmt(ms.get('max'))} "
                f"| {_fmt(phase['first_commit_to_last_stored_per_s'])} "
                f"| {_fmt(seconds.get('median'))} / {_fmt(seconds.get('max'))} | {_fmt(phase.get('drained_after_s'), 2)} "
                f"| {lag_cell} | {_fmt(phase.get('pgbench_cpu_cores'), 2)} "
                f"| {_fmt(phase['machine_cpu_busy'], 2)} / {_fmt(phase['other_processes_cpu'], 2)} |"
            )
    if results.get("warnings"):
        lines += ["", "## Warnings", "", *(f"- {w}" for w in results["warnings"])]
    lines += ["", "## Targets (issues 7 and 12)", "", "| target | measured | goal | met |", "|---|--:|---|---|"]
    for row in results["targets"]:
        met = {True: "yes", False: "**no**", None: "–"}[row["met"]]
        lines.append(f"| {row['target']} | {_fmt(row['measured'], 2)} | {row['goal']} | {met} |")
    return "\n".join(lines) + "\n"


def _backfill_markdown(results: dict[str, Any]) -> list[str]:
    """The backfill table: walflow beside COPY of the same table, the target beside (a)'s shape."""
    backfills = results.get("backfill")
    if not backfills:
        return []
    lines = [
        "",
        "## Backfill (walflow 1 worker, `initial_backfill: true`: a table's existing rows into JetStream as reads)",
        "",
        ("rows/s from the first read (its chunk's high watermark) to the last message JetStream stored (in "
        "brackets: from process start); COPY: `COPY (SELECT * FROM benchmark_records) TO STDOUT` through psycopg, "
        "data discarded, the faster of one run before walflow and one after. The slot: its confirmed LSN while "
        "the stream filled."),
        "",
        ("| table | rows | row B | COPY rows/s | walflow rows/s | target | walflow / COPY | s | CPU µs/row "
        "| peak RSS MB | slot lag max MB | slot confirmed: moves / longest still s | machine CPU busy / others' |"),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, b in backfills.items():
        run = b["walflow"]
        goal = f"≥ {TARGET_BACKFILL_RATE:,}" if name == BACKFILL_TARGETED else "–"
        lines.append(
            f"| {name} | {_fmt(b['changes'])} | {_fmt(round(b['avg_row_bytes']))} | {_fmt(b['copy']['rows_per_s'])} "
            f"| **{_fmt(run['rows_per_s'])}** ({_fmt(run['changes_per_s_incl_startup'])}) | {goal} "
            f"| {_fmt(b['walflow_over_copy'], 2)} | {_fmt(run['first_read_to_last_stored_s'], 2)} "
            f"| {_fmt(run['cpu_us_per_change'])} | {_fmt(run['peak_rss_mb'])} | {_fmt(run['slot_lag_max_mb'], 3)} "
            f"| {_fmt(run['slot_confirmed_moves'])} / {_fmt(run['slot_confirmed_still_max_s'], 2)} "
            f"| {_fmt(run.get('machine_cpu_busy'), 2)} / {_fmt(run.get('other_processes_cpu'), 2)} |"
        )
    return lines


def chart(results: dict[str, Any], path: Path) -> None:
    """Rates per workload and consumer; slot lag over time per walflow run; latency percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, lag, latency, live) = plt.subplots(4, 1, figsize=(11, 17))
    series: list[tuple[str, Callable[[dict[str, Any]], float | None]]] = [
        ("source ceiling (pg_recvlogical)", lambda w: w["source_ceiling"]["changes_per_s"]),
        ("sink ceiling (publish_async)", lambda w: w.get("sink_ceiling", {}).get("publish_async", {}).get("msgs_per_s")),
        ("sink ceiling (AckPublisher)", lambda w: w.get("sink_ceiling", {}).get("ack_publisher", {}).get("msgs_per_s")),
        ("walflow 1 worker", lambda w: w["walflow"].get("w1", {}).get("changes_per_s")),
        ("walflow -w 2", lambda w: w["walflow"].get("w2", {}).get("changes_per_s")),
        ("walflow 2 processes", lambda w: w["walflow"].get("p2", {}).get("changes_per_s")),
    ]
    names = list(results["workloads"])
    width = 0.8 / len(series)
    for i, (label, pick) in enumerate(series):
        values = [pick(results["workloads"][n]) or 0 for n in names]
        bars = rates.bar([x + i * width for x in range(len(names))], values, width, label=label)
        rates.bar_label(bars, labels=[f"{v / 1000:.0f}k" if v else "" for v in values], fontsize=7)
    rates.axhline(TARGET_RATE, color="grey", linestyle="--", linewidth=1, label=f"target {TARGET_RATE // 1000}k/s")
    rates.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names)
    rates.set_ylabel("changes/s")
    rates.set_title("Throughput, catch-up over the same WAL")
    rates.legend(fontsize=8)

    lagging = [(f"{name} {run['deployment']}", run) for name, _key, run in _walflow_runs(results)]
    lagging += [(f"{name} {run['deployment']}", run) for name, run in _backfill_runs(results)]
    for label, run in lagging:
        if run["slot_lag"]:
            t, mb = zip(*run["slot_lag"], strict=True)
            lag.plot(t, mb, label=label)
    lag.set_xlabel("seconds since walflow started")
    lag.set_ylabel("slot lag (MB of WAL)")
    lag.set_title("Slot lag during catch-up and backfills: pg_current_wal_lsn() − confirmed_flush_lsn")
    if not names:  # no catch-up run (--only latency, backfill): no rates to show
        rates.set_visible(False)
    if lagging:
        lag.legend(fontsize=8)
    else:
        lag.set_visible(False)

    if "latency" in results and results["latency"]["slot_lag"]:
        t, mb = zip(*results["latency"]["slot_lag"], strict=True)
        live.plot(t, mb, color="black", linewidth=1)
        for i, (label, phase) in enumerate(results["latency"]["phases"].items()):
            live.axvspan(phase["lag_from_s"], phase["lag_to_s"], alpha=0.15, color=f"C{i}", label=label)
        live.set_xlabel("seconds since walflow started")
        live.set_ylabel("slot lag (MB of WAL)")
        live.set_title("Slot lag while running live (latency phases shaded)")
        live.legend(fontsize=8)
    else:
        live.set_visible(False)

    phases = results.get("latency", {}).get("phases", {})
    if phases:
        keys = ["p50", "p95", "p99", "max"]
        labels = list(phases)
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            values = [phases[label]["latency_ms"].get(key, 0) for label in labels]
            bars = latency.bar([x + i * width for x in range(len(labels))], values, width, label=key)
            latency.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
        latency.axhline(TARGET_P99_MS, color="grey", linestyle="--", linewidth=1, label=f"p99 target {TARGET_P99_MS} ms")
        latency.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
        latency.set_yscale("log")
        latency.set_ylabel("ms, commit → stored")
        latency.set_title("Latency at offered rates (walflow live, 1 worker)")
        latency.legend(fontsize=8)
    else:
        latency.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict[str, Any], out_dir: Path, parts: str = "") -> tuple[Path, Path, Path]:
    """``<date>[-quick][-<parts>].json``, ``.md`` and ``.png`` in ``out_dir``; returns their paths.
    ``parts`` names a partial run (``--only``), so it never overwrites a whole run's results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{results['date']}{'-quick' if results['quick'] else ''}{f'-{parts}' if parts else ''}"
    paths = (out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png")
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(markdown(results))
    chart(results, paths[2])
    return paths
