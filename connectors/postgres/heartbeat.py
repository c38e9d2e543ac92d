"""Heartbeats: a logical message written every few seconds, seen coming back through the slot.

``pg_logical_emit_message(true, 'walflow.heartbeat', …)`` in its own transaction is a
committed transaction in the WAL even when no table changes: it moves the slot on an idle
database, and its round trip (written here, decoded by the reader) measures the whole
path's latency, catch-up included. The writer runs on a normal connection in its own
thread and never touches the replication connection; a failed write is retried on the
next beat (the reader's own reconnects are what restore replication).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import psycopg

from config.schema import DatabaseConfig
from connectors.postgres.connection import conninfo

log = logging.getLogger("walflow.postgres")

PREFIX = "walflow.heartbeat"


def encode(slot: str) -> str:
    return json.dumps({"slot": slot, "sent_us": time.time_ns() // 1000})


def decode(content: bytes, slot: str) -> float | None:
    """The heartbeat's send time (Unix seconds) if it is this slot's, else None."""
    try:
        data: dict[str, Any] = json.loads(content)
    except ValueError:
        return None
    if data.get("slot") != slot or not isinstance(data.get("sent_us"), int):
        return None
    return float(data["sent_us"]) / 1e6


class HeartbeatWriter:
    """Writes a heartbeat for ``db``'s slot every ``interval`` seconds until stopped."""

    def __init__(self, db: DatabaseConfig, interval: float) -> None:
        self.db = db
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"walflow-heartbeat-{db.slot.name}", daemon=True)
        self._failing = False

    def start(self) -> HeartbeatWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        info = conninfo(self.db, application_name=f"walflow:{self.db.slot.name}:heartbeat")
        while not self._stop.wait(self.interval):
            try:
                with psycopg.connect(info, autocommit=True, connect_timeout=5) as conn:
                    while True:
                        conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", [PREFIX, encode(self.db.slot.name)])
                        if self._failing:
                            log.info("heartbeats for slot %s are written again", self.db.slot.name)
                            self._failing = False
                        if self._stop.wait(self.interval):
                            return
            except psycopg.Error as exc:
                if not self._failing:
                    log.warning("cannot write a heartbeat for slot %s: %s", self.db.slot.name, str(exc).strip())
                    self._failing = True
