"""The ``events`` workload shared by the delivery, fault, liveness and bad-data tests.

:func:`setup_events` prepares a test's database and writes its config; :class:`Inserter`
loads it with numbered rows, so that "every change exactly once" is a check that the
stored ids are exactly ``1..count``. ``OUTAGE`` is how long the outage tests keep a server
away (``WALFLOW_OUTAGE_SECONDS``, default 15; 60 or 120 for the long local runs).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.harness import Database, Nats, TestNames
from tests.pipeline import write_config

OUTAGE = float(os.environ.get("WALFLOW_OUTAGE_SECONDS", "15"))


def setup_events(db: Database, names: TestNames, nats_srv: Nats, tmp_path: Path, **stream: Any) -> Path:
    """Create ``events (id int PRIMARY KEY, payload text)``, the publication for it alone and an
    unpublished ``busy (id bigserial PRIMARY KEY, payload text)``; write a config with one sink
    ``g`` to the test's stream and subject prefix (``stream`` keys go into its stream settings,
    e.g. ``duplicate_window_ms``). Returns the config's path, as :func:`write_config` does."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, payload text)")
        conn.execute("CREATE TABLE busy (id bigserial PRIMARY KEY, payload text)")
        conn.execute(f"CREATE PUBLICATION {names.publication} FOR TABLE events")
    sink = {"name": "g", "destination": {"subject_prefix": names.subject_prefix,
                                         "stream": {"name": names.stream, **stream}}}
    return write_config(tmp_path, db, nats_srv, names, [sink])


class Inserter(threading.Thread):
    """Inserts rows 1, 2, 3, … into ``events`` at about ``rate`` a second until ``stop`` is set.

    ``count`` is the number of rows committed so far: once the thread is joined, rows
    ``1..count`` are exactly the ones in the table. It rides out Postgres restarts: a row
    whose commit it could not see is inserted again (``ON CONFLICT DO NOTHING`` makes that a
    no-op if the first attempt did commit).
    """

    def __init__(self, dsn: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate = dsn, rate
        self.stop = threading.Event()
        self.count = 0

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                    while not self.stop.is_set():
                        conn.execute("INSERT INTO events VALUES (%s, repeat('x', 100)) ON CONFLICT DO NOTHING",
                                     [self.count + 1])
                        self.count += 1
                        ahead = self.count / self.rate - (time.monotonic() - started)
                        if ahead > 0:
                            self.stop.wait(ahead)  # a load generator's pacing, not synchronisation
            except psycopg.OperationalError:
                self.stop.wait(0.2)  # the server is restarting: try again
