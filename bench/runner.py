"""One benchmark run: servers up, each workload written once and read by every consumer, latency, report."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Self

import psycopg

from bench import backfill, delay, report, streaming
from bench.consumers import Feed, sink_ceilings, source_ceiling, walflow_catchup, walflow_feeds
from bench.jetstream import JetStream, StoredMessage
from bench.latency import Phase, find_pgbench, run_latency
from bench.walflow import DEPLOYMENTS, ROOT, SHAPINGS, Shaping, Target
from bench.workloads import (
    PUBLICATION,
    Written,
    create_slots,
    drop_database,
    prepare_database,
    write_bulk,
    write_mixed,
    write_rows,
)
from core import compiled
from embedded import NatsServer, PostgresServer
from embedded.nats import NatsCluster

#: The server for a benchmark rather than for tests: room for the 1M-row transaction's WAL
#: without checkpoints in the middle of a measurement. Durability stays off, as in the tests
#: (fsync off): the figures are about walflow, not about this machine's disk.
PG_SETTINGS = {"shared_buffers": "256MB", "max_wal_size": "8GB", "checkpoint_timeout": "30min"}


#: Other processes' share of the machine's CPU above which a measurement gets a warning.
NOISE_SHARE = 0.1


@dataclass(frozen=True)
class Options:
    rows: int
    wide_rows: int
    bulk_rows: int
    backfill_rows: int
    clients: int = 4
    pad: int = 32
    wide_pad: int = 1500
    rates: str = "1000,5000"
    latency_seconds: float = 30.0
    two_db_rows: int = 100_000
    sink_messages: int = 200_000
    window: int = 1024
    deployments: str = "w1,noflags,w2,p2,p3"
    other_deployments: str = "w1"
    two_db_deployment: str = "p2"
    #: (a)'s sink shaped beside unshaped, per deployment (:data:`bench.walflow.SHAPINGS`); "none": unshaped only.
    shaping: str = "none"
    only: str = "mixed,bulk,wide,latency,backfill,twodb,delay,cluster"
    quick: bool = False
    #: delay (bench/delay.py): D, pgbench's rate, and how many (0, D) pairs
    confirm_delay_s: float = 30.0
    delay_rate: int = 2000
    delay_pairs: int = 1
    #: streaming (bench/streaming.py, issue 26): the bulk transaction's rows, the concurrent and aborts
    #: workloads' sessions, transactions per session and rows per transaction, both readers' work_mem
    #: (logical_decoding_work_mem, comma-separated: the concurrent and aborts workloads run at each, bulk at the first)
    streaming_rows: int = 1_000_000
    streaming_sessions: int = 16
    streaming_txns: int = 3
    streaming_txn_rows: int = 20_000
    streaming_work_mem: str = "64MB,16MB"

    def with_(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

    def runs(self, part: str) -> bool:
        return part in self.only.split(",")


FULL = Options(rows=200_000, wide_rows=50_000, bulk_rows=1_000_000, backfill_rows=1_000_000)
#: Quick: the three deployments of before (p2 gives the per-process split and the projection),
#: no p3, no noflags and no two-database run unless asked for (--deployments, --only twodb).
QUICK = Options(rows=20_000, wide_rows=8_000, bulk_rows=20_000, backfill_rows=20_000, two_db_rows=10_000,
                latency_seconds=4.0, deployments="w1,w2,p2", only="mixed,bulk,wide,latency,backfill,delay", quick=True,
                confirm_delay_s=10.0, streaming_rows=200_000, streaming_sessions=8, streaming_txns=2,
                streaming_work_mem="16MB")

#: The two-database run: walflow's names for the databases (the subjects' second token) and
#: the server's (each with its slot and publication of its own).
TWO_DATABASES = ("bench_a", "bench_b")


_STARTED = time.monotonic()


def _say(message: str) -> None:
    print(f"bench: {time.monotonic() - _STARTED:5.1f}s {message}", file=sys.stderr, flush=True)


def _git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return result.stdout.rstrip()  # not strip(): porcelain lines start with a space


def environment(pg: PostgresServer, js: JetStream) -> dict[str, Any]:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": str(row[0]) if row else "?",
        "nats": js.server_version,
        "bytewax": version("bytewax"),
        "nats_py": version("nats-py"),
        "git_commit": _git("rev-parse", "HEAD"),
        # the pipelines the bench starts import the same (core/compiled.py)
        "hot_path": compiled.implementation(),
        # the figures are for the working tree as it was, which may hold uncommitted changes
        "git_modified": _git("status", "--porcelain", "--untracked-files=no").splitlines(),
        "pg_settings": PG_SETTINGS,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def _tag(name: str) -> str:
    """A workload's name as it may stand in database, stream and subject names."""
    return name.replace("-", "_").replace(".", "_").lower()


def _written(written: Written) -> dict[str, Any]:
    """What a workload wrote, as the results keep it."""
    return {
        "changes": written.changes,
        "transactions": written.transactions,
        "avg_row_bytes": round(written.avg_row_bytes, 1),
        "wal_mb": round(written.wal_bytes / 2**20, 1),
        "write_s": round(written.seconds, 2),
        "write_changes_per_s": round(written.changes / written.seconds),
    }


def _failure(error: str) -> str:
    """walflow's own fatal line with what follows it (a config error's reasons), else the first line."""
    lines = error.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("walflow:")), None)
    if start is None:
        return lines[0].strip() if lines else error
    return " ".join(line.strip() for line in lines[start : start + 4] if line.strip())[:400]


class Bench:
    """The servers, the results so far, and a scratch directory for configs and logs."""

    def __init__(self, options: Options, pg: PostgresServer, js: JetStream, workdir: Path) -> None:
        self.options = options
        self.pg = pg
        self.js = js
        self.workdir = workdir
        self.recvlogical = pg.bindir / "pg_recvlogical"
        self.pgbench = find_pgbench(pg.bindir) if options.runs("latency") else pg.bindir / "pgbench"
        self.warnings: list[str] = []

    def check_noise(self, label: str, figures: dict[str, Any]) -> None:
        """Warn when processes outside the benchmark took a noticeable share of the CPU
        while ``label`` was measured: on a small machine that alone can halve a figure."""
        other = figures.get("other_processes_cpu") or 0.0
        if other > NOISE_SHARE:
            self.warnings.append(f"{label}: other processes on this machine took {other:.0%} of its CPU meanwhile")

    def target(self, database: str, slot: str, tag: str) -> Target:
        return Target(self.pg.port, database, slot, PUBLICATION, self.js.destination,
                      stream=f"WF_{tag.upper()}", subject_prefix=f"wf_{tag}")

    def timeout(self, changes: int) -> float:
        """Generous: a run this slow is broken, not slow (1,000 changes/s, at least 2 minutes)."""
        return max(120.0, changes / 1000)

    def _catchup(self, name: str, key: str, target: Target, written: Written, dsn: str,
                 shaping: Shaping | None = None) -> dict[str, Any]:
        """One walflow run of deployment ``key`` over a workload's WAL, checked and said."""
        label = f"walflow {DEPLOYMENTS[key].label}{f', shaped ({shaping.key})' if shaping else ''}"
        _say(f"{name}: {label}")
        run = walflow_catchup(
            self.js, self.workdir, target, DEPLOYMENTS[key], dsn=dsn, changes=written.changes,
            end_lsn=written.end_lsn, timeout=self.timeout(written.changes), shaping=shaping,
        )
        self.check_noise(f"{name}, {label}", run)
        if run["messages"] != written.changes:
            self.warnings.append(f"{name}, {label}: the stream holds "
                                 f"{run['messages']:,} messages for {written.changes:,} changes")
        _say(f"{name}: {label}: {run['changes_per_s']:,} changes/s, "
             f"{run['cpu_us_per_change']} µs/change, peak {run['peak_rss_mb']} MB")
        return run

    def workload(self, name: str, deployments: list[str], write: Callable[[str, str], Written],
                 shaping: Shaping | None = None) -> dict[str, Any]:
        """Write one workload into its own database, then run every consumer over its WAL.
        ``shaping``: after each deployment's run, the same deployment with its sink shaped so
        (a slot of its own, made with the others before the workload): ``result["shaped"]``."""
        tag = _tag(name)
        database = f"bench_{tag}"
        dsn = self.pg.dsn(database)
        slots = ["recv", *(f"wf_{d}" for d in deployments)]
        if shaping is not None:
            slots += [f"wf_{d}_shaped" for d in deployments]
        prepare_database(self.pg.dsn(), database, dsn, slots)
        try:
            _say(f"{name}: writing")
            written = write(dsn, database)
            result = _written(written)
            _say(f"{name}: {written.changes:,} changes, {result['wal_mb']} MB of WAL in {written.seconds:.1f}s; "
                 "pg_recvlogical")
            result["source_ceiling"] = source = source_ceiling(
                self.recvlogical, port=self.pg.port, database=database, slot="recv", publication=PUBLICATION,
                end_lsn=written.end_lsn, changes=written.changes,
            )
            self.check_noise(f"{name}, pg_recvlogical", source)
            result["walflow"] = {}
            replay: tuple[str, list[StoredMessage]] | None = None  # walflow's subject prefix, its messages
            if shaping is not None:
                result["shaped"] = {"shaping": shaping.key, "description": shaping.label,
                                    "sink_keys": shaping.sink, "walflow": {}}
            for key in deployments:
                target = self.target(database, f"wf_{key}", f"{tag}_{key}")
                result["walflow"][key] = self._catchup(name, key, target, written, dsn)
                if replay is None:  # unshaped: the sink ceilings read its subjects back as the envelope's
                    replay = (target.subject_prefix, self.js.read(target.stream, limit=self.options.sink_messages))
                self.js.delete_stream(target.stream)
                if shaping is not None:
                    target = self.target(database, f"wf_{key}_shaped", f"{tag}_{key}_shaped")
                    result["shaped"]["walflow"][key] = self._catchup(name, key, target, written, dsn, shaping)
                    self.js.delete_stream(target.stream)
            if replay is not None:
                prefix, messages = replay
                _say(f"{name}: sink ceilings over {len(messages):,} of walflow's messages")
                result["sink_ceiling"] = sink = sink_ceilings(
                    self.js, messages, source_prefix=prefix, tag=tag, window=self.options.window
                )
                for publisher in ("publish_async", "ack_publisher"):
                    self.check_noise(f"{name}, sink ceiling {publisher}", sink[publisher])
            return result
        finally:
            drop_database(self.pg.dsn(), database)

    def backfill(self, name: str, pad: int) -> dict[str, Any]:
        """A table of ``backfill_rows`` rows of string_field length ``pad``, then walflow's
        backfill of it beside COPY of it (:mod:`bench.backfill`)."""
        tag = _tag(name)
        database = f"bench_{tag}"
        dsn = self.pg.dsn(database)
        rows = self.options.backfill_rows
        prepare_database(self.pg.dsn(), database, dsn, [])
        try:
            _say(f"{name}: writing {rows:,} rows")
            result = _written(write_rows(dsn, database, rows=rows, clients=self.options.clients, pad=pad))
            # after the rows: the backfill must be their only way in. A slot name of its own: the
            # sink remembers its initial backfill per configured database, slot and sink name
            # (on the NATS that outlives the databases), and would not ask again for another table
            slot = f"wf_{tag}"
            create_slots(dsn, [slot])
            target = self.target(database, slot, tag)
            _say(f"{name}: COPY, walflow's backfill, COPY")
            result.update(backfill.measure(self.js, self.workdir, target, dsn=dsn, rows=rows,
                                           timeout=self.timeout(rows)))
            self.js.delete_stream(target.stream)
            run = result["walflow"]
            for i, copy in enumerate(result["copy"]["runs"]):
                self.check_noise(f"{name}, COPY {('before', 'after')[i]} walflow", copy)
            self.check_noise(f"{name}, walflow's backfill", run)
            self.warnings += [f"{name}: {problem}" for problem in backfill.problems(run, rows)]
            _say(f"{name}: walflow {run['rows_per_s'] or 0:,} rows/s, COPY {result['copy']['rows_per_s']:,} "
                 f"rows/s, {run['cpu_us_per_change']} µs/row, peak {run['peak_rss_mb']} MB, slot confirmed "
                 f"{run['slot_confirmed_moves']} times, still ≤ {run['slot_confirmed_still_max_s']} s")
            return result
        finally:
            drop_database(self.pg.dsn(), database)

    def two_databases(self) -> dict[str, Any]:
        """One flow over two databases: a config with two ``databases:`` entries,
        each with its slot, publication and sink, and no ``WALFLOW_DATABASE``, run as
        ``two_db_deployment``. Each database gets the mixed workload of ``two_db_rows``
        changes and its own pg_recvlogical; walflow reads both at once."""
        o = self.options
        deployment = DEPLOYMENTS[o.two_db_deployment]
        result: dict[str, Any] = {"deployment": deployment.label, "databases": {}}
        feeds: list[Feed] = []
        made: list[str] = []
        try:
            for name in TWO_DATABASES:
                database, slot, publication = f"bench_two_{name[-1]}", f"wf_two_{name[-1]}", f"bench_pub_{name[-1]}"
                dsn = self.pg.dsn(database)
                recv = f"recv_{name[-1]}"  # slot names are the server's, not the database's
                prepare_database(self.pg.dsn(), database, dsn, [recv, slot], publication)
                made.append(database)
                _say(f"two databases: writing {database}")
                written = write_mixed(dsn, database, changes=o.two_db_rows, clients=o.clients, pad=o.pad)
                figures = result["databases"][name] = _written(written)
                figures["database"] = database
                figures["source_ceiling"] = source = source_ceiling(
                    self.recvlogical, port=self.pg.port, database=database, slot=recv, publication=publication,
                    end_lsn=written.end_lsn, changes=written.changes,
                )
                self.check_noise(f"two databases, {database} pg_recvlogical", source)
                target = dataclasses.replace(self.target(database, slot, f"two_{name[-1]}"), publication=publication)
                feeds.append(Feed(target, dsn, written.changes, written.end_lsn))
            _say(f"two databases: walflow {deployment.label} over both")
            try:
                run = walflow_feeds(self.js, self.workdir, feeds, deployment, timeout=self.timeout(
                    sum(f.changes for f in feeds)), names=TWO_DATABASES)
            except RuntimeError as exc:  # a walflow that cannot read two databases in one flow
                result["error"] = _failure(str(exc))
                self.warnings.append(f"two databases: walflow failed: {result['error']}")
                _say(f"two databases: walflow failed: {result['error']}")
                return result
            finally:
                for feed in feeds:
                    self.js.delete_stream(feed.target.stream)
            self.check_noise(f"two databases, walflow {deployment.label}", run)
            for name, figures in run.pop("databases").items():
                result["databases"][name]["walflow"] = figures
                if figures["messages"] != figures["changes"]:
                    self.warnings.append(f"two databases, {name}: the stream holds {figures['messages']:,} "
                                         f"messages for {figures['changes']:,} changes")
            result["walflow"] = run
            rates = ", ".join(f"{n} {d['walflow']['changes_per_s'] or 0:,}/s" for n, d in result["databases"].items())
            _say(f"two databases: walflow {deployment.label}: {rates}, {run['cpu_us_per_change']} µs/change")
            return result
        finally:
            for database in made:
                drop_database(self.pg.dsn(), database)

    def cluster(self) -> dict[str, Any]:
        """walflow (w1) over one mixed workload twice: into an R1 stream on the single server, then
        into an R3 stream on a 3-node cluster (``embedded.nats.NatsCluster``) started for it."""
        o = self.options
        tag = _tag("cluster")
        database = f"bench_{tag}"
        dsn = self.pg.dsn(database)
        prepare_database(self.pg.dsn(), database, dsn, ["wf_r1", "wf_r3"])
        try:
            _say("cluster: writing")
            written = write_mixed(dsn, database, changes=o.rows, clients=o.clients, pad=o.pad)
            result: dict[str, Any] = {**_written(written), "deployment": DEPLOYMENTS["w1"].label}
            r1 = self.target(database, "wf_r1", f"{tag}_r1")
            result["r1"] = self._catchup("cluster R1, one server", "w1", r1, written, dsn)
            self.js.delete_stream(r1.stream)
            _say("cluster: starting a 3-node NATS cluster")
            with NatsCluster(3) as nodes:
                js = JetStream(nodes)
                try:
                    r3 = dataclasses.replace(self.target(database, "wf_r3", f"{tag}_r3"), nats=nodes.destination,
                                             replicas=3)
                    label = "cluster R3, 3 nodes"
                    _say(f"{label}: walflow {DEPLOYMENTS['w1'].label}")
                    run = walflow_catchup(js, self.workdir, r3, DEPLOYMENTS["w1"], dsn=dsn, changes=written.changes,
                                          end_lsn=written.end_lsn, timeout=self.timeout(written.changes))
                    self.check_noise(label, run)
                    if run["messages"] != written.changes:
                        self.warnings.append(f"{label}: the stream holds {run['messages']:,} messages for "
                                             f"{written.changes:,} changes")
                    _say(f"{label}: {run['changes_per_s']:,} changes/s, {run['cpu_us_per_change']} µs/change")
                    result["r3"] = run
                finally:
                    js.close()
            return result
        finally:
            drop_database(self.pg.dsn(), database)

    def latency(self) -> dict[str, Any]:
        o = self.options
        phases = [Phase(f"{int(r)}/s", int(r), o.latency_seconds) for r in o.rates.split(",") if r]
        phases.append(Phase("full speed", None, o.latency_seconds))
        database = "bench_latency"
        dsn = self.pg.dsn(database)
        prepare_database(self.pg.dsn(), database, dsn, ["wf_live"])
        try:
            _say(f"latency: {', '.join(p.label for p in phases)}, {o.latency_seconds:g}s each")
            target = self.target(database, "wf_live", "live")
            result = run_latency(
                self.js, self.workdir, target, dsn=dsn, pgbench=self.pgbench, phases=phases, clients=o.clients,
                pad=o.pad, timeout=self.timeout(0),
            )
            self.js.delete_stream(target.stream)
            for label, phase in result["phases"].items():
                self.check_noise(f"latency {label}", phase)
                # every transaction of the script changes one row: the stream must hold as many
                if phase["changes"] != phase["transactions"] or phase["failed_transactions"]:
                    self.warnings.append(
                        f"latency {label}: the stream holds {phase['changes']:,} changes for pgbench's "
                        f"{phase['transactions']:,} transactions ({phase['failed_transactions']} failed)"
                    )
            return result
        finally:
            drop_database(self.pg.dsn(), database)


def run(options: Options, out_dir: Path) -> int:
    began = time.monotonic()
    today = datetime.date.today().isoformat()
    workdir = Path(tempfile.mkdtemp(prefix="walflow-bench-"))
    results: dict[str, Any] = {"date": today, "quick": options.quick, "options": dataclasses.asdict(options)}
    ok = False
    try:
        _say("starting PostgreSQL and NATS")
        with PostgresServer(settings=PG_SETTINGS) as pg, NatsServer() as nats_server:
            # every libpq client of the run (walflow, pgbench, pg_recvlogical) logs in through the server's passfile
            os.environ["PGPASSFILE"] = str(pg.passfile)
            js = JetStream(nats_server)
            try:
                results["environment"] = environment(pg, js)
                suite = Bench(options, pg, js, workdir)
                o = options
                first, others = o.deployments.split(","), o.other_deployments.split(",")
                results["workloads"] = {}
                if o.runs("mixed"):
                    results["workloads"]["mixed-100B"] = suite.workload(
                        "mixed-100B", first,
                        lambda dsn, db: write_mixed(dsn, db, changes=o.rows, clients=o.clients, pad=o.pad),
                        shaping=SHAPINGS[o.shaping],
                    )
                if o.runs("wide"):
                    results["workloads"]["mixed-1.6KB"] = suite.workload(
                        "mixed-1.6KB", others,
                        lambda dsn, db: write_mixed(dsn, db, changes=o.wide_rows, clients=o.clients, pad=o.wide_pad),
                    )
                if o.runs("bulk"):
                    results["workloads"]["bulk"] = suite.workload(
                        "bulk", others, lambda dsn, db: write_bulk(dsn, db, rows=o.bulk_rows),
                        shaping=SHAPINGS[o.shaping],
                    )
                if o.runs("latency"):
                    results["latency"] = suite.latency()
                if o.runs("twodb"):
                    results["two_databases"] = suite.two_databases()
                if o.runs("cluster"):
                    results["cluster"] = suite.cluster()
                if o.runs("backfill"):
                    results["backfill"] = {
                        name: suite.backfill(name, pad) for name, pad in (("backfill-100B", o.pad),
                                                                          ("backfill-1.6KB", o.wide_pad))
                    }
                if o.runs("delay"):
                    results["delay"] = delay.measure(suite, _say)
                if o.runs("streaming"):
                    results["streaming"] = streaming.measure(suite, _say)
                results["warnings"] = suite.warnings
            finally:
                js.close()
        results["environment"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        results["seconds"] = round(time.monotonic() - began, 1)
        results["targets"] = report.targets(results)
        results["scaling"] = report.scaling(results)
        results["shaping_cost"] = report.shaping_cost(results)
        whole = QUICK if options.quick else FULL  # a mode's own parts: its whole run
        partial = set(options.only.split(",")) != set(whole.only.split(","))
        json_path, md_path, png_path = report.write(results, out_dir, options.only.replace(",", "+") if partial else "")
        print(report.markdown(results))
        if "streaming" in results:  # its own table, after the report's (bench/streaming.py)
            table = "\n".join(streaming.markdown(results["streaming"]))
            md_path.write_text(md_path.read_text() + "\n" + table)
            print(table)
        _say(f"wrote {json_path}, {md_path.name}, {png_path.name} in {results['seconds']:.0f}s")
        ok = True
        return 0
    finally:
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            _say(f"configs and walflow logs kept in {workdir}")
