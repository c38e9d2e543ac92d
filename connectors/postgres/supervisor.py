"""The slot reader: a thread that runs replication sessions, one after another, until told to stop.

It owns what outlives a session: the byte-bounded buffer the partition drains, the slot's
:class:`~connectors.postgres.position.SlotPosition`, the heartbeat writer, and the decision what to do when a session
ends with an error (:mod:`core.errors`): a fatal one is kept in :attr:`SlotReader.error`
for the partition to raise; a transient one is retried with capped, jittered backoff,
resuming exactly after the last change the session handed on, and said once per outage
(:class:`~connectors.postgres.outage.OutageLog`: a crashed server refuses a reconnect or two
while it recovers; those attempts are logged at debug). A slot held by someone
else (``55006``) is diagnosed first: walflow's own walsender that has gone silent is
terminated (its client is gone and the server has not noticed), anyone else is waited for.

Reading does not depend on Bytewax polling: the partition only takes from the buffer and
confirms positions; both wake the session through a pipe.

Metrics: each retried session counts in ``walflow_reconnects_total`` (``component="postgres"``,
the cause as the errors are classified here); the received position and the buffer are read
at scrape time; the slot's figures on the server come from the heartbeat thread
(:class:`connectors.postgres.heartbeat.HeartbeatWriter`), never from this one.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Final

import psycopg

from config.schema import DatabaseConfig, ReplicationSettings
from connectors.postgres import heartbeat
from connectors.postgres.buffer import ChangeBuffer
from connectors.postgres.connection import conninfo
from connectors.postgres.messages import IgnoredMessages, Reason
from connectors.postgres.outage import OutageLog
from connectors.postgres.position import SlotPosition
from connectors.postgres.protocol import lsn_to_str
from connectors.postgres.session import WAITING_ON_CLIENT, Session
from connectors.postgres.slot import SlotState
from core.errors import FatalError, SlotInUse, StreamError, TransientError
from core.metrics import Metrics

log = logging.getLogger("walflow.postgres")

_BACKOFF_MIN, _BACKOFF_MAX = 0.5, 30.0
#: A session that streamed this long (seconds) before failing met a new problem: backoff starts over.
_BACKOFF_RESET: Final = 60.0
#: How often the slot is looked at on the server when no heartbeats are written (seconds).
_SAMPLE_EVERY: Final = 5.0

_HOLDER_QUERY = """
SELECT s.active_pid, r.application_name, coalesce(r.client_addr::text, 'local'),
       extract(epoch FROM now() - coalesce(r.reply_time, r.backend_start)), a.wait_event
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
WHERE s.slot_name = %s
"""


class SlotReader:
    """Reads one slot on a background thread into :attr:`buffer`."""

    def __init__(
        self,
        db: DatabaseConfig,
        settings: ReplicationSettings,
        position: SlotPosition,
        *,
        application_name: str | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """``metrics``: the process's (else the reader's own)."""
        self.db = db
        self.settings = settings
        #: The slot's positions, shared with the partition that emits what this reader reads.
        self.position = position
        self.application_name = application_name or f"walflow:{db.slot.name}"
        self.wake_fd, self.wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self.wake_w, False)
        self._pipe_open = True
        self._pipe_lock = threading.Lock()
        self.buffer = ChangeBuffer(settings.buffer_mb * 1024 * 1024, on_room=self.wake)
        self.metrics = metrics = metrics or Metrics()
        slot = db.slot.name
        metrics.received_lsn.labels(slot).set_function(lambda: position.received)
        metrics.track_bound("reader_buffer", lambda: self.buffer.size, self.buffer.max_bytes)
        self._round_trip = metrics.heartbeat_round_trip.labels(slot)
        self._catch_up = heartbeat.CatchUpLog(slot)
        #: The slot's logical messages that were not acted on: counted and reported here.
        self.ignored = IgnoredMessages(slot, metrics)
        #: Why reading stopped for good: a FatalError, or what nobody expected.
        self.error: BaseException | None = None
        self.slot_state: SlotState | None = None
        self.table_keys: dict[int, tuple[str, ...]] = {}
        self._connected = False
        #: What the log says of an outage: its first failure, not every reconnect attempt.
        self._outage = OutageLog(log)
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"walflow-reader-{db.slot.name}", daemon=True)
        self.heartbeat_seen = 0.0  # when (Unix time) the last heartbeat came back
        self.heartbeat_rtt = 0.0  # its round trip, in seconds
        #: The slot's running backfills and their progress (set by the source).
        self.backfill_progress: Callable[[], list[dict[str, object]]] = list
        interval = settings.heartbeat_interval_ms / 1000
        # always: it also samples the slot on the server (no heartbeats then with interval 0)
        self._heartbeats = heartbeat.HeartbeatWriter(db, interval or _SAMPLE_EVERY, emit=bool(interval),
                                                     on_sample=self._slot_sampled)

    # -- control, from the Bytewax worker thread --------------------------------------------

    def start(self) -> SlotReader:
        self._thread.start()
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
            "confirmed_lsn": lsn_to_str(self.position.confirmed),
            "heartbeat_age_s": None if age is None else round(age, 3),
            "heartbeat_rtt_ms": round(self.heartbeat_rtt * 1000, 1),
            "ready": self.connected and self.error is None and fresh,
            "backfills": self.backfill_progress(),
        }

    @property
    def connected(self) -> bool:
        """True while a session streams (set by the session)."""
        return self._connected

    @connected.setter
    def connected(self, value: bool) -> None:
        self._connected = value
        if value:
            self._outage.recovered(f"replication of slot {self.db.slot.name} streams")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to finish: it confirms what it was told, ends COPY and closes."""
        self._heartbeats.stop()
        self.stopping.set()
        self.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        elif self._thread.ident is None:
            self._close_pipe()  # never started

    # -- what sessions call back -------------------------------------------------------------

    def drain_wakeups(self, readable: list[int]) -> None:
        if self.wake_fd in readable:
            try:
                while os.read(self.wake_fd, 4096):
                    pass
            except BlockingIOError:
                pass

    def on_message(self, prefix: str, content: bytes) -> None:
        """A heartbeat: this process's own measures the round trip; another slot's or an
        earlier run's is passed over, anything else under the prefix is ignored and counted."""
        sent = heartbeat.decode(content, self.db.slot.name, self._heartbeats.token)
        if sent == "malformed":
            self.ignored(prefix, "malformed", "not a heartbeat as walflow writes it")
        elif sent is not None:
            self.heartbeat_seen = time.time()
            self.heartbeat_rtt = max(0.0, self.heartbeat_seen - sent)
            self._round_trip.observe(self.heartbeat_rtt)

    def on_ignored(self, prefix: str, reason: Reason, detail: str) -> None:
        self.ignored(prefix, reason, detail)

    def _slot_sampled(self, sample: heartbeat.SlotSample) -> None:
        """The heartbeat thread looked at the slot on the server: metrics, and the catch-up log."""
        self.metrics.slot_sampled(self.db.slot.name, sample.current, sample.confirmed, sample.wal_status,
                                  sample.safe_wal_size)
        line = self._catch_up.sample(time.monotonic(), sample.current - sample.confirmed, self.position.received)
        if line is not None:
            log.info("%s", line)

    def wake(self) -> None:
        """The confirmed position moved (or the buffer has room, or stop): the session looks again at once."""
        with self._pipe_lock:
            if self._pipe_open:
                try:
                    os.write(self.wake_w, b"\0")
                except BlockingIOError:
                    pass  # already woken: the pipe is full

    def _close_pipe(self) -> None:
        with self._pipe_lock:
            if self._pipe_open:
                self._pipe_open = False
                os.close(self.wake_fd)
                os.close(self.wake_w)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._supervise()
        except Exception as exc:  # noqa: BLE001 - not swallowed: the partition raises it in the flow
            if not self.stopping.is_set():
                if not isinstance(exc, FatalError):  # a fatal one is reported once, by the flow
                    log.error("replication of slot %s failed: %s", self.db.slot.name, exc)
                self.error = exc
        finally:
            self._close_pipe()

    def _supervise(self) -> None:
        """Run sessions; after a transient error reconnect with capped, jittered backoff.

        A FatalError (and anything unexpected) ends the thread: :attr:`error` keeps it.
        """
        delay = _BACKOFF_MIN
        while not self.stopping.is_set():
            session = Session(self.db, self.settings, self, self.application_name)
            started = time.monotonic()
            try:
                session.run()
                return
            except SlotInUse as exc:
                problem, retry_after = self._slot_holder(exc)
                cause = "slot_in_use"
            except StreamError as exc:
                problem, retry_after = str(exc), exc.retry_after
                cause = "connection" if exc.sqlstate is None else "server_error"
            except TransientError as exc:
                problem, retry_after = str(exc), None
                cause = "connection"
            finally:
                self.position.session_end(session.resume_point())
            self.metrics.reconnects.labels("postgres", cause).inc()
            if time.monotonic() - started > _BACKOFF_RESET:
                delay = _BACKOFF_MIN
            if retry_after is not None:
                delay = retry_after
            wait = delay * random.uniform(0.8, 1.2)
            first_line = problem.strip().splitlines()[0] if problem.strip() else "?"
            self._outage.failed(cause, "replication of slot %s interrupted: %s; reconnecting in %.1fs",
                                self.db.slot.name, first_line, wait)
            self.stopping.wait(wait)
            delay = min(delay * 2, _BACKOFF_MAX)

    def _slot_holder(self, exc: SlotInUse) -> tuple[str, float | None]:
        """55006: who holds the slot, and how soon to try again. walflow's own silent
        walsender (its client gone, unnoticed by the server) is terminated; anyone else is
        waited for, and named."""
        try:
            with psycopg.connect(conninfo(self.db, application_name=self.application_name), autocommit=True) as meta:
                row = meta.execute(_HOLDER_QUERY, [self.db.slot.name]).fetchone()
                if row is None or row[0] is None:
                    return "the slot was busy and has just been released", 0.1
                pid, app, client, silent, wait_event = row
                silent_s = float(silent) if silent is not None else 0.0
                stale_after = 3 * self.settings.status_interval_ms / 1000
                # ours, silent, and idle or blocked on its client: a walsender busy replaying a large
                # transaction also reads no replies, and must not be taken for a hung one (split brain)
                if app == self.application_name and silent_s > stale_after and wait_event in WAITING_ON_CLIENT:
                    meta.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
                    log.warning("slot %s was held by walflow's own walsender PID %s, silent for %.0fs: terminated it",
                                self.db.slot.name, pid, silent_s)
                    return f"terminated a stale walsender (PID {pid})", 0.1
        except psycopg.OperationalError as error:  # the server went away meanwhile: just retry
            return f"{exc}; could not ask who holds the slot: {error}", None
        holder = (f"slot {self.db.slot.name} is in use by PID {pid} (application_name '{app}', client {client}, "
                  f"last reply {silent_s:.0f}s ago); waiting for it to be released ({exc})")
        return holder, None
