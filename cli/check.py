"""``walflow check [CONFIG] [--json]``: can the pipeline run here, and if not, what to change.

It validates without starting the flow and without changing anything (:mod:`cli.probe`):
the config; per database the server (reachable, version, ``wal_level``), the role
(``REPLICATION``, ``SELECT`` on the tables the sinks read), the publication and its tables
(any without a replica identity), the slot and the server's room for it; per enabled sink
the NATS connection with its credentials and TLS, JetStream's API (``$JS.API.INFO``), the
stream walflow would use (the pipeline's own rules: found, to be created, or refused with
the reason), permission to publish on the sink's subjects and to reach walflow's bucket.

Privileges are checked both ways, against docs/least-privilege.sql and docs/nats-permissions.conf:
each one missing fails (or warns, where only backfills need it) with what to grant; each one
more than walflow needs warns — a superuser, a role that owns the tables it reads, a NATS user
that may delete streams (``$JS.API.>``) or, once its replies have an inbox prefix of their own,
read the account's others (``_INBOX.>``). Any role's right to write logical messages into the
slot (PUBLIC's ``EXECUTE`` on ``pg_logical_emit_message``) is noted.

That permission is probed with a publish that stores nothing: it carries a
``Nats-Expected-Stream`` no stream can be named, so JetStream refuses it before storing; its
refusal shows the server let the publish through (and which stream captures the subject), a
permissions violation shows it did not. A server that does not let the user publish there
answers with nothing else.

Every failed check says what to do. Exit 0 when every check passes (warnings do not fail
it), 1 when any fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import psycopg
from nats.errors import NoRespondersError

from cli.durability import durability_checks
from cli.probe import (
    NO_STREAM,
    SHARED_INBOX,
    TIMEOUT,
    Finding,
    Level,
    ProbeClient,
    ProbeError,
    Publication,
    Refused,
    Server,
    SlotSample,
    account_info,
    close_nats,
    colour_wanted,
    count,
    database_problem,
    emit,
    lost_slot_fix,
    may_delete_streams,
    may_publish,
    may_subscribe,
    open_nats,
    paint,
    pg_connect,
    publication,
    refusal,
    render,
    sample_slot,
    server,
    size,
    stream_info,
    stream_plan,
    tables_read,
    worst,
)
from config import ConfigError, load_config
from config.schema import Config, DatabaseConfig, SinkConfig
from connectors.nats.state import STATE_BUCKET
from connectors.postgres import hints
from connectors.postgres.protocol import lsn_to_str
from connectors.postgres.requests import _keyless
from connectors.postgres.slot import _NO_IDENTITY_QUERY, EMIT_QUERY
from core.display import printable
from core.subjects import covers, database_subjects, schema_pattern, subject, transaction_subject

NAMES: Final = {Level.OK: "pass", Level.INFO: "info", Level.WARN: "warn", Level.FAIL: "fail"}
TAGS: Final = {Level.OK: "ok", Level.INFO: "note", Level.WARN: "warn", Level.FAIL: "FAIL"}
#: walflow asks pgoutput for logical messages (heartbeats, backfill watermarks): PostgreSQL 14.
MIN_VERSION: Final = 140000

_ROLE_QUERY = "SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user"
_OWNED_QUERY = """
SELECT p.schemaname || '.' || p.tablename FROM pg_publication_tables p
JOIN pg_namespace n ON n.nspname = p.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
WHERE p.pubname = %s AND pg_has_role(c.relowner, 'USAGE')
"""
#: Where the findings on NATS permissions point.
NATS_PERMISSIONS: Final = "docs/nats-permissions.conf"
#: Where a finding of more privilege than walflow needs points.
LEAST_PRIVILEGE: Final = ("run walflow as a role made by docs/least-privilege.sql (LOGIN REPLICATION, SELECT on the "
                          "published tables, EXECUTE on pg_logical_emit_message)")
_UNREADABLE_QUERY = """
SELECT schemaname || '.' || tablename FROM pg_publication_tables
WHERE pubname = %s AND NOT has_table_privilege(format('%%I.%%I', schemaname, tablename), 'SELECT')
"""


class _Warnings(logging.Handler):
    """The config's warnings (keys ignored, values replaced), kept as findings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _config_warnings() -> Iterator[_Warnings]:
    logger = logging.getLogger("walflow.config")
    handler, level, propagate = _Warnings(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def check(config_file: str) -> list[Finding]:
    """Every check, in the order the pipeline meets them."""
    with _config_warnings() as warnings:
        try:
            config = load_config(config_file)
        except ConfigError as exc:
            return [Finding("config", Level.FAIL, f"{config_file}: {problem}",
                            "correct the file (the path says where)") for problem in exc.problems]
    findings = [Finding("config", Level.OK, f"{config_file} loads: {count(len(config.databases), 'database')}, "
                        f"{count(len(config.sinks), 'sink')}")]
    findings += [Finding("config", Level.WARN, message) for message in warnings.messages]
    published: dict[str, tuple[str, ...]] = {}
    for db in config.databases:
        findings += _check_database(db, config, config_file, published)
    findings += asyncio.run(_check_sinks(config, published))
    return findings


# -- a database ----------------------------------------------------------------------------------


def _check_database(db: DatabaseConfig, config: Config, config_file: str,
                    published: dict[str, tuple[str, ...]]) -> list[Finding]:
    """The database's checks; the tables its publication streams go to ``published``."""
    try:
        with pg_connect(db, "check") as conn:
            return _database_checks(conn, db, config, config_file, published)
    except psycopg.Error as exc:
        return [database_problem(db, exc)]


def _database_checks(conn: psycopg.Connection[Any], db: DatabaseConfig, config: Config, config_file: str,
                     published: dict[str, tuple[str, ...]]) -> list[Finding]:
    about = f"database {db.name}"
    srv = server(conn)
    findings = [Finding(about, Level.OK, f"reachable at {db.hostname}:{db.port}/{db.database} as '{db.username}' "
                        f"(PostgreSQL {srv.version.split()[0]})")]
    if srv.version_num < MIN_VERSION:
        findings.append(Finding(about, Level.FAIL, f"PostgreSQL {srv.version}: walflow needs 14 or newer (it reads "
                                "logical messages through pgoutput)", "upgrade PostgreSQL"))
    if srv.wal_level != "logical":
        findings.append(Finding(about, Level.FAIL, f"wal_level is '{srv.wal_level}': logical replication needs "
                                "'logical'", "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"))
    else:
        findings.append(Finding(about, Level.OK, "wal_level is 'logical'"))
    row = conn.execute(_ROLE_QUERY).fetchone()
    superuser, replication = bool(row and row[0]), bool(row and row[1])
    if superuser or replication:
        findings.append(Finding(about, Level.OK, f"role '{db.username}' may stream changes "
                                f"({'superuser' if superuser else 'REPLICATION'})"))
    else:
        findings.append(Finding(about, Level.FAIL, f"role '{db.username}' may not stream changes: it has neither "
                                "REPLICATION nor SUPERUSER", f"{hints.grant_replication(db.username)} (as a superuser)"))
    if superuser:
        findings.append(Finding(about, Level.WARN, f"role '{db.username}' is a superuser: more than walflow needs (it "
                                "may read and change everything on the server)", LEAST_PRIVILEGE))
    sinks = [s for s in config.sinks if s.database == db.name]
    findings += _message_checks(conn, db, sinks, superuser)
    pub = publication(conn, db)
    published[db.name] = pub.tables
    findings += _publication_checks(conn, db, pub, sinks, superuser)
    findings += _slot_checks(conn, db, srv, config_file, tables_read(sinks, pub.tables))
    return findings


def _publication_checks(conn: psycopg.Connection[Any], db: DatabaseConfig, pub: Publication,
                        sinks: list[SinkConfig], superuser: bool) -> list[Finding]:
    about = f"publication {pub.name}"
    if not pub.exists:
        create = hints.create_publication(pub.name)
        if not db.publication.create_if_not_exists:
            return [Finding(about, Level.FAIL, f"publication {pub.name} does not exist in database '{db.database}'",
                            f"{create} or set publication.create_if_not_exists: true for database '{db.name}'")]
        if db.publication.init_sql is None and not superuser:
            return [Finding(about, Level.FAIL, f"publication {pub.name} does not exist, and walflow would create it "
                            f"FOR ALL TABLES, which only a superuser may", "create it once as the tables' owner: "
                            f"{hints.create_publication(pub.name, [])} (docs/least-privilege.sql), or as a superuser: "
                            f"{create}")]
        how = "its init_sql" if db.publication.init_sql else "FOR ALL TABLES"
        return [Finding(about, Level.OK, f"publication {pub.name} does not exist: walflow creates it at start "
                        f"({how}); run check again then to check its tables")]
    if not pub.tables:
        return [Finding(about, Level.WARN, f"publication {pub.name} publishes no tables: walflow delivers nothing",
                        hints.add_to_publication(pub.name))]
    read = {table for _, table in tables_read(sinks, pub.tables)}
    findings = [Finding(about, Level.OK, f"publication {pub.name}: {count(len(pub.tables), 'table')} "
                        f"({', '.join(sorted(pub.actions))}), {len(read)} read by the enabled sinks")]
    findings += _select_checks(conn, db, pub, sinks, read)
    if not superuser:
        findings += _owner_checks(conn, db, pub, read)
    findings += _identity_checks(conn, db, pub, read)
    return findings


def _select_checks(conn: psycopg.Connection[Any], db: DatabaseConfig, pub: Publication, sinks: list[SinkConfig],
                   read: set[str]) -> list[Finding]:
    about = f"publication {pub.name}"
    unreadable = sorted({t for (t,) in conn.execute(_UNREADABLE_QUERY, [pub.name]).fetchall()} & read)
    if not unreadable:
        return [Finding(about, Level.OK, f"role '{db.username}' may SELECT every table the sinks read")]
    initial = {t for s in sinks for t in _initial_tables(s, read)}
    grant = hints.grant_select(unreadable, db.username)
    now = [t for t in unreadable if t in initial]
    if now:
        return [Finding(about, Level.FAIL, f"role '{db.username}' may not SELECT {', '.join(now)}, which "
                        "initial_backfill reads at the first start", grant)]
    return [Finding(about, Level.WARN, f"role '{db.username}' may not SELECT {', '.join(unreadable)}: changes "
                    "stream, but walflow backfill cannot read them", grant)]


def _initial_tables(sink: SinkConfig, read: set[str]) -> set[str]:
    if sink.initial_backfill is True:
        return read
    if isinstance(sink.initial_backfill, list):
        return {entry.table for entry in sink.initial_backfill}
    return set()


def _owner_checks(conn: psycopg.Connection[Any], db: DatabaseConfig, pub: Publication,
                  read: set[str]) -> list[Finding]:
    """Tables the role owns (or may act as the owner of): it may alter or drop them, where SELECT is enough."""
    owned = sorted({t for (t,) in conn.execute(_OWNED_QUERY, [pub.name]).fetchall()} & read)
    if not owned:
        return []
    return [Finding(f"publication {pub.name}", Level.WARN, f"role '{db.username}' owns {', '.join(owned)}: more "
                    "than walflow needs (an owner may alter and drop them; walflow only reads them)", LEAST_PRIVILEGE)]


def _message_checks(conn: psycopg.Connection[Any], db: DatabaseConfig, sinks: list[SinkConfig],
                    superuser: bool) -> list[Finding]:
    """Whether the role may write logical messages (heartbeats, backfill signals and watermarks),
    and whether every other role may too (which only walflow needs)."""
    about = f"database {db.name}"
    rows = conn.execute(EMIT_QUERY).fetchall()
    findings = []
    denied = [name for name, allowed, _ in rows if not allowed]
    if denied:
        initial = [s.name for s in sinks if s.enabled and s.initial_backfill]
        text = f"role '{db.username}' may not write logical messages (pg_logical_emit_message): "
        grant = f"{hints.grant_execute(denied, db.username)} (as a superuser)"
        if initial:
            findings.append(Finding(about, Level.FAIL, text + f"initial_backfill of {', '.join(initial)} cannot start",
                                    grant))
        else:
            findings.append(Finding(about, Level.WARN, text + "no heartbeats, and walflow backfill cannot run", grant))
    elif not superuser:
        findings.append(Finding(about, Level.OK, f"role '{db.username}' may write logical messages (heartbeats, "
                                "backfill signals)"))
    if any(public for _, _, public in rows):
        findings.append(Finding(about, Level.INFO, "every role of the database may write logical messages into "
                                "walflow's slot (pg_logical_emit_message is PUBLIC's): walflow checks what it reads, "
                                "but only it need write them", "step 2 of docs/least-privilege.sql: REVOKE EXECUTE "
                                "... FROM PUBLIC, then GRANT EXECUTE ... to walflow's role"))
    return findings


def _identity_checks(conn: psycopg.Connection[Any], db: DatabaseConfig, pub: Publication,
                     read: set[str]) -> list[Finding]:
    about = f"publication {pub.name}"
    findings = []
    rows = conn.execute(_NO_IDENTITY_QUERY, [pub.name]).fetchall()
    missing = {f"{schema}.{table}": "REPLICA IDENTITY NOTHING" if ident == "n" else "no primary key"
               for schema, table, ident in rows}
    if missing:
        listed = ", ".join(f"{t} ({why})" for t, why in sorted(missing.items()))
        fix = (f"give each a primary key, or {hints.replica_identity_full(min(missing))} (and likewise the "
               "others)")
        if pub.actions & {"update", "delete"}:
            findings.append(Finding(about, Level.FAIL, f"tables without a replica identity: {listed}; PostgreSQL "
                                    "rejects their UPDATEs and DELETEs while the publication publishes them", fix))
        else:
            findings.append(Finding(about, Level.INFO, f"tables without a replica identity: {listed} (harmless while "
                                    "the publication publishes no updates or deletes)"))
    else:
        findings.append(Finding(about, Level.OK, "every published table has a replica identity"))
    keyless = sorted((_keyless(conn, db) & read) - set(missing))
    if keyless:
        findings.append(Finding(about, Level.WARN, f"{', '.join(keyless)}: no primary key (REPLICA IDENTITY FULL "
                                "only): changes stream, but walflow cannot backfill them", "add a primary key"))
    return findings


def _slot_checks(conn: psycopg.Connection[Any], db: DatabaseConfig, srv: Server, config_file: str,
                 backfills: list[tuple[str, str]]) -> list[Finding]:
    about, name = f"slot {db.slot.name}", db.slot.name
    slot = sample_slot(conn, name)
    findings = []
    if not slot.exists:
        if not db.slot.create_if_not_exists:
            return [Finding(about, Level.FAIL, f"slot {name} does not exist",
                            f"{hints.create_slot(name)} or set slot.create_if_not_exists: true for database "
                            f"'{db.name}'")]
        if srv.slots_used >= srv.max_replication_slots:
            return [Finding(about, Level.FAIL, f"slot {name} does not exist, and every one of max_replication_slots "
                            f"({srv.max_replication_slots}) is in use: walflow could not create it",
                            "drop an unused slot (pg_replication_slots), or raise max_replication_slots and restart "
                            "PostgreSQL")]
        findings.append(Finding(about, Level.OK, f"slot {name} does not exist: walflow creates it at start "
                                f"({srv.slots_used} of {srv.max_replication_slots} replication slots in use)"))
    elif slot.plugin != "pgoutput" or slot.database != db.database:
        return [Finding(about, Level.FAIL, f"slot {name} belongs to plugin '{slot.plugin}' in database "
                        f"'{slot.database}'; walflow needs a pgoutput slot in '{db.database}'",
                        "choose another slot name, or drop that slot if it is unused")]
    elif slot.wal_status == "lost":
        return [Finding(about, Level.FAIL, f"slot {name} was invalidated by PostgreSQL (wal_status lost): the "
                        "changes after its confirmed LSN are gone from it", lost_slot_fix(db, config_file, backfills))]
    else:
        findings.append(_existing_slot(db, slot))
    if not slot.active and srv.wal_senders_used >= srv.max_wal_senders:
        findings.append(Finding(about, Level.FAIL, f"every one of max_wal_senders ({srv.max_wal_senders}) is in use: "
                                "walflow could not stream", "raise max_wal_senders and restart PostgreSQL, or end "
                                "an unused replication connection"))
    return findings


def _existing_slot(db: DatabaseConfig, slot: SlotSample) -> Finding:
    about, name = f"slot {db.slot.name}", db.slot.name
    holder = slot.holder
    where = f"confirmed LSN {lsn_to_str(slot.confirmed_lsn or 0)}, lag {size(slot.lag or 0)}"
    if holder is not None and holder.application_name != f"walflow:{name}":
        return Finding(about, Level.WARN, f"slot {name} is held by {holder.describe()}: walflow would wait until it "
                       "is released", f"if it should not read slot {name}: SELECT pg_terminate_backend({holder.pid});")
    if slot.wal_status == "unreserved":
        return Finding(about, Level.WARN, f"slot {name}: wal_status unreserved, PostgreSQL removes WAL it needs at the "
                       f"next checkpoint unless it catches up ({where})", "start walflow now, or raise "
                       "max_slot_wal_keep_size")
    running = f"; in use by walflow, {holder.describe()}" if holder is not None else ""
    return Finding(about, Level.OK, f"slot {name} exists ({where}, wal_status {slot.wal_status}){running}")


# -- a sink --------------------------------------------------------------------------------------


async def _check_sinks(config: Config, published: dict[str, tuple[str, ...]]) -> list[Finding]:
    findings = []
    for sink in config.sinks:
        findings += await _check_sink(sink, published.get(sink.database, ()))
    return findings


async def _check_sink(sink: SinkConfig, tables: tuple[str, ...]) -> list[Finding]:
    about, dest = f"sink {sink.name}", sink.destination
    if not sink.enabled:
        return [Finding(about, Level.INFO, f"disabled (status: {sink.status}): not checked")]
    try:
        nc = await open_nats(dest, f"walflow:{sink.name}:check")
    except ProbeError as exc:
        return [Finding(about, Level.FAIL, exc.text, exc.fix)]
    auth = "with its credentials" if dest.logs_in else "without credentials"
    tls = ", TLS" if dest.uses_tls else ""
    findings = [Finding(about, Level.OK, f"NATS at {', '.join(dest.display_urls)} accepts the sink's connection "
                        f"({auth}{tls})")]
    try:
        findings += await _jetstream_checks(nc, sink, tables)
    except ProbeError as exc:
        findings.append(Finding(about, Level.FAIL, exc.text, exc.fix))
    except Refused:
        findings.append(Finding(about, Level.FAIL, refusal(nc, dest, f"a JetStream API request of sink '{sink.name}'")
                                .text))
    except NoRespondersError:
        findings.append(Finding(about, Level.FAIL, "JetStream does not answer its API on this account",
                                "enable JetStream for the account of the sink's user"))
    except TimeoutError:
        findings.append(Finding(about, Level.FAIL, "JetStream did not answer within 5 s",
                                "check the NATS server's JetStream (its log; `nats server check jetstream`)"))
    finally:
        await close_nats(nc)
    return findings


async def _event_subjects(nc: ProbeClient, sink: SinkConfig, stream: str) -> list[Finding]:
    """Whether ``stream`` stores the events a sink publishes beside its changes (transaction
    markers, schema events): a stream capturing the change subjects only would not, and the
    sink refuses it at start."""
    prefix, database = sink.destination.subject_prefix, sink.database
    wanted = [(setting, pattern) for setting, pattern, on in (
        ("transaction_markers", transaction_subject(prefix, database, "*"), sink.transaction_markers),
        ("schema_events", schema_pattern(prefix, database), sink.schema_events)) if on]
    if not wanted:
        return []
    captured = (await stream_info(nc, stream))["subjects"]
    return [Finding(f"sink {sink.name}", Level.FAIL, f"stream {stream} does not capture {pattern}, where the sink's "
                    f"{setting} are published (it captures {', '.join(captured)})",
                    fix=f"add {pattern} to the stream's subjects, or set {setting}: false")
            for setting, pattern in wanted if not any(covers(p, pattern) for p in captured)]


async def _jetstream_checks(nc: ProbeClient, sink: SinkConfig, tables: tuple[str, ...]) -> list[Finding]:
    about, dest = f"sink {sink.name}", sink.destination
    info = await account_info(nc, dest)
    findings = [Finding(about, Level.OK, f"JetStream answers $JS.API.INFO ({count(info.get('streams', 0), 'stream')} "
                        "in the account)")]
    plan = await stream_plan(nc, dest, sink.database, atomic=sink.transactions == "atomic")
    if plan.action == "refused":
        findings.append(Finding(about, Level.FAIL, str(plan.problem)))
    elif plan.action == "use":
        findings.append(Finding(about, Level.OK, f"stream {plan.name} captures the sink's subjects "
                                f"({database_subjects(dest.subject_prefix, sink.database)}; STREAM.INFO answered)"))
    elif plan.action == "create":
        findings.append(Finding(about, Level.OK, f"stream {plan.name} does not exist: walflow creates it at start, "
                                f"capturing {', '.join(plan.subjects)}"))
    elif plan.action == "extend":
        findings.append(Finding(about, Level.OK, f"stream {plan.name} (created by walflow) does not capture database "
                                f"'{sink.database}' yet: walflow adds {plan.subjects[-1]} to it at start"))
    elif plan.action == "allow_atomic":
        findings.append(Finding(about, Level.OK, f"stream {plan.name} (created by walflow) does not allow atomic "
                                "batches yet: walflow sets allow_atomic at start (transactions: atomic)"))
    if plan.action in ("use", "allow_atomic") and plan.name is not None:
        findings += await _event_subjects(nc, sink, plan.name)
    findings += await durability_checks(nc, sink, plan.name if plan.action in ("use", "extend", "allow_atomic") else None)
    target = _probe_subject(sink, tables)
    try:
        captured_by = await may_publish(nc, target)
    except Refused as exc:
        return [*findings, Finding(about, Level.FAIL, f"NATS refused a publish on {target} "
                                   f"({str(exc).removeprefix('nats: ')})",
                                   f"grant {_nats_user(sink)} publish permission on {dest.subject_prefix}.>")]
    where = f"stream {captured_by} captures it" if captured_by else "no stream captures it yet"
    findings.append(Finding(about, Level.OK, f"may publish on {target} ({where}; probed with a publish JetStream "
                            "refuses, so nothing was stored)"))
    return findings + await _privilege_checks(nc, sink)


async def _privilege_checks(nc: ProbeClient, sink: SinkConfig) -> list[Finding]:
    """What the sink's NATS user may do beyond walflow's needs (docs/nats-permissions.conf):
    delete streams (``$JS.API.>``), read the replies of the account's other users
    (``_INBOX.>``, once walflow's own arrive elsewhere); and whether it may reach walflow's bucket."""
    about = f"sink {sink.name}"
    bucket = f"KV_{STATE_BUCKET}"
    try:
        await nc.request(f"$JS.API.STREAM.INFO.{bucket}", b"", timeout=TIMEOUT)
    except Refused as exc:
        return [Finding(about, Level.FAIL, f"NATS refused a lookup of walflow's key-value bucket ({bucket}: "
                        f"{str(exc).removeprefix('nats: ')})", f"grant {_nats_user(sink)} publish permission on "
                        f"$JS.API.STREAM.INFO.{bucket} and the bucket's other subjects ({NATS_PERMISSIONS})")]
    findings = [Finding(about, Level.OK, f"may look up walflow's key-value bucket ({bucket})")]
    if await may_delete_streams(nc):
        findings.append(Finding(about, Level.WARN, f"{_nats_user(sink)} may delete streams (probed with one that "
                                "cannot exist): more than walflow needs; with $JS.API.> it may delete or purge every "
                                "stream of the account", f"grant it only the subjects walflow uses ({NATS_PERMISSIONS})"))
    else:
        findings.append(Finding(about, Level.OK, f"{_nats_user(sink)} may not delete streams (not all of JetStream's "
                                "API, $JS.API.>, is granted)"))
    own = nc.reply_prefix
    if own != SHARED_INBOX:
        if await may_subscribe(nc, f"{SHARED_INBOX}.{NO_STREAM.replace('.', '_')}"):
            findings.append(Finding(about, Level.WARN, f"{_nats_user(sink)} may subscribe to {SHARED_INBOX}.>, where "
                                    "the account's other users get their replies: it can read them",
                                    f"grant it subscribe on {own}.> only, its replies' prefix ({NATS_PERMISSIONS})"))
        else:
            findings.append(Finding(about, Level.OK, f"replies arrive under {own}.>, and {_nats_user(sink)} may not "
                                    f"read the account's other replies ({SHARED_INBOX}.>)"))
    return findings


def _nats_user(sink: SinkConfig) -> str:
    return f"user '{sink.destination.username}'" if sink.destination.username else "the sink's NATS user"


def _probe_subject(sink: SinkConfig, tables: tuple[str, ...]) -> str:
    """A subject the sink publishes on: its first published table's, else a made-up table's."""
    read = tables_read([sink], tables)
    schema, _, table = read[0][1].partition(".") if read else ("walflow", "", "check")
    action = "insert" if "insert" in sink.actions else sink.actions[0]
    return subject(sink.destination.subject_prefix, sink.database, schema, table, action)


# -- the command ---------------------------------------------------------------------------------


def main(config_file: str, *, as_json: bool) -> int:
    findings = check(config_file)
    failed = [f for f in findings if f.level == Level.FAIL]
    verdict = "fail" if failed else "pass"
    if as_json:
        emit(json.dumps({"verdict": verdict, "config": config_file, "failed": len(failed),
                          "checks": [f.as_json(NAMES) for f in findings]}, indent=2))
    else:
        colour = colour_wanted(sys.stdout)
        warned = sum(f.level == Level.WARN for f in findings)
        counted = sum(f.level != Level.INFO for f in findings)
        why = (f"{len(failed)} of {counted} checks failed" if failed
               else f"all {counted} checks pass" + (f" ({warned} with a warning)" if warned else ""))
        head = f"walflow check: {paint(verdict.upper(), worst(findings), colour)} — {why}"
        emit("\n".join([head, f"config {printable(config_file)}", "", *render(findings, TAGS, colour=colour)]))
    return 1 if failed else 0
