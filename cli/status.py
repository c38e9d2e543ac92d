"""``walflow status [CONFIG] [--json] [--sample SECONDS]``: is the pipeline healthy, and if not, why.

It looks at everything from outside, so it works whether or not the pipeline runs, and
changes nothing (:mod:`cli.probe`). The verdict is the exit status:

- **healthy** (0): changes flow end to end: walflow holds each slot and replies, the
  confirmed LSN keeps up, every enabled sink's NATS answers and its stream is there.
- **degraded** (1): they flow, but something needs attention before it stops them: a
  confirmed LSN that has stood still for a while as the lag grows, a large lag that keeps
  growing, ``wal_status`` ``unreserved``, WAL about to run out at the present rate, a
  walsender busy and silent, a stream walflow has yet to create or extend.
- **down** (2): changes do not reach JetStream now: the database or NATS unreachable, the
  pipeline not running, the slot held by another client or by a hung walflow, the slot
  invalidated (``wal_status`` ``lost``) or missing, the publication missing, a stream
  walflow cannot use. A stopped pipeline is down, though it loses nothing while the slot
  keeps its WAL: nothing is delivered.

Whether the lag grows and the confirmed LSN moves takes two samples of the slot, ``--sample``
seconds apart (3 by default; the NATS and health probes run in between). The pipeline's
``/readyz`` says where its reader stands, but not how long the slot has stood there, and it
does not answer when the pipeline is down; Postgres does: ``pg_stat_replication.flush_lag``
keeps growing while the holder replies without confirming, which dates a stuck slot.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import psycopg

from cli.probe import (
    Finding,
    Health,
    Level,
    ProbeClient,
    ProbeError,
    Publication,
    Refused,
    SlotSample,
    account_info,
    close_nats,
    colour_wanted,
    count,
    database_problem,
    duration,
    emit,
    lost_slot_fix,
    open_nats,
    paint,
    pg_connect,
    publication,
    read_health,
    refusal,
    render,
    sample_slot,
    size,
    stream_info,
    stream_plan,
    tables_read,
    worst,
)
from config import ConfigError, load_config
from config.schema import Config, DatabaseConfig, SinkConfig
from connectors.nats.regression import Regression
from connectors.nats.state import recorded_regression, recorded_schemas
from connectors.postgres import hints
from connectors.postgres.backfill_progress import progress_text
from connectors.postgres.protocol import lsn_to_str
from connectors.postgres.session import WAITING_ON_CLIENT
from core.display import printable
from transforms.schema_events import last_changes

VERDICTS: Final = {Level.OK: "healthy", Level.INFO: "healthy", Level.WARN: "degraded", Level.FAIL: "down"}
EXIT: Final = {"healthy": 0, "degraded": 1, "down": 2}
#: Level names in ``--json`` and tags on the screen.
NAMES: Final = {Level.OK: "ok", Level.INFO: "info", Level.WARN: "degraded", Level.FAIL: "down"}
TAGS: Final = {Level.OK: "ok", Level.INFO: "note", Level.WARN: "DEGRADED", Level.FAIL: "DOWN"}

#: A confirmed LSN standing still for less than this may be an epoch in flight (Bytewax's
#: default epoch is 10 s, confirmed one to two epochs later): longer is a stall.
STUCK_AFTER: Final = 30.0
#: A lag that keeps growing beyond this is worth a look even while the confirmed LSN moves.
LARGE_LAG: Final = 1024**3
#: WAL that runs out (``safe_wal_size``) within this at the present rate: degraded.
RUNS_OUT_WITHIN: Final = 3600.0


@dataclass(frozen=True, slots=True)
class Trend:
    """How the slot moved between two samples."""

    lag: int
    #: Lag change per second (positive: growing).
    per_s: float
    #: The confirmed LSN moved between the samples.
    moved: bool
    #: WAL written before the first sample was still unconfirmed at the second, and the
    #: confirmed LSN did not move: for how long (``flush_lag``), if the server knows.
    stuck_for_s: float | None
    stuck: bool

    def words(self) -> str:
        if abs(self.per_s) < 1:
            return "steady"
        return f"{'growing' if self.per_s > 0 else 'shrinking'} ({'+' if self.per_s > 0 else '-'}{size(abs(self.per_s))}/s)"

    def as_json(self) -> dict[str, object]:
        return {"lag_bytes": self.lag, "lag_change_bytes_per_s": round(self.per_s, 1),
                "confirmed_moved": self.moved, "stuck": self.stuck, "stuck_for_s": self.stuck_for_s}


def trend(first: SlotSample, last: SlotSample) -> Trend | None:
    """None without two samples of an existing slot."""
    if first is last or first.confirmed_lsn is None or last.confirmed_lsn is None or last.lag is None:
        return None
    seconds = max((last.at - first.at).total_seconds(), 1e-3)
    moved = last.confirmed_lsn > first.confirmed_lsn
    stuck = not moved and last.confirmed_lsn < first.current_lsn
    lag_for = last.holder.flush_lag_s if stuck and last.holder is not None else None
    return Trend(last.lag, (last.lag - (first.lag or 0)) / seconds, moved, lag_for, stuck)


@dataclass(slots=True)
class Status:
    """What ``walflow status`` found: findings in screen order, and the details for ``--json``."""

    config_file: str
    sample_s: float
    findings: list[Finding] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return VERDICTS[worst(self.findings)]

    @property
    def reasons(self) -> list[Finding]:
        """The findings that make the verdict, causes first: what is wrong with the slot, the database
        or a sink before what the pipeline makes of it, consequences last."""
        level = worst(self.findings)
        worst_ones = [f for f in self.findings if f.level == level and level >= Level.WARN]
        return sorted(worst_ones, key=lambda f: (f.follows, f.about == "pipeline"))

    def as_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": [f.text for f in self.reasons], "config": self.config_file,
                "sample_seconds": self.sample_s, **self.details,
                "findings": [f.as_json(NAMES) for f in self.findings]}

    def lines(self, colour: bool) -> list[str]:
        level = worst(self.findings)
        verdict = self.verdict.upper()
        why = self.reasons[0].text if self.reasons else "changes flow from every slot to JetStream"
        more = f" (+{len(self.reasons) - 1} more)" if len(self.reasons) > 1 else ""
        head = f"walflow status: {paint(verdict, level, colour)} — {printable(why)}{more}"
        sampled = f"slots sampled over {self.sample_s:g} s" if self.sample_s else "slots sampled once"
        where = f"config {printable(self.config_file)}" + (f", {sampled}" if self.details else "")  # none: the config failed
        return [head, where, "", *render(self.findings, TAGS, colour=colour)]


@dataclass(slots=True)
class _Database:
    """One database as probed: the connection is kept open for the second sample."""

    db: DatabaseConfig
    conn: psycopg.Connection[Any] | None = None
    version: str | None = None
    publication: Publication | None = None
    first: SlotSample | None = None
    last: SlotSample | None = None
    problem: Finding | None = None


def _probe_database(db: DatabaseConfig) -> _Database:
    seen = _Database(db)
    try:
        seen.conn = pg_connect(db, "status")
        row = seen.conn.execute("SELECT current_setting('server_version')").fetchone()
        seen.version = str(row[0]).split()[0] if row else None  # "15.8 (Debian 15.8-1)": the number says it
        seen.first = sample_slot(seen.conn, db.slot.name)
        seen.publication = publication(seen.conn, db)
    except psycopg.Error as exc:
        seen.problem = database_problem(db, exc)
        _close(seen)
    return seen


def _sample_again(seen: _Database) -> None:
    if seen.conn is None:
        return
    try:
        seen.last = sample_slot(seen.conn, seen.db.slot.name)
    except psycopg.Error as exc:
        seen.problem = database_problem(seen.db, exc)
    finally:
        _close(seen)


def _close(seen: _Database) -> None:
    if seen.conn is not None:
        seen.conn.close()
        seen.conn = None


# -- sinks -------------------------------------------------------------------------------------


async def _probe_sink(sink: SinkConfig, slot: str | None) -> tuple[list[Finding], dict[str, Any]]:
    about = f"sink {sink.name}"
    dest = sink.destination
    details: dict[str, Any] = {"name": sink.name, "database": sink.database, "enabled": sink.enabled,
                               "servers": dest.display_urls, "nats_reachable": None, "stream": None}
    if not sink.enabled:
        return [Finding(about, Level.INFO, f"disabled (status: {sink.status}): it publishes nothing")], details
    try:
        nc = await open_nats(dest, f"walflow:{sink.name}:status")
    except ProbeError as exc:
        details["nats_reachable"] = False
        return [Finding(about, Level.FAIL, exc.text, exc.fix)], details
    details["nats_reachable"] = True
    try:
        return (await _sink_stream(nc, sink, details) + await _regression(nc, sink, slot, details)
                + await _schema_changes(nc, sink, slot, details)), details
    except ProbeError as exc:
        return [Finding(about, Level.FAIL, exc.text, exc.fix)], details
    except Refused:
        return [Finding(about, Level.FAIL, refusal(nc, dest, f"a JetStream API request of sink '{sink.name}'").text)], \
            details
    except TimeoutError:
        return [Finding(about, Level.FAIL, f"JetStream at {', '.join(dest.display_urls)} did not answer within 5 s",
                        "check the NATS server's JetStream (its log; `nats server check jetstream`)")], details
    finally:
        await close_nats(nc)


async def _sink_stream(nc: ProbeClient, sink: SinkConfig, details: dict[str, Any]) -> list[Finding]:
    about = f"sink {sink.name}"
    await account_info(nc, sink.destination)
    plan = await stream_plan(nc, sink.destination, sink.database)
    details["stream_plan"] = plan.action
    if plan.action == "refused":
        return [Finding(about, Level.FAIL, str(plan.problem))]
    if plan.action == "create":
        return [Finding(about, Level.WARN, f"stream {plan.name} does not exist: walflow creates it when it starts "
                        f"(or at its next publish), capturing {', '.join(plan.subjects)}")]
    if plan.action == "extend":
        return [Finding(about, Level.WARN, f"stream {plan.name} does not capture database '{sink.database}' yet: "
                        f"walflow adds {plan.subjects[-1]} to it when it starts")]
    assert plan.name is not None
    info = details["stream"] = await stream_info(nc, plan.name)
    return [Finding(about, Level.OK,
                    f"stream {plan.name}: {info['messages']:,} messages, {size(info['bytes'])}, last sequence "
                    f"{info['last_sequence']:,}, duplicate window {duration(info['duplicate_window_s'])}")]


async def _regression(nc: ProbeClient, sink: SinkConfig, slot: str | None,
                      details: dict[str, Any]) -> list[Finding]:
    """The latest time the sink's stream was found holding less than it acknowledged."""
    record = None if slot is None else await recorded_regression(nc, sink.database, slot, sink.name)
    details["regression"] = record
    if record is None:
        return []
    try:
        found = Regression.from_json(record)
    except (KeyError, TypeError):
        return []
    when = datetime.fromtimestamp(found.at, UTC).isoformat(timespec="seconds")
    if found.repairable:
        return [Finding(f"sink {sink.name}", Level.INFO,
                        f"stream {found.stream} lost up to {found.missing:,} acknowledged message(s) at {when}; all "
                        "within confirm_delay_ms, published again from the slot")]
    return [Finding(f"sink {sink.name}", Level.WARN,
                    f"stream {found.stream} lost up to {found.missing:,} acknowledged message(s) at {when}, some "
                    "acknowledged longer ago than confirm_delay_ms: changes may be missing from it",
                    "backfill the tables the sink reads; raise destination.confirm_delay_ms to at least the servers' "
                    "sync_interval")]


async def _schema_changes(nc: ProbeClient, sink: SinkConfig, slot: str | None,
                          details: dict[str, Any]) -> list[Finding]:
    """Each table's last change of shape, as the sink's schema events reported it."""
    if not sink.schema_events or slot is None:
        return []
    changed = last_changes(await recorded_schemas(nc, sink.database, slot, sink.name))
    details["schema_changes"] = [{"table": table, "last_change": words} for table, words in changed]
    return [Finding(f"sink {sink.name}", Level.INFO, f"table {table} last changed shape: {words}")
            for table, words in changed]


async def _probe_sinks(sinks: list[SinkConfig], slots: dict[str, str]) -> list[tuple[list[Finding], dict[str, Any]]]:
    return [await _probe_sink(sink, slots.get(sink.database)) for sink in sinks]


# -- the judgement -------------------------------------------------------------------------------


def judge_slot(db: DatabaseConfig, config_file: str, first: SlotSample, last: SlotSample,
               health: Health | None, backfills: list[tuple[str, str]], status_interval_s: float) -> list[Finding]:
    """The slot's findings from its two samples; ``health`` is None when the endpoint is off."""
    about = f"slot {db.slot.name}"
    if not last.exists:
        make = ("start walflow: it creates the slot (slot.create_if_not_exists)" if db.slot.create_if_not_exists
                else f"{hints.create_slot(db.slot.name)} then start walflow")
        return [Finding(about, Level.FAIL, f"slot {db.slot.name} does not exist: PostgreSQL keeps no changes for "
                        "walflow", make)]
    if last.plugin != "pgoutput" or last.database != db.database:
        return [Finding(about, Level.FAIL, f"slot {db.slot.name} belongs to plugin '{last.plugin}' in database "
                        f"'{last.database}', not a pgoutput slot of '{db.database}': walflow cannot read it",
                        "choose another slot name for walflow, or drop that slot if it is unused")]
    confirmed = lsn_to_str(last.confirmed_lsn or 0)
    if last.wal_status == "lost":
        return [Finding(about, Level.FAIL, f"wal_status lost: PostgreSQL invalidated slot {db.slot.name} (the WAL it "
                        f"needed is removed), so the changes after its confirmed LSN {confirmed} are gone from it",
                        lost_slot_fix(db, config_file, backfills))]
    findings = [_holder(db, config_file, last, health, status_interval_s)]
    moving = findings[0].level == Level.OK
    findings.append(_lag(about, first, last, moving, confirmed))
    findings.append(_wal(about, last, trend(first, last)))
    return findings


def _holder(db: DatabaseConfig, config_file: str, last: SlotSample, health: Health | None,
            status_interval_s: float) -> Finding:
    about, slot = f"slot {db.slot.name}", db.slot.name
    holder = last.holder
    if not last.active or holder is None:
        reads = health is not None and health.answering and health.slot(slot) is not None
        start = None if health is not None else f"start walflow: ./run.sh run {config_file}"
        return Finding(about, Level.FAIL, f"slot {slot} is inactive: "
                       + ("the running pipeline is not connected to it (see pipeline)" if reads
                          else "no walflow reads it (PostgreSQL keeps its WAL meanwhile: nothing is lost yet)"),
                       start, follows=health is not None)
    if holder.application_name != f"walflow:{slot}":
        who = holder.application_name or "a client whose name this role may not see"
        return Finding(about, Level.FAIL, f"slot held by {holder.describe()}: not walflow, so walflow cannot read "
                       "the slot; it retries until the slot is released",
                       f"if {who} should not read slot {slot}: SELECT pg_terminate_backend({holder.pid}); "
                       "(walflow takes the slot at its next attempt)")
    silent = holder.reply_age_s or 0.0
    if silent > 3 * status_interval_s + 2:
        if holder.wait_event in WAITING_ON_CLIENT:
            return Finding(about, Level.FAIL, f"slot held by {holder.describe()}: that walflow is hung (its "
                           f"walsender waits on it and it has not replied for {duration(silent)})",
                           "start walflow again: a new one ends a silent walsender of its own and takes the slot; "
                           f"or SELECT pg_terminate_backend({holder.pid});")
        return Finding(about, Level.WARN, f"slot held by {holder.describe()}: its walsender is busy (wait event "
                       f"{holder.wait_event or 'none: on CPU'}) and silent, decoding a large transaction, probably")
    return Finding(about, Level.OK, f"read by walflow: {holder.describe()}")


def _lag(about: str, first: SlotSample, last: SlotSample, moving: bool, confirmed: str) -> Finding:
    lag = last.lag or 0
    moved = trend(first, last)
    if moved is None:
        return Finding(about, Level.INFO, f"lag {size(lag)}, confirmed LSN {confirmed} (one sample: no trend)")
    if moving and moved.stuck and moved.per_s > 0 and (moved.stuck_for_s or 0) >= STUCK_AFTER:
        since = last.at - timedelta(seconds=moved.stuck_for_s or 0)
        return Finding(about, Level.WARN, f"slot lag {size(lag)} and growing, confirmed LSN {confirmed} stuck since "
                       f"{since.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({duration(moved.stuck_for_s or 0)}): "
                       "walflow reads but JetStream does not acknowledge (see the sinks)")
    if moving and moved.per_s > 0 and lag >= LARGE_LAG:
        return Finding(about, Level.WARN, f"slot lag {size(lag)} and {moved.words()}: walflow confirms slower than "
                       "the database writes")
    if not moving and moved.per_s > 0:
        return Finding(about, Level.INFO, f"lag {size(lag)} and {moved.words()}: PostgreSQL keeps this WAL until "
                       f"the slot is read again (confirmed LSN {confirmed})")
    level = Level.OK if lag < LARGE_LAG else Level.INFO
    return Finding(about, level, f"lag {size(lag)}, {moved.words()}, confirmed LSN {confirmed}")


def _wal(about: str, last: SlotSample, moved: Trend | None) -> Finding:
    safe = last.safe_wal_size
    room = "no limit (max_slot_wal_keep_size -1)" if safe is None else f"safe_wal_size {size(safe)}"
    if last.wal_status == "unreserved":
        return Finding(about, Level.WARN, f"wal_status unreserved: PostgreSQL removes WAL the slot needs at its next "
                       f"checkpoint unless the slot catches up ({room})",
                       "let walflow catch up now, or raise max_slot_wal_keep_size")
    if safe is not None and moved is not None and moved.per_s > 0 and safe / moved.per_s < RUNS_OUT_WITHIN:
        return Finding(about, Level.WARN, f"wal_status {last.wal_status}, {room}: at the present rate PostgreSQL "
                       f"invalidates the slot in about {duration(safe / moved.per_s)}",
                       "let walflow catch up, or raise max_slot_wal_keep_size")
    return Finding(about, Level.OK, f"wal_status {last.wal_status}, {room}")


def judge_pipeline(config: Config, config_file: str, health: Health | None, read_by_walflow: bool) -> list[Finding]:
    """The health endpoint's findings; ``read_by_walflow``: some slot is held by walflow."""
    about = "pipeline"
    if health is None:
        return [Finding(about, Level.INFO, "health endpoint off (walflow.health.enabled: false): whether walflow runs "
                        "is told by the slots' holders")]
    if health.denied:
        return [Finding(about, Level.WARN, f"the health endpoint at {health.url} refused this config's credentials "
                        "(HTTP 401)", "give walflow.health the token (or username and password) the pipeline runs with")]
    if not health.answering:
        if read_by_walflow:
            return [Finding(about, Level.INFO, f"health endpoint not answering at {health.url} ({health.problem}): "
                            "the walflow reading the slot runs elsewhere, or its port was taken")]
        return [Finding(about, Level.FAIL, f"pipeline not running (health endpoint not answering at {health.url}: "
                        f"{health.problem})", f"start it: ./run.sh run {config_file}")]
    findings = []
    for db in config.databases:
        reader = health.slot(db.slot.name)
        if reader is None:
            findings.append(Finding(about, Level.INFO, f"the process at {health.url} does not read slot "
                                    f"{db.slot.name} (another process of a cluster, or another pipeline)"))
            continue
        findings.append(_reader(db.slot.name, reader, health.url))
        findings += [Finding(about, Level.INFO, _backfill(b)) for b in reader.get("backfills") or []]
    return findings


def _backfill(progress: dict[str, Any]) -> str:
    """A running backfill as the pipeline words its progress; as it sent it, from a pipeline of
    another version that words it otherwise."""
    try:
        return f"backfill {progress['id']} ({progress['state']}): {progress_text(progress)}"
    except (KeyError, TypeError, ValueError):
        return f"backfill: {json.dumps(progress)}"


def _reader(slot: str, reader: dict[str, Any], url: str) -> Finding:
    about = "pipeline"
    if reader.get("error"):
        return Finding(about, Level.FAIL, f"pipeline stopped replicating slot {slot}: {reader['error']}")
    if not reader.get("connected"):
        return Finding(about, Level.FAIL, f"pipeline running at {url} but not connected to slot {slot}: reconnecting "
                       "(its log says why)", follows=True)
    age = reader.get("heartbeat_age_s")
    if not reader.get("ready"):
        why = ("no heartbeat back through the slot yet (just started?)" if age is None
               else f"no fresh heartbeat through the slot (the last one {duration(age)} ago)")
        return Finding(about, Level.WARN, f"pipeline connected to slot {slot} but not ready: {why}")
    beat = "" if age is None else f", last heartbeat {duration(age)} ago ({reader.get('heartbeat_rtt_ms')} ms round trip)"
    return Finding(about, Level.OK, f"running and ready at {url}: slot {slot} connected{beat}")


# -- the command ---------------------------------------------------------------------------------


def collect(config_file: str, sample_s: float) -> Status:
    """Probe everything once, wait out the sample interval, sample the slots again, judge."""
    status = Status(config_file, sample_s)
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        status.findings += [Finding("config", Level.FAIL, f"{config_file}: {problem}") for problem in exc.problems]
        return status
    started = time.monotonic()
    databases = [_probe_database(db) for db in config.databases]
    sinks = asyncio.run(_probe_sinks(config.sinks, {db.name: db.slot.name for db in config.databases}))
    settings = config.walflow.health
    health = read_health(settings) if settings.enabled else None
    if sample_s > 0 and any(seen.conn is not None for seen in databases):
        time.sleep(max(0.0, sample_s - (time.monotonic() - started)))
        for seen in databases:
            _sample_again(seen)
    else:
        for seen in databases:
            seen.last = seen.first
            _close(seen)

    held = any(s.last is not None and s.last.holder is not None
               and s.last.holder.application_name == f"walflow:{s.db.slot.name}" for s in databases)
    status.findings += judge_pipeline(config, config_file, health, held)
    interval = config.walflow.replication.status_interval_ms / 1000
    for seen in databases:
        status.findings += _judge_database(seen, config, config_file, health, interval)
    for found, _ in sinks:
        status.findings += found
    status.details = {
        "checked_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "pipeline": None if health is None else health.as_json(),
        "databases": [_database_json(seen, trend(seen.first, seen.last) if seen.first and seen.last else None)
                      for seen in databases],
        "sinks": [details for _, details in sinks],
    }
    return status


def _judge_database(seen: _Database, config: Config, config_file: str, health: Health | None,
                    interval: float) -> list[Finding]:
    db = seen.db
    if seen.problem is not None:
        return [seen.problem]
    assert seen.first is not None and seen.last is not None and seen.publication is not None
    findings = [Finding(f"database {db.name}", Level.OK,
                        f"reachable at {db.hostname}:{db.port}/{db.database} (PostgreSQL {seen.version})")]
    pub = seen.publication
    sinks = [s for s in config.sinks if s.database == db.name]
    findings += judge_slot(db, config_file, seen.first, seen.last, health, tables_read(sinks, pub.tables), interval)
    about = f"publication {pub.name}"
    if not pub.exists:
        fix = ("start walflow: it creates the publication (publication.create_if_not_exists)"
               if db.publication.create_if_not_exists else hints.create_publication(pub.name))
        findings.append(Finding(about, Level.FAIL, f"publication {pub.name} does not exist: nothing is published", fix))
    elif not pub.tables:
        findings.append(Finding(about, Level.WARN, f"publication {pub.name} publishes no tables"))
    else:
        findings.append(Finding(about, Level.OK, f"{count(len(pub.tables), 'table')} ({', '.join(sorted(pub.actions))})"))
    return findings


def _database_json(seen: _Database, moved: Trend | None) -> dict[str, Any]:
    pub = seen.publication
    return {
        "name": seen.db.name, "reachable": seen.problem is None or seen.first is not None,
        "server_version": seen.version, "slot": {"name": seen.db.slot.name,
                                                 **(seen.last.as_json() if seen.last else {}),
                                                 "trend": None if moved is None else moved.as_json()},
        "publication": None if pub is None else {"name": pub.name, "exists": pub.exists, "tables": list(pub.tables),
                                                 "actions": sorted(pub.actions)},
    }


def main(config_file: str, *, as_json: bool, sample_s: float) -> int:
    status = collect(config_file, sample_s)
    if as_json:
        emit(json.dumps(status.as_json(), indent=2, default=str))
    else:
        emit("\n".join(status.lines(colour_wanted(sys.stdout))))
    return EXIT[status.verdict]
