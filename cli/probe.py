"""What ``walflow check`` and ``walflow status`` both ask, read-only, and how they say it.

Both commands look at the same things — the database (settings, role, publication, the slot
and whoever holds it), NATS (the connection, JetStream's API, the sink's stream) and the
pipeline's health endpoint — and report one :class:`Finding` a line, a failure with its fix.
They differ in what they make of it: ``check`` asks whether the pipeline *can* run,
``status`` whether it *does*.

Nothing here changes anything. Postgres gets ``SELECT`` and ``SHOW`` only. The NATS
connection is a :class:`ProbeClient`, which sends JetStream's lookups (``INFO``,
``STREAM.INFO``, ``STREAM.NAMES``), reads of one stored message (``STREAM.MSG.GET``,
``DIRECT.GET``: walflow's own records in its key-value bucket), a ``STREAM.DELETE`` of a stream
that cannot exist (:data:`NO_SUCH_STREAM`: its answer shows the user may delete streams) and
publishes that carry a ``Nats-Expected-Stream`` no stream can be named (JetStream refuses those
before storing anything), and raises
:class:`WouldChange` instead of sending any other message. That is what lets
:func:`stream_plan` run the pipeline's own stream rules (``connectors.nats.stream.ensure_stream``)
as they are: they stop at the first change they would make, which says what the pipeline
would do, and their refusals are the pipeline's own words.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum
from typing import Any, Final, Literal, TextIO

import psycopg
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from psycopg.conninfo import make_conninfo

from config.schema import DatabaseConfig, HealthSettings, NatsDestination, SinkConfig
from connectors.nats.connection import (
    _credentials_hint,
    connect_options,
    permission_error,
    refused_at_connect,
    sorted_as,
)
from connectors.nats.natspy import WalflowClient
from connectors.nats.stream import ensure_stream
from connectors.postgres import hints
from connectors.postgres.connection import conninfo, tls_failure
from connectors.postgres.protocol import lsn_to_str, str_to_lsn
from connectors.postgres.requests import _published
from core.display import printable
from core.errors import NatsAuthError, NatsPermissionError, NatsTlsError, StreamSetupError, nats_error
from transforms.filter import SinkFilter


class Level(IntEnum):
    """How much a finding matters; each command names the levels its own way."""

    OK = 0
    INFO = 1
    #: ``status``: degraded (changes flow, something needs attention); ``check``: a warning, not a failure.
    WARN = 2
    #: ``status``: down (changes do not reach JetStream now); ``check``: a failed check.
    FAIL = 3


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of a report: what it is about, how much it matters, what was found, what to do."""

    about: str
    level: Level
    text: str
    #: What to run or change. None where there is nothing to do, or where ``text`` is a
    #: message of the pipeline's own, which already ends with what to do.
    fix: str | None = None
    #: What another finding explains (a slot inactive because the pipeline is not running):
    #: a verdict names its causes first.
    follows: bool = False

    def as_json(self, names: Mapping[Level, str]) -> dict[str, object]:
        return {"about": self.about, "level": names[self.level], "text": self.text, "fix": self.fix}


class ProbeError(Exception):
    """A probe that could not get its answer; the finding says why and what to do."""

    def __init__(self, text: str, fix: str | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.fix = fix


def first_line(exc: BaseException) -> str:
    """An exception as one line: drivers' messages run over several (psycopg adds DETAIL, HINT)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def worst(findings: Iterable[Finding]) -> Level:
    return max((f.level for f in findings), default=Level.OK)


# -- text and colour ------------------------------------------------------------------------

_PAINT: Final = {Level.OK: "32", Level.INFO: "36", Level.WARN: "33", Level.FAIL: "1;31"}


def colour_wanted(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    """Colour on a terminal only, and never with ``NO_COLOR`` set (https://no-color.org)."""
    return stream.isatty() and not (env if env is not None else os.environ).get("NO_COLOR")


def emit(text: str) -> None:
    """Print a report; a reader that has gone (``| head``) is no error: the exit status still tells."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout again at exit


def paint(text: str, level: Level, colour: bool) -> str:
    return f"\x1b[{_PAINT[level]}m{text}\x1b[0m" if colour else text


def render(findings: Sequence[Finding], tags: Mapping[Level, str], *, colour: bool) -> list[str]:
    """One line a finding under a heading per subject, and its fix indented below it. What a
    finding says may hold names the database or NATS chose (tables, streams, their errors):
    their control characters are escaped (:func:`core.display.printable`), and only walflow's
    own colours reach the terminal."""
    width = max(len(tag) for tag in tags.values())
    lines: list[str] = []
    about = None
    for finding in findings:
        if finding.about != about:
            about = finding.about
            lines.append(f"\x1b[1m{printable(about)}\x1b[0m" if colour else printable(about))
        lines.append(f"  {paint(tags[finding.level].ljust(width), finding.level, colour)}  {printable(finding.text)}")
        if finding.fix:
            lines.append(f"  {' ' * width}  fix: {printable(finding.fix)}")
    return lines


def count(n: int, thing: str) -> str:
    """``1 table``, ``3 tables``."""
    return f"{n} {thing}{'' if n == 1 else 's'}"


def size(n: float) -> str:
    """Bytes in ``pg_size_pretty``'s units (1024 steps: ``592 bytes``, ``67 GB``), which operators compare
    with; a unit up already from 1024 rather than 10240 (``1.5 GB``, not ``1536 MB``), to read at a glance."""
    value = float(n)
    if abs(value) < 1024:
        return f"{int(value)} bytes"
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TB":
            break
    return f"{value:.1f} {unit}" if abs(value) < 10 else f"{value:.0f} {unit}"


def duration(seconds: float) -> str:
    """``3 s``, ``14 min``, ``2 h 5 min``: how long, as a person says it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min" if minutes % 60 else f"{minutes // 60} h"


# -- PostgreSQL -------------------------------------------------------------------------------


def pg_connect(db: DatabaseConfig, purpose: str) -> psycopg.Connection[Any]:
    """A normal connection that gives up after 5 s: a probe reports an unreachable database
    instead of waiting for it as the pipeline does (``await_database``)."""
    info = make_conninfo(conninfo(db, application_name=f"walflow:{db.slot.name}:{purpose}"), connect_timeout=5)
    return psycopg.connect(info, autocommit=True)


def database_problem(db: DatabaseConfig, exc: psycopg.Error) -> Finding:
    """A database that could not be reached (a TLS setup that failed: the pipeline's own fatal
    line), or refused a probe's query."""
    if not isinstance(exc, psycopg.OperationalError):
        return Finding(f"database {db.name}", Level.FAIL, f"database '{db.name}' refused a query: {first_line(exc)}")
    tls = tls_failure(db, exc)
    if tls is not None:
        return Finding(f"database {db.name}", Level.FAIL, str(tls))
    return Finding(
        f"database {db.name}",
        Level.FAIL,
        f"cannot reach database '{db.name}' at {db.hostname}:{db.port}/{db.database}: {first_line(exc)}",
        f"check that PostgreSQL runs there and lets '{db.username}' in (hostname, port, database, username, "
        f"password and sslmode of database '{db.name}' in the config)",
    )


@dataclass(frozen=True, slots=True)
class Server:
    """The server settings both commands report."""

    version: str
    version_num: int
    wal_level: str
    max_replication_slots: int
    max_wal_senders: int
    slots_used: int
    wal_senders_used: int


_SERVER_QUERY = """
SELECT current_setting('server_version'), current_setting('server_version_num')::int, current_setting('wal_level'),
       current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_replication_slots),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')
"""


def server(conn: psycopg.Connection[Any]) -> Server:
    row = conn.execute(_SERVER_QUERY).fetchone()
    assert row is not None
    return Server(*row)


@dataclass(frozen=True, slots=True)
class Holder:
    """The backend that holds a slot, as ``pg_stat_replication`` and ``pg_stat_activity`` show it."""

    pid: int
    #: None when the server hides it (another role's session, without ``pg_read_all_stats``).
    application_name: str | None
    client: str | None
    wait_event: str | None
    #: A replication connection (in ``pg_stat_replication``), not a SQL function reading the slot.
    walsender: bool
    #: Seconds since its last status reply (since it connected, if it never replied).
    reply_age_s: float | None
    #: ``pg_stat_replication.flush_lag``: how old the WAL at the slot's confirmed position is.
    #: It keeps growing while the client replies without confirming anything: how long the slot has been stuck.
    flush_lag_s: float | None

    def describe(self) -> str:
        """``PID 19053 (walflow:wf_slot, local, last reply 14 min ago)``."""
        parts = [self.application_name or "application hidden", self.client or "client hidden"]
        if self.reply_age_s is not None:
            parts.append(f"last reply {duration(self.reply_age_s)} ago")
        elif not self.walsender:
            parts.append("reading the slot through SQL")
        return f"PID {self.pid} ({', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class SlotSample:
    """A slot as the server saw it at one moment, with the server's WAL position then."""

    at: datetime
    current_lsn: int
    exists: bool
    plugin: str | None
    database: str | None
    active: bool
    confirmed_lsn: int | None
    wal_status: str | None
    #: Bytes of WAL that can still be written before the slot is in danger (None: no limit).
    safe_wal_size: int | None
    holder: Holder | None

    @property
    def lag(self) -> int | None:
        """``pg_current_wal_lsn() - confirmed_flush_lsn``: WAL kept for the slot, not yet confirmed."""
        return None if self.confirmed_lsn is None else max(self.current_lsn - self.confirmed_lsn, 0)

    def as_json(self) -> dict[str, object]:
        holder = self.holder
        return {
            "exists": self.exists, "plugin": self.plugin, "database": self.database, "active": self.active,
            "current_lsn": lsn_to_str(self.current_lsn),
            "confirmed_lsn": None if self.confirmed_lsn is None else lsn_to_str(self.confirmed_lsn),
            "lag_bytes": self.lag, "wal_status": self.wal_status, "safe_wal_size": self.safe_wal_size,
            "holder": None if holder is None else {
                "pid": holder.pid, "application_name": holder.application_name, "client": holder.client,
                "walsender": holder.walsender, "wait_event": holder.wait_event,
                "last_reply_age_s": holder.reply_age_s, "flush_lag_s": holder.flush_lag_s,
            },
        }


_SLOT_SAMPLE = """
SELECT clock_timestamp(), pg_current_wal_lsn()::text,
       s.slot_name IS NOT NULL, s.plugin, s.database, coalesce(s.active, false), s.active_pid,
       s.confirmed_flush_lsn::text, s.wal_status, s.safe_wal_size,
       coalesce(r.application_name, a.application_name),
       CASE WHEN r.pid IS NOT NULL OR a.pid IS NOT NULL THEN coalesce(host(r.client_addr), host(a.client_addr), 'local') END,
       a.wait_event, r.pid IS NOT NULL,
       extract(epoch FROM clock_timestamp() - coalesce(r.reply_time, r.backend_start))::float8,
       extract(epoch FROM r.flush_lag)::float8
FROM (VALUES (%s::name)) AS wanted (name)
LEFT JOIN pg_replication_slots s ON s.slot_name = wanted.name
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
"""


def sample_slot(conn: psycopg.Connection[Any], slot: str) -> SlotSample:
    row = conn.execute(_SLOT_SAMPLE, [slot]).fetchone()
    assert row is not None
    (at, current, exists, plugin, database, active, pid, confirmed, wal_status, safe,
     app, client, wait_event, walsender, reply_age, flush_lag) = row
    holder = None if pid is None else Holder(pid, app, client, wait_event, walsender, reply_age, flush_lag)
    return SlotSample(at, str_to_lsn(current), exists, plugin, database, active,
                      None if confirmed is None else str_to_lsn(confirmed), wal_status,
                      None if safe is None else int(safe), holder)


@dataclass(frozen=True, slots=True)
class Publication:
    name: str
    exists: bool
    #: ``schema.table``, as ``pg_publication_tables`` lists them.
    tables: tuple[str, ...] = ()
    #: The actions it publishes (``insert``, ``update``, ``delete``, ``truncate``).
    actions: frozenset[str] = frozenset()


_PUBLICATION_QUERY = "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s"


def publication(conn: psycopg.Connection[Any], db: DatabaseConfig) -> Publication:
    name = db.publication.name
    row = conn.execute(_PUBLICATION_QUERY, [name]).fetchone()
    if row is None:
        return Publication(name, False)
    actions = frozenset(a for a, on in zip(("insert", "update", "delete", "truncate"), row, strict=True) if on)
    return Publication(name, True, tuple(_published(conn, db)), actions)


def tables_read(sinks: Iterable[SinkConfig], tables: Iterable[str]) -> list[tuple[str, str]]:
    """(sink, table) for every published table each enabled sink reads."""
    filters = [(sink.name, SinkFilter(sink)) for sink in sinks if sink.enabled]
    return [(name, table) for table in tables for name, rules in filters
            if rules.receives(table.partition(".")[0], table)]


def lost_slot_fix(db: DatabaseConfig, config_file: str, backfills: Sequence[tuple[str, str]]) -> str:
    """The commands that bring back an invalidated slot and what it lost: drop it, have it
    created again, and backfill every table a sink reads from it."""
    slot = db.slot.name
    steps = [hints.drop_slot(slot)]
    if not db.slot.create_if_not_exists:
        steps.append(hints.create_slot(slot))
    steps.append(f"start walflow ({shlex.join(['./run.sh', 'run', config_file])})"
                 + (", which creates the slot again;" if db.slot.create_if_not_exists else ";"))
    if backfills:
        steps.append("backfill what the slot lost: " + "; ".join(
            shlex.join(["walflow", "backfill", config_file, "--sink", sink, "--table", table])
            for sink, table in backfills))
    else:
        steps.append("backfill the tables the sinks read (walflow backfill CONFIG --sink NAME --table SCHEMA.TABLE)")
    return " then ".join(steps)


# -- NATS -------------------------------------------------------------------------------------

#: A ``Nats-Expected-Stream`` that no stream can match (stream names hold no ``.``):
#: JetStream refuses such a publish before it stores anything, and its refusal shows that
#: the server let the publish through, and which stream captures the subject.
NO_STREAM: Final = "walflow.check"
#: JetStream's error code for a ``Nats-Expected-Stream`` that does not match.
STREAM_MISMATCH: Final = 10060
#: How long a probe waits for an answer (the pipeline's own requests wait as long).
TIMEOUT: Final = 5.0
#: A stream that cannot exist (JetStream refuses a name with a path separator): asking to delete
#: it deletes nothing, and its answer ("stream not found") shows that the user may delete streams.
NO_SUCH_STREAM: Final = "walflow/check"
_DELETE_PROBE: Final = f"$JS.API.STREAM.DELETE.{NO_SUCH_STREAM}"
#: nats-py's inbox prefix, which every user of an account shares unless given one of its own.
SHARED_INBOX: Final = "_INBOX"
_LOOKUPS: Final = ("$JS.API.INFO", "$JS.API.STREAM.NAMES", _DELETE_PROBE)
_LOOKUP_PREFIXES: Final = ("$JS.API.STREAM.INFO.", "$JS.API.STREAM.MSG.GET.", "$JS.API.DIRECT.GET.")


class WouldChange(Exception):
    """A request that was not sent because it would change JetStream (a stream created or updated)."""

    def __init__(self, subject: str, payload: bytes) -> None:
        super().__init__(subject)
        self.subject = subject
        self.payload = payload


class Refused(Exception):
    """The server refused a request this connection has no permission for (its own words)."""


def _harmless(subject: str, headers: Mapping[str, Any] | None) -> bool:
    if subject in _LOOKUPS or subject.startswith(_LOOKUP_PREFIXES):
        return True
    return not subject.startswith("$JS.") and (headers or {}).get("Nats-Expected-Stream") == NO_STREAM


class ProbeClient(WalflowClient):
    """A NATS connection that looks and never changes anything (the module docstring).

    A refused request fails at once with :class:`Refused`: the server reports a permissions
    violation only through ``error_cb``, and the request it refused would just time out.
    Requests are made one at a time, so a violation belongs to the one waiting."""

    def __init__(self) -> None:
        super().__init__()
        self._refusal: asyncio.Future[str] | None = None

    @property
    def reply_prefix(self) -> str:
        """Where this connection's replies arrive (``destination.inbox_prefix``, else nats-py's ``_INBOX``)."""
        return bytes(self._inbox_prefix).decode()

    def refused(self, violation: str) -> None:
        """Called from ``error_cb`` with the server's "Permissions Violation"."""
        self.permission_violation = violation
        if self._refusal is not None and not self._refusal.done():
            self._refusal.set_result(violation)

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Every message nats-py sends goes through here (requests, JetStream's API and its
        publishes alike): the one place to stop what would change something."""
        if not _harmless(subject, headers):
            raise WouldChange(subject, payload)
        await super().publish(subject, payload, reply, headers)

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ) -> Msg:
        refusal = self._refusal = asyncio.get_running_loop().create_future()
        asking = asyncio.ensure_future(super().request(subject, payload, timeout, old_style, headers))
        await asyncio.wait({asking, refusal}, return_when=asyncio.FIRST_COMPLETED)
        if asking.done():
            return asking.result()
        asking.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asking
        raise Refused(refusal.result())


async def open_nats(dest: NatsDestination, name: str) -> ProbeClient:
    """Connect once, with the sink's servers, credentials and TLS; a :class:`ProbeError` saying
    why not (unreachable, credentials refused) instead of the pipeline's endless retries."""
    client = ProbeClient()
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        if sorted_as(exc) is NatsPermissionError:
            client.refused(str(exc))
        else:
            errors.append(first_line(exc))

    servers = ", ".join(dest.display_urls)
    try:
        options = {**connect_options(dest, name), "allow_reconnect": False, "max_reconnect_attempts": 1,
                   "reconnect_time_wait": 0.2, "connect_timeout": 3}
        await asyncio.wait_for(client.connect(**options, error_cb=on_error), 20)
    except Exception as exc:  # noqa: BLE001 - every failure to connect is a finding, not a traceback
        refused = exc if isinstance(exc, NatsTlsError) else refused_at_connect(exc, dest, name, client.server_address)
        client.abandon()
        if isinstance(refused, NatsTlsError):  # the pipeline's own line: what happened, nothing sent, what to set
            raise ProbeError(str(refused)) from None
        if sorted_as(exc) is NatsAuthError or any(nats_error(e) is NatsAuthError for e in errors):
            raise ProbeError(f"NATS at {servers} refused the credentials ({first_line(exc)})",
                             f"check {_credentials_hint(dest)} against the server's users or accounts") from None
        reason = errors[-1] if errors else first_line(exc)
        raise ProbeError(f"NATS unreachable at {servers}: {reason}",
                         "start NATS there, or correct the sink's destination (host and port or servers, tls, "
                         "tls_ca_file)") from None
    return client


async def close_nats(client: ProbeClient) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), 2)


def refusal(nc: ProbeClient, dest: NatsDestination, doing: str) -> ProbeError:
    """The pipeline's own words for a JetStream API request refused on ``nc`` (what to grant included)."""
    denied = permission_error(nc, dest, doing)
    return ProbeError(str(denied) if denied is not None else f"NATS refused {doing}")


async def account_info(nc: ProbeClient, dest: NatsDestination) -> dict[str, Any]:
    """``$JS.API.INFO``: JetStream answers this connection's account (a :class:`ProbeError` if not)."""
    try:
        reply = await nc.request("$JS.API.INFO", b"", timeout=TIMEOUT)
    except Refused:
        raise refusal(nc, dest, "a $JS.API.INFO request") from None
    except NoRespondersError:
        raise ProbeError(f"JetStream is not enabled on NATS at {', '.join(dest.display_urls)} for this account "
                         "(nothing answers $JS.API.INFO)",
                         "enable JetStream on the server (jetstream {} in its config, or -js) and for the "
                         "account of the sink's user") from None
    except TimeoutError:
        raise ProbeError("JetStream did not answer $JS.API.INFO within 5 s",
                         "check the server's JetStream (its log, `nats server check jetstream`)") from None
    data: dict[str, Any] = json.loads(reply.data)
    if "error" in data:
        raise ProbeError(f"JetStream refused $JS.API.INFO: {data['error'].get('description', data['error'])}")
    return data


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What the pipeline would do for a sink's stream, found out without doing it."""

    action: Literal["use", "create", "extend", "allow_atomic", "refused"]
    #: The stream: used as it is, created, or given one more subject (None when refused).
    name: str | None = None
    #: Its subjects once created or extended.
    subjects: tuple[str, ...] = ()
    #: For ``refused``: the pipeline's own error (what is wrong and what to change).
    problem: str | None = None


async def stream_plan(nc: ProbeClient, dest: NatsDestination, database: str, atomic: bool = False) -> StreamPlan:
    """Run the pipeline's stream rules on ``nc`` (``atomic``: for a ``transactions: atomic``
    sink): :class:`Refused`, ``NoRespondersError`` and nats-py's ``TimeoutError`` pass through
    for the caller to word."""
    try:
        found = await ensure_stream(nc, dest, database, atomic=atomic)
    except StreamSetupError as exc:
        return StreamPlan("refused", problem=str(exc))
    except WouldChange as change:
        body = json.loads(change.payload or b"{}")
        name = change.subject.rsplit(".", 1)[-1]
        if body.get("allow_atomic"):  # the only update that sets it
            return StreamPlan("allow_atomic", name)
        action: Literal["create", "extend"] = "create" if ".STREAM.CREATE." in change.subject else "extend"
        return StreamPlan(action, name, tuple(body.get("subjects") or ()))
    return StreamPlan("use", found.name)


async def stream_info(nc: ProbeClient, name: str) -> dict[str, Any]:
    """The stream's figures: messages, bytes, last sequence, duplicate window (seconds)."""
    info = await nc.jetstream().stream_info(name)
    state, config = info.state, info.config
    return {"name": name, "messages": state.messages, "bytes": state.bytes, "first_sequence": state.first_seq,
            "last_sequence": state.last_seq, "subjects": list(config.subjects or []),
            "duplicate_window_s": config.duplicate_window}


async def may_publish(nc: ProbeClient, subject: str) -> str | None:
    """Publish nothing on ``subject``: a publish JetStream must refuse (:data:`NO_STREAM`).
    Returns the stream that captures the subject, None if none does; :class:`Refused` if the
    server does not let this user publish there."""
    try:
        reply = await nc.request(subject, b"", timeout=TIMEOUT, headers={"Nats-Expected-Stream": NO_STREAM})
    except NoRespondersError:
        return None  # let through, and no stream captures it
    data: dict[str, Any] = json.loads(reply.data or b"{}")
    error = data.get("error") or {}
    if error.get("err_code") == STREAM_MISMATCH:
        return str(data.get("stream")) if data.get("stream") else None
    raise ProbeError(f"JetStream answered a refused publish on {subject} unexpectedly: {json.dumps(data)}")


async def may_delete_streams(nc: ProbeClient) -> bool:
    """Whether the user may delete streams (and so, all but certainly, use all of JetStream's API:
    ``$JS.API.>``): asked for a stream that cannot exist (:data:`NO_SUCH_STREAM`), so nothing is deleted."""
    try:
        await nc.request(_DELETE_PROBE, b"", timeout=TIMEOUT)
    except Refused:
        return False
    return True  # an answer ("stream not found"): the request was let through


async def may_subscribe(nc: ProbeClient, subject: str) -> bool:
    """Whether the server lets the user subscribe to ``subject`` (at once unsubscribed; what
    arrives meanwhile is not read): it refuses a subscription before the answer to the ping
    that follows it, through ``error_cb``. Two pings, not one: a PONG can answer a ping sent
    before the subscription (nats-py's own, or a request's), and the check saw one such PONG
    arrive ahead of the refusal; the second ping is certainly written after the SUB."""
    nc.permission_violation = None
    sub = await nc.subscribe(subject)
    try:
        for _ in range(2):
            await nc.flush(round(TIMEOUT))
            if nc.permission_violation is not None:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return nc.permission_violation is None


# -- the pipeline's health endpoint -----------------------------------------------------------

#: What walflow's commands ask over HTTP (``/readyz``, the NATS servers' ``/varz``) goes
#: straight to the address in the config: never through an ``HTTP_PROXY`` of the
#: environment, which would see the endpoint's credentials and could answer in its place.
NO_PROXY: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class Health:
    """What the running pipeline's ``/readyz`` said, if it answered."""

    url: str
    answering: bool
    ready: bool = False
    #: Its slots' readers (``connectors/postgres/supervisor.py``'s ``health()``), backfills included.
    slots: tuple[dict[str, Any], ...] = ()
    #: Why it did not answer.
    problem: str | None = None
    #: It answered 401: it wants other credentials than the config's ``walflow.health`` gives.
    denied: bool = False

    def slot(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.slots if s.get("slot") == name), None)

    def as_json(self) -> dict[str, object]:
        return {"url": self.url, "answering": self.answering, "ready": self.ready, "slots": list(self.slots),
                "problem": self.problem, "denied": self.denied}


def health_url(settings: HealthSettings) -> str:
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.host, settings.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}/readyz"


def read_health(settings: HealthSettings) -> Health:
    """Ask ``/readyz`` (503 is an answer too: not ready, with the details), with the
    endpoint's credentials when it has some."""
    url = health_url(settings)
    request = urllib.request.Request(url)
    if settings.authorization is not None:
        request.add_unredirected_header("Authorization", settings.authorization)
    try:
        with NO_PROXY.open(request, timeout=2) as reply:
            code, raw = reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        code, raw = exc.code, exc.read()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Health(url, False, problem=str(reason) or type(exc).__name__)
    if code == 401:
        return Health(url, False, problem="HTTP 401: it wants credentials this config does not give", denied=True)
    try:
        body = json.loads(raw)
        slots = tuple(body["slots"])
    except (ValueError, KeyError, TypeError):
        return Health(url, False, problem=f"something that is not walflow answers there (HTTP {code})")
    return Health(url, True, code == 200, slots)
