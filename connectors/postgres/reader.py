"""The slot reader: a thread that owns the replication connection.

It reads CopyData from the socket, answers the server, decodes pgoutput, converts values
and hands changes to the Bytewax partition through a byte-bounded buffer. Reading does
not depend on Bytewax polling, and a full buffer never silences the connection: the
reader then stops reading but keeps sending status updates, so the walsender neither
times out nor has to ping.

Status updates follow ``shared/reference/postgres-replication.md`` §3–4: ``write`` is the
last LSN received (so keepalives never turn into a ping-pong), ``flush`` is the position
the pipeline has made durable (set from outside with :meth:`SlotReader.confirm`), replies
are sent at once when the server asks, and at least every ``status_interval_ms``.

Transactions are never held whole: each change is emitted as soon as it is decoded,
named by its transaction's commit LSN (from Begin) and its index in the transaction. The
replication session asks for neither streaming of in-progress transactions nor two-phase
decoding, so everything that arrives is committed; Postgres spills large transactions to
its own disk instead.

The reader shares the GIL with the Bytewax worker and the NATS sink, so its CPU per change
is throughput lost: Begin, Insert/Update/Delete and Commit, which are nearly all of the
traffic, take a short path (one ``struct`` unpack for header and message, rows converted
straight from the bytes, no intermediate objects), the clock is read once per burst of
messages, and a burst's changes go to the buffer under one lock. Every other message, and
any of those the short path does not take, goes through the full pgoutput decoder.
"""

from __future__ import annotations

import logging
import os
import random
import select
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from config.schema import DatabaseConfig, ReplicationSettings
from connectors.postgres import heartbeat, pgoutput
from connectors.postgres.buffer import ChangeBuffer, Item
from connectors.postgres.changes import Action, Change
from connectors.postgres.connection import conninfo
from connectors.postgres.protocol import (
    PG_EPOCH,
    XLOGDATA_HEADER,
    ProtocolError,
    lsn_to_str,
    parse_keepalive,
    pg_timestamp,
    status_update,
    xlogdata_start,
)
from connectors.postgres.slot import ReplicationSetupError, SlotState, prepare
from connectors.postgres.stream import ReplicationStream, StreamError, quote_identifier
from connectors.postgres.values import Row, TableSchema, TypeResolver

log = logging.getLogger("walflow.postgres")

#: How many CopyData messages to handle before looking at the clock and the buffer again.
_READ_BURST = 500
#: What a change costs in memory until JetStream acknowledges it, estimated from its WAL
#: message's size and its number of column values: the buffer and the epoch budget count
#: this, so ``buffer_mb`` and ``max_memory_mb`` bound what the process really holds.
#: Measured with tracemalloc: a decoded change is ~0.5 KB of fixed objects, ~120 B per
#: column value (dict slot and value object: 13.7 KB for 100 numeric columns), plus its
#: text; its JSON message, kept until acknowledged, is about its text again (1,078 B
#: decoded for Sequin's 166 B row, 2,551 B for a 1.6 KB one). A flat 7x of the WAL bytes
#: overcounted wide text 4x (the epoch budget then held 1.6 KB rows to half speed) and
#: undercounted many small columns 2x.
_MEMORY_PER_CHANGE = 512
_MEMORY_PER_COLUMN = 120
_MEMORY_PER_WAL_BYTE = 2


def change_memory(wal_bytes: int, values: int) -> int:
    """The estimated memory of a change from a WAL message of ``wal_bytes`` carrying ``values`` column values."""
    return _MEMORY_PER_CHANGE + _MEMORY_PER_COLUMN * values + _MEMORY_PER_WAL_BYTE * wal_bytes
#: The least time between two status updates sent only because the confirmed LSN moved.
_CONFIRM_GAP = 0.1
#: walEnd standing still this long (seconds) while connected is logged as a warning.
_STALL_WARNING = 300.0
_BACKOFF_MIN, _BACKOFF_MAX = 0.5, 30.0

_XLOGDATA, _KEEPALIVE = b"wk"
_BEGIN, _COMMIT, _INSERT, _UPDATE, _DELETE = b"BCIUD"
_NEW, _KEY, _OLD = b"NKO"
# The short path reads the XLogData header (protocol.py: 'w', dataStart, walEnd, sendTime)
# and the pgoutput message behind it (pgoutput.py) with one unpack each, skipping ('x') what
# it does not use. Messages never carry the xid prefix of stream blocks here: the session
# does not ask for streaming, and a Stream Start would end it (a ProtocolError) at once.
#   dataStart, then after 'B': final_lsn, commit_ts, xid
_XLOG_BEGIN = struct.Struct("!xQ16xxQqI")
_BEGIN_COMMIT_TS = slice(XLOGDATA_HEADER + 9, XLOGDATA_HEADER + 17)  # for psycopg's loader
#   dataStart, then after 'C' and its flags: commit_lsn, end_lsn (commit_ts: Begin had it)
_XLOG_COMMIT = struct.Struct("!xQ16xxxQQ8x")
#   dataStart, then after 'I'/'U'/'D': relid, the first tuple's marker; the tuple follows
_XLOG_ROW = struct.Struct("!xQ16xxIB")
#: What malformed bytes raise on the short path: the full decoder then says what is wrong.
_MALFORMED = (struct.error, IndexError, pgoutput.DecodeError)
#: An index beyond any transaction's last: "all of it" in ResumePoint.emitted_up_to.
_WHOLE_TRANSACTION = 1 << 62

#: Errors an operator must act on, with what to do.
_FATAL_SQLSTATES = {
    "55000": "replication slot '{slot}' can no longer be used: {error}. PostgreSQL invalidated it (its WAL was "
    "removed, e.g. by max_slot_wal_keep_size), so the changes since its last confirmed position are gone from it. "
    "To recover: SELECT pg_drop_replication_slot('{slot}'); start walflow again to recreate the slot, and "
    "backfill the tables from their current contents.",
    "42704": "replication of slot '{slot}' stopped: {error}. The publication was dropped (or never existed) while "
    "walflow was reading; PostgreSQL cannot decode past that point with it. Recreate the publication, then "
    "drop and recreate the slot and backfill the changes since.",
}

_HOLDER_QUERY = """
SELECT s.active_pid, r.application_name, coalesce(r.client_addr::text, 'local'),
       extract(epoch FROM now() - coalesce(r.reply_time, r.backend_start)), a.wait_event
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
WHERE s.slot_name = %s
"""

#: Wait events of a walsender that is idle or blocked on its client, not working.
_WAITING_ON_CLIENT = frozenset({"WalSenderWaitForWAL", "WalSenderWriteData", "ClientWrite", "ClientRead"})


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where to pick up: every transaction committed at or before ``lsn`` is done, and in
    the transaction at ``commit_lsn`` (if any) the changes up to ``commit_idx`` were emitted."""

    lsn: int = 0
    commit_lsn: int | None = None
    commit_idx: int = -1

    def skips(self, commit_lsn: int, commit_idx: int) -> bool:
        return commit_idx <= self.emitted_up_to(commit_lsn)

    def emitted_up_to(self, commit_lsn: int) -> int:
        """The last index of the transaction at ``commit_lsn`` that was emitted before: -1 for
        none, beyond any index for all of it (a transaction is checked once, not per change)."""
        # A transaction is done iff its commit record starts before a position that is the
        # end of a commit record (or a keepalive walEnd): the server's own skip rule.
        if commit_lsn < self.lsn:
            return _WHOLE_TRANSACTION + 1
        return self.commit_idx if commit_lsn == self.commit_lsn else -1


class SlotReader:
    """Reads one slot on a background thread into :attr:`buffer`."""

    def __init__(
        self,
        db: DatabaseConfig,
        settings: ReplicationSettings,
        resume: ResumePoint,
        *,
        application_name: str | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.resume = resume
        self.application_name = application_name or f"walflow:{db.slot.name}"
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pipe_open = True
        self._pipe_lock = threading.Lock()
        self.buffer = ChangeBuffer(settings.buffer_mb * 1024 * 1024, on_room=self._wake)
        self.error: BaseException | None = None
        self.slot_state: SlotState | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"walflow-reader-{db.slot.name}", daemon=True)
        self._lock = threading.Lock()
        self._confirmed = resume.lsn  # flush: durable downstream
        self._confirm_sent = -1
        self._received = resume.lsn  # write: the furthest LSN seen
        self._marked = resume.lsn  # the last position marker put in the buffer
        self._last_heard = 0.0  # when the server last sent anything
        self._progress_lsn, self._progress_at = resume.lsn, time.monotonic()  # walEnd's last move
        self.connected = False
        self.heartbeat_seen = 0.0  # when (Unix time) the last heartbeat came back
        self.heartbeat_rtt = 0.0  # its round trip, in seconds
        interval = settings.heartbeat_interval_ms / 1000
        self._heartbeats = heartbeat.HeartbeatWriter(db, interval) if interval else None
        self._last_put: tuple[int | None, int] = (resume.commit_lsn, resume.commit_idx)  # the last change put
        self._relations: dict[int, TableSchema] = {}
        # The open transaction (none: _txn_lsn is None): its commit LSN, time and xid, the
        # index of its next change, and the last index a previous run already emitted.
        self._txn_lsn: int | None = None
        self._txn_ts = PG_EPOCH
        self._txn_xid = 0
        self._txn_idx = 0
        self._txn_emitted = -1
        # Decoded but not yet in the buffer, with their sizes and the sizes' total: a burst's
        # items go in under one lock (_flush).
        self._staged: list[Item] = []
        self._staged_sizes: list[int] = []
        self._staged_size = 0
        self._decoder = pgoutput.Decoder()

    # -- control, from the Bytewax worker thread --------------------------------------------

    def start(self) -> SlotReader:
        self._thread.start()
        if self._heartbeats is not None:
            self._heartbeats.start()
        return self

    def health(self) -> dict[str, object]:
        """What readiness looks at: connected, heartbeat fresh, no fatal error."""
        interval = self.settings.heartbeat_interval_ms / 1000
        age = time.time() - self.heartbeat_seen if self.heartbeat_seen else None
        fresh = not interval or (age is not None and age < 3 * interval + 5)
        return {
            "slot": self.db.slot.name,
            "connected": self.connected,
            "error": str(self.error) if self.error else None,
            "confirmed_lsn": lsn_to_str(self._confirmed),
            "heartbeat_age_s": None if age is None else round(age, 3),
            "heartbeat_rtt_ms": round(self.heartbeat_rtt * 1000, 1),
            "ready": self.connected and self.error is None and fresh,
        }

    def confirm(self, lsn: int) -> None:
        """Everything before ``lsn`` is durable downstream: report it as the flush position."""
        with self._lock:
            self._confirmed = max(self._confirmed, lsn)
        self._wake()

    @property
    def confirmed(self) -> int:
        return self._confirmed

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to finish: it confirms what it was told, ends COPY and closes."""
        if self._heartbeats is not None:
            self._heartbeats.stop()
        self._stopping.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        elif self._thread.ident is None:
            self._close_pipe()  # never started

    def _wake(self) -> None:
        with self._pipe_lock:
            if self._pipe_open:
                try:
                    os.write(self._wake_w, b"\0")
                except BlockingIOError:
                    pass  # already woken: the pipe is full

    def _close_pipe(self) -> None:
        with self._pipe_lock:
            if self._pipe_open:
                self._pipe_open = False
                os.close(self._wake_r)
                os.close(self._wake_w)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._supervise()
        except Exception as exc:  # noqa: BLE001 - not swallowed: the partition raises it in the flow
            if not self._stopping.is_set():
                log.error("replication of slot %s failed: %s", self.db.slot.name, exc)
                self.error = exc
        finally:
            self._close_pipe()

    def _supervise(self) -> None:
        """Run sessions; after anything transient reconnect with capped, jittered backoff.

        Fatal: what an operator must fix (setup errors, an invalidated slot, a dropped
        publication) and what walflow cannot read (protocol errors). Everything else — a
        restarted or unreachable server, a terminated walsender, a slot still held by a
        previous connection — is retried, resuming exactly after the last change handed on.
        """
        delay = _BACKOFF_MIN
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._session()
                return
            except StreamError as exc:
                if exc.sqlstate in _FATAL_SQLSTATES:
                    message = _FATAL_SQLSTATES[exc.sqlstate].format(slot=self.db.slot.name, error=exc)
                    raise ReplicationSetupError(message) from exc
                problem = str(exc)
                if exc.retry_after is not None:
                    delay = exc.retry_after
            except psycopg.OperationalError as exc:
                problem = str(exc)
            if time.monotonic() - started > 60:
                delay = _BACKOFF_MIN  # it streamed for a while: this is a new problem
            wait = delay * random.uniform(0.8, 1.2)
            log.warning("replication of slot %s interrupted: %s; reconnecting in %.1fs",
                        self.db.slot.name, problem.strip().splitlines()[0] if problem.strip() else "?", wait)
            self._prepare_reconnect()
            self._stopping.wait(wait)
            delay = min(delay * 2, _BACKOFF_MAX)

    def _prepare_reconnect(self) -> None:
        """The next session resumes right after the last change put in the buffer."""
        commit_lsn, idx = self._last_put
        if commit_lsn is not None and self._marked <= commit_lsn:  # that transaction is unfinished
            self.resume = ResumePoint(self._marked, commit_lsn, idx)
        else:
            self.resume = ResumePoint(self._marked)
        self._txn_lsn = None
        self._decoder = pgoutput.Decoder()

    def _session(self) -> None:
        timeout = self.settings.wal_sender_timeout_ms
        with psycopg.connect(conninfo(self.db, application_name=self.application_name), autocommit=True) as meta:
            self.slot_state = prepare(meta, self.db)
            resolver = TypeResolver(meta)
            stream = ReplicationStream(
                conninfo(
                    self.db,
                    application_name=self.application_name,
                    replication=True,
                    settings={"wal_sender_timeout": f"{timeout}ms"},
                )
            )
            try:
                # Start at our own durable position; the server uses max(it, confirmed_flush_lsn).
                start = self.resume.lsn
                try:
                    stream.start(
                        self.db.slot.name,
                        start,
                        {
                            "proto_version": "1",
                            "publication_names": quote_identifier(self.db.publication.name),
                            "messages": "true",  # heartbeats
                        },
                    )
                except StreamError as exc:
                    if exc.sqlstate == "55006":
                        raise self._slot_busy(meta) from None
                    raise
                self.connected = True
                log.info(
                    "streaming slot %s from %s (server confirmed %s)",
                    self.db.slot.name,
                    lsn_to_str(start),
                    lsn_to_str(self.slot_state.confirmed_flush_lsn),
                )
                self._start_position(self.slot_state.confirmed_flush_lsn)
                self._loop(stream, resolver, meta)
                self._send_status(stream)  # a clean stop: the last confirmed position, then CopyDone
                stream.end()
            finally:
                self.connected = False
                stream.close()

    def _slot_busy(self, meta: psycopg.Connection[Any]) -> StreamError:
        """55006: find who holds the slot. walflow's own silent connection is ended at once
        (the old walsender has not noticed its client is gone); anyone else is waited for."""
        row = meta.execute(_HOLDER_QUERY, [self.db.slot.name]).fetchone()
        if row is None or row[0] is None:
            return StreamError("the slot was busy and has just been released", "55006", retry_after=0.1)
        pid, app, client, silent, wait_event = row
        silent_s = float(silent) if silent is not None else 0.0
        stale_after = 3 * self.settings.status_interval_ms / 1000
        # ours, silent, and idle or blocked on its client: a walsender busy replaying a large
        # transaction also reads no replies, and must not be taken for a hung one (split brain)
        if app == self.application_name and silent_s > stale_after and wait_event in _WAITING_ON_CLIENT:
            meta.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
            log.warning("slot %s was held by walflow's own walsender PID %s, silent for %.0fs: terminated it",
                        self.db.slot.name, pid, silent_s)
            return StreamError(f"terminated a stale walsender (PID {pid})", "55006", retry_after=0.1)
        return StreamError(
            f"slot {self.db.slot.name} is in use by PID {pid} (application_name '{app}', client {client}, "
            f"last reply {silent_s:.0f}s ago); waiting for it to be released",
            "55006",
        )

    def _start_position(self, server_confirmed: int) -> None:
        """On a fresh start the slot's confirmed position is where the pipeline stands."""
        if server_confirmed <= self.resume.lsn:
            return
        if self.resume.lsn:
            log.warning(
                "slot %s was confirmed up to %s by someone else, beyond walflow's durable position %s: "
                "changes in between cannot be replayed from this slot",
                self.db.slot.name, lsn_to_str(server_confirmed), lsn_to_str(self.resume.lsn),
            )
        self._received = server_confirmed
        if self.resume.commit_lsn is None:
            self._mark(server_confirmed)
            self._flush()

    def _walsender_busy(self, meta: psycopg.Connection[Any], pid: int) -> bool:
        """Ask over the normal connection whether our walsender is alive and working (not
        waiting on us or idle): then silence is a long replay, not a dead connection."""
        try:
            row = meta.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        except psycopg.Error:
            return False
        if row is None or row[0] in _WAITING_ON_CLIENT:
            return False
        log.warning("slot %s: the walsender is busy (wait event %s) and silent; waiting for it",
                    self.db.slot.name, row[0] or "none, on CPU")
        return True

    def _loop(self, stream: ReplicationStream, resolver: TypeResolver, meta: psycopg.Connection[Any]) -> None:
        interval = self.settings.status_interval_ms / 1000
        # Liveness is judged on *any* message, never on data: a long catch-up over WAL with
        # nothing to publish sends only keepalives. Silence past a status interval is met with
        # reply-requested pings, which the walsender answers even while catching up (at worst
        # after wal_sender_timeout/2); only no answer at all means the connection is dead.
        dead_after = self.settings.wal_sender_timeout_ms / 2000 + 3 * interval
        next_status = last_sent = 0.0
        self._last_heard = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            silent = now - self._last_heard
            if silent > dead_after:
                if not self._walsender_busy(meta, stream.backend_pid):
                    raise StreamError(f"no message from the server for {silent:.0f}s despite pings: connection lost")
                self._last_heard = now  # replaying a huge rewrite sends nothing, not even keepalives (PG15)
            self._watch_progress(now)
            # a new confirmed position goes out promptly, but at most every _CONFIRM_GAP
            if now >= next_status or (self._confirmed != self._confirm_sent and now - last_sent >= _CONFIRM_GAP):
                self._send_status(stream, reply=silent > interval)
                last_sent, next_status = now, now + interval
            wake_by = next_status if self._confirmed == self._confirm_sent else min(next_status, last_sent + _CONFIRM_GAP)
            if self.buffer.full:
                # Backpressure: leave the rest in Postgres, wake for room, a confirm or the next status.
                readable, _, _ = select.select([self._wake_r], [], [], max(0.0, wake_by - now))
                self._drain_wakeups(readable)
                self._last_heard = time.monotonic()  # not listening is not silence
                continue
            if self._read_burst(stream, resolver) == 0:
                self._drain_wakeups(stream.wait(max(0.0, wake_by - time.monotonic()), [self._wake_r]))

    def _watch_progress(self, now: float) -> None:
        """walEnd standing still while heartbeats are written is worth a warning, not a restart:
        the server may be replaying one huge transaction (it sends keepalives meanwhile)."""
        if self._received != self._progress_lsn:
            self._progress_lsn, self._progress_at = self._received, now
        elif now - self._progress_at > _STALL_WARNING and not self.buffer.full and self._heartbeats is not None:
            log.warning("slot %s: no progress through the WAL for %.0f min (at %s); still connected, still waiting",
                        self.db.slot.name, (now - self._progress_at) / 60, lsn_to_str(self._received))
            self._progress_at = now

    def _drain_wakeups(self, readable: list[int]) -> None:
        if self._wake_r in readable:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass

    def _send_status(self, stream: ReplicationStream, reply: bool = False) -> None:
        with self._lock:
            flush = self._confirmed
        stream.send(status_update(self._received, flush, reply))
        self._confirm_sent = flush

    def _read_burst(self, stream: ReplicationStream, resolver: TypeResolver) -> int:
        """Handle up to a burst of messages already received; stop early when the buffer fills.

        Begin and Commit are read right here, Insert/Update/Delete by :meth:`_row`; the
        rest, and whatever the short path declines, go through :meth:`_decode`. Everything
        decoded is staged and handed to the buffer when the burst ends, together
        (:meth:`_flush`); the burst stops where the staged changes fill the buffer's room,
        so the buffer overshoots its bound by at most one message, as when changes went in
        one by one.
        """
        handled = 0
        refilled = False
        get_copy_data = stream.get_copy_data
        room = self.buffer.room
        # beyond this LSN a previous run emitted nothing: ResumePoint.emitted_up_to is -1
        resume_lsn = max(self.resume.lsn, self.resume.commit_lsn or 0)
        unpack_begin, unpack_commit = _XLOG_BEGIN.unpack_from, _XLOG_COMMIT.unpack_from
        commit_time = resolver.commit_times()
        try:
            while handled < _READ_BURST and self._staged_size < room:
                try:
                    size, data = get_copy_data(1)
                except psycopg.OperationalError as exc:
                    raise StreamError(str(exc)) from None
                if size <= 0:
                    if size < 0:
                        raise stream.ended()
                    if refilled:
                        break
                    # More has usually arrived while this burst was decoded: take it now,
                    # rather than after a trip through the loop and select().
                    refilled = True
                    stream.consume()
                    continue
                handled += 1
                if data[0] != _XLOGDATA:
                    self._control(data, stream)
                    continue
                tag = data[XLOGDATA_HEADER] if size > XLOGDATA_HEADER else -1
                if tag == _INSERT or tag == _UPDATE or tag == _DELETE:
                    if not self._row(data, tag):
                        self._decode(data, resolver)
                elif tag == _BEGIN and size == _XLOG_BEGIN.size:
                    start, commit_lsn, commit_ts, xid = unpack_begin(data)
                    self._received = max(self._received, start)
                    # what _begin does, inline: a call per transaction is measurable here
                    self._txn_lsn = commit_lsn
                    try:
                        self._txn_ts = commit_time(data[_BEGIN_COMMIT_TS])
                    except psycopg.DataError:  # beyond what a datetime holds: as _begin fails
                        self._txn_ts = pg_timestamp(commit_ts)
                    self._txn_xid = xid
                    self._txn_idx = 0
                    self._txn_emitted = -1 if commit_lsn > resume_lsn else self.resume.emitted_up_to(commit_lsn)
                elif tag == _COMMIT and size == _XLOG_COMMIT.size:
                    start, commit_lsn, end_lsn = unpack_commit(data)
                    self._received = max(self._received, start)
                    self._txn_lsn = None
                    if commit_lsn > resume_lsn or self.resume.emitted_up_to(commit_lsn) < _WHOLE_TRANSACTION:
                        self._mark(end_lsn)
                else:
                    self._decode(data, resolver)
            if handled:
                self._last_heard = time.monotonic()  # once per burst: a burst takes milliseconds
        finally:
            self._flush()
        return handled

    def _control(self, data: memoryview, stream: ReplicationStream) -> None:
        """A CopyData message other than XLogData: a keepalive, or a protocol error."""
        if data[0] != _KEEPALIVE:
            raise ProtocolError(f"unexpected CopyData message type {bytes(data[:1])!r} from the walsender")
        keepalive = parse_keepalive(data)
        self._received = max(self._received, keepalive.wal_end)
        if self._txn_lsn is None:
            # nothing open: every commit before walEnd has been received (§3.3)
            self._mark(keepalive.wal_end)
        if keepalive.reply_requested:
            self._send_status(stream)

    def _decode(self, data: memoryview, resolver: TypeResolver) -> None:
        """The full path for any XLogData message: pgoutput's decoder, then :meth:`_on_message`."""
        self._received = max(self._received, xlogdata_start(data))
        self._on_message(self._decoder.decode(data[XLOGDATA_HEADER:]), len(data), resolver)

    def _row(self, data: memoryview, tag: int) -> bool:
        """The short path of an Insert, Update or Delete; False leaves it to :meth:`_decode`:
        outside a transaction, already emitted by a previous run, an unknown relation, or
        bytes the short path cannot read (the decoder then names the problem)."""
        commit_lsn = self._txn_lsn
        idx = self._txn_idx
        if commit_lsn is None or idx <= self._txn_emitted:
            return False
        buf = bytes(data)  # values loaded from slices of it never point into libpq's buffer
        try:
            start, relid, marker = _XLOG_ROW.unpack_from(buf)
            schema = self._relations.get(relid)
            if schema is None:
                return False
            pos = _XLOG_ROW.size
            action: Action
            new: Row | None = None
            old: Row | None = None
            if tag == _INSERT:
                if marker != _NEW:
                    return False
                action = "insert"
                new, pos = schema.load_tuple(buf, pos)
            elif tag == _UPDATE:
                action = "update"
                if marker == _KEY or marker == _OLD:
                    old, pos = schema.load_tuple(buf, pos, key_only=marker == _KEY)
                    marker = buf[pos]
                    pos += 1
                if marker != _NEW:
                    return False
                new, pos = schema.load_tuple(buf, pos)
            else:
                if marker != _KEY and marker != _OLD:
                    return False
                action = "delete"
                old, pos = schema.load_tuple(buf, pos, key_only=marker == _KEY)
            if pos != len(buf):
                return False
        except _MALFORMED:
            return False
        self._received = max(self._received, start)
        self._txn_idx = idx + 1
        size = change_memory(len(buf), len(new or ()) + len(old or ()))
        self._staged.append(Change(action, schema.schema, schema.table, schema.key_columns, new, old,
                                       commit_lsn, idx, self._txn_ts, self._txn_xid))
        self._staged_sizes.append(size)
        self._staged_size += size
        return True

    def _begin(self, commit_lsn: int, commit_ts: int, xid: int) -> None:
        self._txn_lsn = commit_lsn
        self._txn_ts = pg_timestamp(commit_ts)
        self._txn_xid = xid
        self._txn_idx = 0
        self._txn_emitted = self.resume.emitted_up_to(commit_lsn)

    def _commit(self, commit_lsn: int, end_lsn: int) -> None:
        self._txn_lsn = None
        if self.resume.emitted_up_to(commit_lsn) < _WHOLE_TRANSACTION:
            self._mark(end_lsn)

    def _put(self, change: Change, size: int) -> None:
        self._staged.append(change)
        self._staged_sizes.append(size)
        self._staged_size += size

    def _mark(self, lsn: int) -> None:
        """Hand the partition a position once everything before it was put in the buffer."""
        if lsn > self._marked:
            self._marked = lsn
            staged = self._staged
            if staged and type(staged[-1]) is int:
                staged[-1] = lsn  # consecutive markers collapse into one, as in the buffer
            else:
                staged.append(lsn)
                self._staged_sizes.append(0)

    def _flush(self) -> None:
        """Hand what was staged to the buffer."""
        staged = self._staged
        if not staged:
            return
        for item in reversed(staged):
            if type(item) is not int:
                assert isinstance(item, Change)
                self._last_put = (item.commit_lsn, item.commit_idx)
                break
        self.buffer.put_many(staged, self._staged_sizes, self._staged_size)
        self._staged = []
        self._staged_sizes = []
        self._staged_size = 0

    def _on_message(self, msg: pgoutput.PgoutputMessage, wal_bytes: int, resolver: TypeResolver) -> None:
        if isinstance(msg, pgoutput.Insert | pgoutput.Update | pgoutput.Delete):
            assert self._txn_lsn is not None, "row change outside a transaction"
            idx = self._txn_idx
            self._txn_idx += 1
            if idx > self._txn_emitted:
                change = self._change(msg, self._txn_lsn, idx)
                values = len(change.new or ()) + len(change.old or ())
                self._put(change, change_memory(wal_bytes, values))
        elif isinstance(msg, pgoutput.Begin):
            self._begin(msg.final_lsn, msg.commit_ts, msg.xid)
        elif isinstance(msg, pgoutput.Commit):
            self._commit(msg.commit_lsn, msg.end_lsn)
        elif isinstance(msg, pgoutput.Relation):
            self._relations[msg.relid] = resolver.schema(msg)
        elif isinstance(msg, pgoutput.Truncate):
            assert self._txn_lsn is not None, "truncate outside a transaction"
            for relid in msg.relids:
                idx = self._txn_idx
                self._txn_idx += 1
                if idx > self._txn_emitted:
                    schema = self._relations[relid]
                    change = Change("truncate", schema.schema, schema.table, schema.key_columns, None, None,
                                    self._txn_lsn, idx, self._txn_ts, self._txn_xid)
                    self._put(change, change_memory(wal_bytes, 0))
        elif isinstance(msg, pgoutput.Message):
            # walflow's heartbeats (others' logical messages are not row changes: not emitted)
            if msg.prefix == heartbeat.PREFIX and (sent := heartbeat.decode(msg.content, self.db.slot.name)):
                self.heartbeat_seen = time.time()
                self.heartbeat_rtt = self.heartbeat_seen - sent
        elif isinstance(msg, pgoutput.Type | pgoutput.Origin):
            pass  # types are resolved by OID when a Relation uses them; origins are not reported
        else:
            # Stream*/Prepare* only come with options this session does not set.
            raise ProtocolError(f"unexpected {type(msg).__name__} message: walflow did not ask for it")

    def _change(self, msg: pgoutput.Insert | pgoutput.Update | pgoutput.Delete, commit_lsn: int, idx: int) -> Change:
        schema = self._relations[msg.relid]
        action: Action
        if isinstance(msg, pgoutput.Insert):
            action, new, old = "insert", schema.row(msg.new), None
        elif isinstance(msg, pgoutput.Update):
            action, new = "update", schema.row(msg.new)
            old = None if msg.old is None else schema.row(msg.old, key_only=msg.old_kind == "K")
        else:
            action, new, old = "delete", None, schema.row(msg.old, key_only=msg.old_kind == "K")
        return Change(action, schema.schema, schema.table, schema.key_columns, new, old,
                      commit_lsn, idx, self._txn_ts, self._txn_xid)
