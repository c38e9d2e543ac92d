"""Heartbeats: a logical message written every few seconds, seen coming back through the slot.

``pg_logical_emit_message(true, 'walflow.heartbeat', …)`` in its own transaction is a
committed transaction in the WAL even when no table changes: it moves the slot on an idle
database, and its round trip (written here, decoded by the reader) measures the whole
path's latency, catch-up included. The writer runs on a normal connection in its own
thread and never touches the replication connection; a failed write is retried on the
next beat (the reader's own reconnects are what restore replication).

**Only this process's heartbeats count.** Any role may write a message under
``walflow.heartbeat`` (:mod:`connectors.postgres.messages`): each heartbeat carries a random
token of the writer that the reader of the same process compares, so a forged or an
earlier run's heartbeat neither stops the flow nor fakes a fresh, fast round trip.

**The slot on the server** is looked at on the same connection, just before each beat
(:data:`SAMPLE_QUERY`: lag, confirmed position, ``wal_status``, ``safe_wal_size``), for the
metrics and for :class:`CatchUpLog`: the reader thread never waits for it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Literal, NamedTuple

import psycopg
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from config.schema import DatabaseConfig
from connectors.postgres.connection import conninfo
from connectors.postgres.messages import HEARTBEAT

log = logging.getLogger("walflow.postgres")

PREFIX: Final = HEARTBEAT

#: The slot as the server sees it: positions as numbers, so that no LSN is parsed here.
SAMPLE_QUERY: Final = """
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint,
       wal_status, safe_wal_size
FROM pg_replication_slots WHERE slot_name = %s
"""
#: A lag beyond this is a backlog worth a progress line; it ends below a quarter of it, so
#: that a lag hovering around the threshold does not log a start and an end every sample.
CATCH_UP_BYTES: Final = 64 * 1024 * 1024
#: How often a backlog's progress is logged (seconds).
CATCH_UP_EVERY: Final = 60.0


class SlotSample(NamedTuple):
    """One look at the slot on the server."""

    current: int  # pg_current_wal_lsn()
    confirmed: int  # confirmed_flush_lsn
    wal_status: str | None
    safe_wal_size: int | None  # None: max_slot_wal_keep_size is -1 (or the slot is lost)


class _Heartbeat(BaseModel):
    """A heartbeat as walflow writes it: anything else under its prefix is malformed."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    slot: str = Field(max_length=256)
    token: str = Field(max_length=64)
    sent_us: int = Field(ge=0)


def new_token() -> str:
    """A writer's token: what tells its heartbeats from anyone else's."""
    return secrets.token_hex(8)


def encode(slot: str, token: str) -> str:
    return _Heartbeat(slot=slot, token=token, sent_us=time.time_ns() // 1000).model_dump_json()


def decode(content: bytes, slot: str, token: str) -> float | Literal["malformed"] | None:
    """The send time (Unix seconds) of this writer's heartbeat for ``slot``; None for
    another slot's or another writer's (an earlier run's); ``"malformed"`` for anything that
    is not a heartbeat. Total: it never raises, whatever ``content`` holds."""
    try:
        beat = _Heartbeat.model_validate_json(content)
    except ValidationError:
        return "malformed"
    if beat.slot != slot or beat.token != token:
        return None
    return beat.sent_us / 1e6


class HeartbeatWriter:
    """Writes a heartbeat for ``db``'s slot every ``interval`` seconds until stopped (with
    ``emit``), and hands what the server says about the slot to ``on_sample`` just before."""

    def __init__(self, db: DatabaseConfig, interval: float, *, emit: bool = True,
                 on_sample: Callable[[SlotSample], None] | None = None) -> None:
        self.db = db
        self.interval = interval
        self.emit = emit
        self.on_sample = on_sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"walflow-heartbeat-{db.slot.name}", daemon=True)
        #: What this writer's heartbeats carry, for the reader to know them by.
        self.token = new_token()
        self._failing = False

    def start(self) -> HeartbeatWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(5)

    def _run(self) -> None:
        info = conninfo(self.db, application_name=f"walflow:{self.db.slot.name}:heartbeat")
        while not self._stop.wait(self.interval):
            try:
                with psycopg.connect(info, autocommit=True, connect_timeout=5) as conn:
                    while True:
                        if self.on_sample is not None:
                            self._sample(conn, self.on_sample)
                        if self.emit:
                            conn.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                                         [PREFIX, encode(self.db.slot.name, self.token)])
                        if self._failing:
                            log.info("heartbeats for slot %s are written again", self.db.slot.name)
                            self._failing = False
                        if self._stop.wait(self.interval):
                            return
            except psycopg.Error as exc:
                if not self._failing:
                    text = str(exc).strip()
                    log.warning("cannot write a heartbeat for slot %s: %s", self.db.slot.name,
                                text.splitlines()[0] if text else type(exc).__name__)
                    self._failing = True

    def _sample(self, conn: psycopg.Connection[Any], on_sample: Callable[[SlotSample], None]) -> None:
        row = conn.execute(SAMPLE_QUERY, [self.db.slot.name]).fetchone()
        if row is not None and row[0] is not None and row[1] is not None:  # a slot that exists and was confirmed
            on_sample(SlotSample(int(row[0]), int(row[1]), row[2], None if row[3] is None else int(row[3])))


class CatchUpLog:
    """The lines that report a large backlog's catch-up: sans-IO, fed every sample.

    While the slot's lag (``pg_current_wal_lsn() - confirmed_flush_lsn``) exceeds
    ``threshold``, one line when that is first seen, then one every ``every`` seconds: how
    far behind, how fast the lag shrinks (and how fast the reader receives WAL), and when it
    will have caught up at that pace. One line when the lag is back below a quarter of the
    threshold; nothing otherwise.
    """

    def __init__(self, slot: str, threshold: int = CATCH_UP_BYTES, every: float = CATCH_UP_EVERY) -> None:
        self.slot = slot
        self.threshold = threshold
        self.every = every
        self._previous: tuple[float, int, int] | None = None  # the last sample: (time, lag, received)
        self._mark: tuple[float, int, int] | None = None  # the sample of the last line, while behind
        self._since = 0.0  # when the backlog was first seen

    def sample(self, now: float, lag: int, received: int) -> str | None:
        """The line to log for this sample (``now``: monotonic seconds), if any."""
        previous, self._previous = self._previous, (now, lag, received)
        mark = self._mark
        if mark is None:
            if lag <= self.threshold:
                return None
            self._since = now
            self._mark = (now, lag, received)
            rates = "" if previous is None else self._rates(previous, now, lag, received)
            return f"slot {self.slot}: {_size(lag)} behind the server's WAL{rates}"
        if lag < self.threshold // 4:
            self._mark = None
            return f"slot {self.slot}: caught up ({_size(lag)} behind) after {_duration(now - self._since)}"
        if now - mark[0] < self.every:
            return None
        self._mark = (now, lag, received)
        return f"slot {self.slot}: {_size(lag)} behind the server's WAL{self._rates(mark, now, lag, received)}"

    @staticmethod
    def _rates(since: tuple[float, int, int], now: float, lag: int, received: int) -> str:
        then, then_lag, then_received = since
        elapsed = now - then
        if elapsed <= 0:
            return ""
        shrinking = (then_lag - lag) / elapsed
        reading = f"reading {_size(max(0.0, (received - then_received) / elapsed))}/s"
        if shrinking <= 0:
            return f", not catching up (lag growing {_size(-shrinking)}/s, {reading})"
        return f", catching up {_size(shrinking)}/s ({reading}), ETA {_duration(lag / shrinking)}"


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
