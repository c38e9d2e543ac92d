"""The results as JSON (every figure), a markdown table (ceilings beside walflow and the
performance targets) and a PNG chart (rates, slot lag over time, latency percentiles)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import delay
from bench.walflow import DEPLOYMENTS

#: The performance targets (where each comes from: ``docs/design.md``, *bench/*).
TARGET_RSS_MB = 200
TARGET_CPU_US = 20
TARGET_P99_MS = 100
TARGET_RATE = 35_000
TARGET_CEILING_SHARE = 0.9
#: A backfill of (a)'s rows, rows/s into JetStream.
TARGET_BACKFILL_RATE = 50_000
#: The backfill whose rate the target is about.
BACKFILL_TARGETED = "backfill-100B"
#: The bare ``python -m bytewax.run dataflows.cdc``'s share of ``-s 1``'s rate on (a), same run.
TARGET_NOFLAGS_SHARE = 0.9
#: The projection's process counts (publishing processes beside the slot's).
PROJECTED = (1, 2, 3, 4)
#: Threads shown per process in the markdown (all are in the JSON).
TOP_THREADS = 4
MODEL = ("rate(N) = min(W, 1e6 / S, N × 1e6 / F): W the walsender limit (pg_recvlogical over the same WAL, "
         "this run), S the slot's process's CPU µs per change (all its threads: reading, converting, the "
         "envelope and its own share of the publishing; its serial part), F the other processes' CPU µs per "
         "change they published (their CPU over their share of the published changes), N publishing "
         "processes beside the slot's, each on a core of its own (a machine with enough cores, the servers "
         "elsewhere). The reader thread alone is the floor S cannot go under while one thread reads the slot.")


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


def _shaped_runs(results: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(workload, deployment key, run) for every run with the sink shaped (``--shaping``)."""
    return [
        (name, key, run)
        for name, workload in results["workloads"].items()
        for key, run in workload.get("shaped", {}).get("walflow", {}).items()
    ]


def _backfill_runs(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(table shape, walflow's run) for every backfill."""
    return [(name, b["walflow"]) for name, b in results.get("backfill", {}).items()]


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each performance target with the measured figure and whether it is met."""
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
    if mixed and "w1" in mixed["walflow"] and "noflags" in mixed["walflow"]:
        w1, bare = mixed["walflow"]["w1"]["changes_per_s"], mixed["walflow"]["noflags"]["changes_per_s"]
        add("(a) no flags / 1 worker (-s 1), same run", round(bare / w1, 2) if bare and w1 else None,
            f"≥ {TARGET_NOFLAGS_SHARE}", lambda v: v >= TARGET_NOFLAGS_SHARE)
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
    peaks += [run["peak_rss_mb"] for _, _, run in _shaped_runs(results)]
    if results.get("two_databases", {}).get("walflow"):
        peaks.append(results["two_databases"]["walflow"]["peak_rss_mb"])
    peaks += [run["peak_rss_mb"] for _, run in _backfill_runs(results)]
    if "latency" in results:
        peaks.append(results["latency"]["peak_rss_mb"])
    if peaks:
        add("peak RSS of a walflow process, every run (MB)", max(peaks), f"≤ {TARGET_RSS_MB}",
            lambda v: v <= TARGET_RSS_MB)
    return rows


def _thread_us(process: dict[str, Any], prefix: str) -> float | None:
    """CPU µs per change of a process's threads whose name starts with ``prefix``, summed."""
    found = [t["cpu_us_per_change"] or 0.0 for t in process.get("threads", []) if t["name"].startswith(prefix)]
    return round(sum(found), 2) if found else None


def scaling(results: dict[str, Any]) -> dict[str, Any] | None:
    """The projection of one slot's rate with N publishing processes (:data:`MODEL`), from each
    multi-process run of (a): S from its slot's process, F from the others, W from this run's
    pg_recvlogical. None without (a) or without a multi-process run of it."""
    mixed = results["workloads"].get("mixed-100B")
    if not mixed:
        return None
    w = mixed["source_ceiling"]["changes_per_s"]
    models: dict[str, Any] = {}
    for key, run in mixed["walflow"].items():
        procs = run.get("processes") or []
        slot = [p for p in procs if p["slots"]]
        far = [p for p in procs if not p["slots"]]
        if len(slot) != 1 or not far or slot[0]["cpu_us_per_change"] is None:
            continue
        shares = [p["published_share"] for p in far]
        if any(x is None for x in shares) or not sum(shares) or any(p["cpu_us_per_change"] is None for p in far):
            continue
        s_us = slot[0]["cpu_us_per_change"]
        f_us = round(sum(p["cpu_us_per_change"] for p in far) / sum(shares), 2)
        slot_share = slot[0]["published_share"] or 0.0
        # the slot's process without its own publishing, priced at the others' cost per change published
        s_serial = round(max(s_us - slot_share * f_us, 1e-3), 2)

        def project(s_cost: float, f_cost: float = f_us) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for n in PROJECTED:
                terms = {"W": float(w), "S": 1e6 / s_cost, "F": n * 1e6 / f_cost}
                bound = min(terms, key=lambda t: terms[t])
                out[str(n)] = {"changes_per_s": round(terms[bound]), "bound": bound}
            return out

        models[key] = {
            "deployment": run["deployment"],
            "W": w,
            "S_us": s_us,
            "F_us": f_us,
            "reader_us": _thread_us(slot[0], "reader-"),
            "slot_published_share": slot[0]["published_share"],
            "measured_changes_per_s": run["changes_per_s"],
            "projected": project(s_us),
            # the same with S less its own publishing: a slot's process that publishes nothing
            "S_serial_us": s_serial,
            "projected_serial": project(s_serial),
        }
    if not models:
        return None
    measured = {key: run["changes_per_s"] for key, run in mixed["walflow"].items()}
    return {"model": MODEL, "workload": "mixed-100B", "cpus": results.get("environment", {}).get("cpus"), "W": w,
            "measured": measured, "from": models}


def _top_threads(process: dict[str, Any]) -> str:
    shown = [t for t in process.get("threads", []) if t["cpu_us_per_change"]][:TOP_THREADS]
    cells = []
    for t in shown:
        many = f" ×{t['threads']}" if t["threads"] > 1 else ""
        cells.append(f"{t['name']}{many} {_fmt(t['cpu_us_per_change'])}")
    return ", ".join(cells) or "–"


def _process_rows(label: str, run: dict[str, Any]) -> list[str]:
    """One markdown row per process of a run: what it holds, its CPU, its top threads."""
    rows = []
    for p in run.get("processes") or []:
        holds = ", ".join(f"slot {s}" for s in p["slots"]) or "–"
        share = p.get("published_share")
        rows.append(
            f"| {label} | {run['deployment']} | {p['index']} | {holds} "
            f"| {_fmt(round(share * 100, 1) if share is not None else None)} | {_fmt(p['cpu_us_per_change'])} "
            f"| {_fmt(p.get('cpu_us_per_published'))} | {_fmt(p['peak_rss_mb'])} | {_top_threads(p)} |"
        )
    return rows


PROCESS_HEADER = [
    ("| workload | deployment | process | holds | published % | CPU µs/change | µs per change it published "
     "| peak RSS MB | top threads, µs/change |"),
    "|---|---|--:|---|--:|--:|--:|--:|---|",
]


def _deployment_keys(results: dict[str, Any]) -> list[str]:
    """The deployments run on any catch-up workload, in :data:`DEPLOYMENTS`' order."""
    used = {key for _, key, _ in _walflow_runs(results)}
    return [key for key in DEPLOYMENTS if key in used] or ["w1"]


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    keys = _deployment_keys(results)
    lines = [
        f"# walflow benchmark {results['date']}{' (quick)' if results['quick'] else ''}",
        "",
        (f"{env['cpus']} CPUs, load {env['loadavg_start']} at start / {env['loadavg_end']} at end; "
        f"PostgreSQL {env['postgres']}, NATS {env['nats']}, Python {env['python']}, "
        f"walflow {env['git_commit'][:10]}{' (modified)' if env['git_modified'] else ''} "
        f"(hot path {env['hot_path']}); {results['seconds']:.0f} s in all."),
        "",
        "## Throughput (catch-up: the workload is in the WAL before each consumer starts)",
        "",
        ("changes/s; walflow from the first to the last message JetStream stored (in brackets: "
        "from process start, startup included)."),
        "",
        ("| workload | changes | row B | source ceiling pg_recvlogical | sink ceiling publish_async "
        f"| sink ceiling AckPublisher | {' | '.join(f'walflow {DEPLOYMENTS[k].label}' for k in keys)} "
        "| CPU µs/change (1 worker) | peak RSS MB | machine CPU busy / others' (1 worker) |"),
        "|---|--:|--:|--:|--:|--:|" + "--:|" * len(keys) + "--:|--:|--:|",
    ]
    for name, w in results["workloads"].items():
        sink = w.get("sink_ceiling", {})
        cells = []
        for key in keys:
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
    if any(run.get("processes") for _, _, run in _walflow_runs(results)):
        lines += [
            "",
            "### CPU per process and per thread",
            "",
            ("From /proc (utime + stime), from the first message stored to the last (startup excluded), per "
            "change of the workload. The slot's process is the one with the slot's reader thread; published % "
            "from each process's /metrics. main is the process's main thread (with -w 1 the Bytewax worker), "
            "timely:work-N a Bytewax worker thread, reader-/heartbeat- the slot's threads, async the NATS "
            "event loop."),
            "",
            *PROCESS_HEADER,
        ]
        for name, _key, run in _walflow_runs(results):
            lines += _process_rows(name, run)
    lines += _noflags_markdown(results)
    lines += _shaping_markdown(results)
    lines += _scaling_markdown(results.get("scaling"))
    if not results["workloads"]:  # a run without catch-up (--only latency): title and environment only
        del lines[3:]
    lines += _two_databases_markdown(results.get("two_databases"))
    lines += _cluster_markdown(results.get("cluster"))
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
    lines += delay.markdown(results.get("delay"))
    if results.get("warnings"):
        lines += ["", "## Warnings", "", *(f"- {w}" for w in results["warnings"])]
    lines += ["", "## Targets (issues 7 and 12)", "", "| target | measured | goal | met |", "|---|--:|---|---|"]
    for row in results["targets"]:
        met = {True: "yes", False: "**no**", None: "–"}[row["met"]]
        lines.append(f"| {row['target']} | {_fmt(row['measured'], 2)} | {row['goal']} | {met} |")
    return "\n".join(lines) + "\n"


def _noflags_markdown(results: dict[str, Any]) -> list[str]:
    """The bare command beside ``-s 1`` on (a), same run: rate, memory, how far the slot trailed."""
    mixed = results["workloads"].get("mixed-100B", {}).get("walflow", {})
    if "noflags" not in mixed or "w1" not in mixed:
        return []
    w1 = mixed["w1"]["changes_per_s"]
    lines = [
        "",
        "### No flags against -s 1 ((a), same run)",
        "",
        ("`python -m bytewax.run dataflows.cdc` with no argument and no BYTEWAX_* variable, beside "
        "`./run.sh run`'s `-s 1`."),
        "",
        ("| deployment | changes/s | / 1 worker | CPU µs/change | peak RSS MB | slot lag max MB "
        "| slot confirmed after s | slot confirmed: moves / longest still s |"),
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for key in ("w1", "noflags"):
        run = mixed[key]
        ratio = round(run["changes_per_s"] / w1, 2) if run["changes_per_s"] and w1 else None
        lines.append(
            f"| {run['deployment']} | {_fmt(run['changes_per_s'])} | {_fmt(ratio, 2)} | {_fmt(run['cpu_us_per_change'])} "
            f"| {_fmt(run['peak_rss_mb'])} | {_fmt(run.get('slot_lag_max_mb'), 3)} "
            f"| {_fmt(run['slot_confirmed_after_s'])} "
            f"| {_fmt(run.get('slot_confirmed_moves'))} / {_fmt(run.get('slot_confirmed_still_max_s'), 2)} |"
        )
    return lines


def shaping_cost(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per workload and deployment run shaped: the unshaped and shaped figures of the same run
    (same WAL, one after the other) and what shaping added per change."""
    rows: list[dict[str, Any]] = []
    for name, key, shaped in _shaped_runs(results):
        plain = results["workloads"][name]["walflow"].get(key)
        if plain is None:
            continue
        us, shaped_us = plain["cpu_us_per_change"], shaped["cpu_us_per_change"]
        rate, shaped_rate = plain["changes_per_s"], shaped["changes_per_s"]
        rows.append({
            "workload": name, "deployment": key, "shaping": results["workloads"][name]["shaped"]["shaping"],
            "changes_per_s": rate, "shaped_changes_per_s": shaped_rate,
            "rate_ratio": round(shaped_rate / rate, 3) if rate and shaped_rate else None,
            "cpu_us_per_change": us, "shaped_cpu_us_per_change": shaped_us,
            "added_cpu_us_per_change": round(shaped_us - us, 2) if us is not None and shaped_us is not None else None,
            "messages": plain["messages"], "shaped_messages": shaped["messages"],
        })
    return rows


def _shaping_markdown(results: dict[str, Any]) -> list[str]:
    """Shaped against unshaped, same run (``--shaping``): rates, CPU per change, the difference."""
    rows = shaping_cost(results)
    if not rows:
        return []
    described = {name: w["shaped"] for name, w in results["workloads"].items() if "shaped" in w}
    lines = [
        "",
        "### Shaping: the same deployment with the sink shaped (issue 16, same run, same WAL)",
        "",
        *(f"{name}, shaping `{d['shaping']}`: {d['description']}." for name, d in described.items()),
        "",
        ("| workload | deployment | changes/s unshaped | shaped | shaped / unshaped | CPU µs/change unshaped "
         "| shaped | **added by shaping, µs/change** | messages unshaped / shaped | peak RSS MB shaped "
         "| machine CPU busy / others' (shaped) |"),
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        run = results["workloads"][row["workload"]]["shaped"]["walflow"][row["deployment"]]
        lines.append(
            f"| {row['workload']} | {run['deployment']} | {_fmt(row['changes_per_s'])} "
            f"| {_fmt(row['shaped_changes_per_s'])} | {_fmt(row['rate_ratio'], 2)} | {_fmt(row['cpu_us_per_change'])} "
            f"| {_fmt(row['shaped_cpu_us_per_change'])} | **{_fmt(row['added_cpu_us_per_change'])}** "
            f"| {_fmt(row['messages'])} / {_fmt(row['shaped_messages'])} | {_fmt(run['peak_rss_mb'])} "
            f"| {_fmt(run.get('machine_cpu_busy'), 2)} / {_fmt(run.get('other_processes_cpu'), 2)} |"
        )
    lines += ["", "Per process, shaped runs:", "", *PROCESS_HEADER]
    for name, _key, run in _shaped_runs(results):
        lines += _process_rows(f"{name}, shaped", run)
    return lines


def _scaling_markdown(scaling: dict[str, Any] | None) -> list[str]:
    """The projection of one slot's rate with N publishing processes, beside what was measured."""
    if not scaling:
        return []
    measured = ", ".join(f"{DEPLOYMENTS[k].label if k in DEPLOYMENTS else k} {_fmt(v)}/s"
                         for k, v in scaling["measured"].items())
    lines = [
        "",
        "### Scaling: one slot's rate projected from the measured costs ((a))",
        "",
        f"Model: {scaling['model']}",
        "",
        (f"Measured in this run ({scaling['cpus']} cores shared with PostgreSQL and NATS): pg_recvlogical "
        f"{_fmt(scaling['W'])}/s, walflow {measured}."),
        "",
        ("| costs from | W /s | S µs | reader thread µs (S's floor) | slot's published % | F µs "
        f"| {' | '.join(f'N = {n}' for n in PROJECTED)} | measured /s |"),
        "|---|--:|--:|--:|--:|--:|" + "--:|" * len(PROJECTED) + "--:|",
    ]
    for model in scaling["from"].values():
        share = model["slot_published_share"]
        for label, s_us, projected in ((model["deployment"], model["S_us"], model["projected"]),
                                       (f"{model['deployment']}, S less its own publishing", model.get("S_serial_us"),
                                        model.get("projected_serial"))):
            if projected is None:
                continue
            cells = " | ".join(f"{_fmt(projected[str(n)]['changes_per_s'])} ({projected[str(n)]['bound']})"
                               for n in PROJECTED)
            lines.append(
                f"| {label} | {_fmt(model['W'])} | {_fmt(s_us)} | {_fmt(model['reader_us'])} "
                f"| {_fmt(round(share * 100, 1) if share is not None else None)} | {_fmt(model['F_us'])} | {cells} "
                f"| {_fmt(model['measured_changes_per_s'])} |"
            )
    lines += ["", ("In brackets the term that binds: W the walsender, S the slot's process, F the publishing processes. "
              "\"S less its own publishing\": S − (slot's published share × F), what the slot's process would cost if "
              "the sink partitions it owns (its share of the publishing) ran elsewhere.")]
    return lines


def _cluster_markdown(cluster: dict[str, Any] | None) -> list[str]:
    """R1 on one server beside R3 on a 3-node cluster: the same WAL, the same deployment."""
    if not cluster:
        return []
    lines = [
        "",
        f"## NATS cluster: R1 on one server, R3 on three nodes (walflow {cluster['deployment']})",
        "",
        (f"The same {_fmt(cluster['changes'])} changes (mixed, {_fmt(round(cluster['avg_row_bytes']))} B rows) in "
         "the WAL before each run; the R3 stream on a 3-node cluster on this machine's loopback (one nats-server "
         "per node: the nodes share its cores with walflow and PostgreSQL)."),
        "",
        "| stream | changes/s (incl. startup) | CPU µs/change (walflow) | peak RSS MB |",
        "|---|--:|--:|--:|",
    ]
    for key, label in (("r1", "R1, one server"), ("r3", "R3, 3-node cluster")):
        run = cluster.get(key)
        if run:
            lines.append(f"| {label} | {_fmt(run['changes_per_s'])} ({_fmt(run['changes_per_s_incl_startup'])}) "
                         f"| {_fmt(run['cpu_us_per_change'])} | {_fmt(run['peak_rss_mb'])} |")
    r1, r3 = cluster.get("r1"), cluster.get("r3")
    if r1 and r3 and r1["changes_per_s"]:
        lines += ["", f"R3 runs at {r3['changes_per_s'] / r1['changes_per_s']:.0%} of R1's rate."]
    return lines


def _two_databases_markdown(two: dict[str, Any] | None) -> list[str]:
    """One flow reading two databases: per database its rate and its slot's process; per process its CPU."""
    if not two:
        return []
    lines = [
        "",
        f"## Two databases, one flow ({two['deployment']})",
        "",
        ("One config with two `databases:` entries (each its slot, publication and sink and stream), no "
        "WALFLOW_DATABASE; each database holds the mixed ~100 B workload before walflow starts."),
        "",
    ]
    if "error" in two:
        return [*lines, f"walflow failed: `{two['error']}`"]
    run = two["walflow"]
    lines += [
        ("| database | changes | pg_recvlogical /s | walflow changes/s | first → last stored s | its slot's process "
        "| reader thread µs/change of its own | slot lag max MB | slot confirmed after s |"),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    procs = run.get("processes") or []
    for name, db in two["databases"].items():
        wf = db["walflow"]
        holder = next((p for p in procs if wf["slot"] in p["slots"]), None)
        reader = _thread_us(holder, f"reader-{wf['slot']}"[:15]) if holder else None
        # per change of the run; the reader reads only its own database's
        own = round(reader * (run["messages"] or 1) / max(wf["changes"], 1), 2) if reader is not None else None
        lines.append(
            f"| {name} ({db['database']}) | {_fmt(wf['changes'])} | {_fmt(db['source_ceiling']['changes_per_s'])} "
            f"| **{_fmt(wf['changes_per_s'])}** | {_fmt(wf['first_to_last_stored_s'], 2)} "
            f"| {_fmt(wf.get('slot_process'))} | {_fmt(own)} | {_fmt(wf.get('slot_lag_max_mb'), 3)} "
            f"| {_fmt(wf['slot_confirmed_after_s'])} |"
        )
    lines += [
        "",
        (f"Both together: {_fmt(run['changes_per_s'])} changes/s, {_fmt(run['cpu_us_per_change'])} µs of walflow CPU per "
        f"change, peak RSS {_fmt(run['peak_rss_mb'])} MB per process; machine CPU busy / others' "
        f"{_fmt(run.get('machine_cpu_busy'), 2)} / {_fmt(run.get('other_processes_cpu'), 2)}. Per process (µs per "
        "change of both databases; published % of both):"),
        "",
        *PROCESS_HEADER,
        *_process_rows("two databases", run),
    ]
    for p in procs:
        if p.get("published"):
            lines.append(f"- process {p['index']} published " + ", ".join(
                f"{_fmt(n)} of sink {sink}" for sink, n in sorted(p["published"].items())))
    return lines


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


def _pick(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda w: w["walflow"].get(key, {}).get("changes_per_s")


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
        *((f"walflow {DEPLOYMENTS[key].label}", _pick(key)) for key in _deployment_keys(results)),
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
