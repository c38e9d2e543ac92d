"""A backfill racing live writes ends with exactly the table's contents, also through ``kill -9``.

The invariant (``shared/CONTRACT.md``, "Backfills"): for every row, the last message in the
stream is its latest state; a row deleted during the backfill ends deleted. Checked the
way a consumer would see it: apply every event in stream order, compare with the table.
"""

from __future__ import annotations

import itertools
import random
import re
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Self

import pytest

from embedded import wait_for
from embedded._process import ServerProcess
from tests.backfill.helpers import replay, stored_count
from tests.harness import Database, Nats, TestNames, slot_confirmed
from tests.pipeline import assert_running, pipeline, stored, write_config

pytestmark = pytest.mark.slow

ROWS = 200_000


@pytest.fixture
def accounts(database: Database) -> Database:
    with database.connect() as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, note text, active bool)")
        conn.execute(f"INSERT INTO accounts SELECT g, g % 1000, 'account ' || g, g % 2 = 0 FROM generate_series(1, {ROWS}) g")
        conn.execute("ANALYZE accounts")
    return database


class Writer:
    """Updates, deletes and inserts random rows of ``accounts`` until stopped; deleted ids come back too."""

    def __init__(self, db: Database, seed: int) -> None:
        self._db = db
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self.ops: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        rnd, next_id, deleted = self._random, ROWS + 1, []
        with self._db.connect() as conn:
            while not self._stop.is_set():
                op = rnd.random()
                if op < 0.6:
                    conn.execute("UPDATE accounts SET balance = balance + 1, note = note || '+' WHERE id = %s",
                                 [rnd.randint(1, next_id)])
                    self.ops["update"] += 1
                elif op < 0.75:
                    victim = rnd.randint(1, next_id)
                    conn.execute("DELETE FROM accounts WHERE id = %s", [victim])
                    deleted.append(victim)
                    self.ops["delete"] += 1
                elif op < 0.85 and deleted:
                    conn.execute("INSERT INTO accounts VALUES (%s, -1, 'back', NULL) ON CONFLICT DO NOTHING",
                                 [deleted.pop(rnd.randrange(len(deleted)))])
                    self.ops["reinsert"] += 1
                else:
                    conn.execute("INSERT INTO accounts VALUES (%s, 0, 'new', true)", [next_id])
                    next_id += 1
                    self.ops["insert"] += 1


def _table(db: Database) -> dict[int, dict[str, Any]]:
    with db.connect() as conn:
        rows: list[tuple[Any, ...]] = conn.execute("SELECT id, balance, note, active FROM accounts").fetchall()
    return {r[0]: {"id": r[0], "balance": r[1], "note": r[2], "active": r[3]} for r in rows}


def _config(tmp_path: Path, db: Database, nats_srv: Nats, names: TestNames) -> Path:
    sink = {"name": "accounts-sink", "initial_backfill": True,
            "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    # small chunks: many watermark windows, each racing the writer
    return write_config(tmp_path, db, nats_srv, names, [sink],
                        backfill={"initial_chunk_rows": 500, "max_chunk_rows": 2_000})


_RESUMED: Final = re.compile(r"backfill \w+ of public\.accounts for sink accounts-sink: resuming after")


def _reads_done(proc: ServerProcess) -> bool:
    return re.search(r"backfill \w+ of public\.accounts for sink accounts-sink: done", proc.log_tail(400)) is not None


def _settle(db: Database, proc: ServerProcess) -> None:
    """Wait until the backfill ended and everything committed is confirmed (so in JetStream)."""
    wait_for(lambda: _reads_done(proc), timeout=120, what="the backfill to finish", check=lambda: assert_running(proc))
    end = db.current_lsn()
    wait_for(lambda: slot_confirmed(db) >= end, timeout=60, what="the slot to pass the last write",
             check=lambda: assert_running(proc))


def _assert_exact(db: Database, nats_srv: Nats, names: TestNames) -> list[Any]:
    events = stored(nats_srv.url, names.stream)
    ids = [e.msg_id for e in events]
    assert len(ids) == len(set(ids)), "a message was published twice"
    got, want = replay(events), _table(db)
    assert got.keys() == want.keys(), (
        f"rows only in the stream: {sorted(got.keys() - want.keys())[:10]}, "
        f"only in the table: {sorted(want.keys() - got.keys())[:10]}")
    stale = [k for k in want if got[k] != want[k]]
    assert not stale, f"{len(stale)} rows end stale, e.g. {[(got[k], want[k]) for k in stale[:3]]}"
    return events


def test_backfill_racing_writes_ends_with_the_tables_contents_and_keeps_the_slot_moving(
    accounts: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, accounts, nats_srv, names)
    confirmed: list[int] = []
    with pipeline(config, "-s", "1") as proc, Writer(accounts, seed=1) as writer:
        def sample() -> bool:
            confirmed.append(slot_confirmed(accounts))
            return _reads_done(proc)

        wait_for(sample, timeout=120, interval=0.2, what="the backfill to finish", check=lambda: assert_running(proc))
    with pipeline(config, "-s", "1", log_suffix="-settle") as proc:  # the writer has stopped: settle its tail
        end = accounts.current_lsn()
        wait_for(lambda: slot_confirmed(accounts) >= end, timeout=60, what="the slot to pass the last write",
                 check=lambda: assert_running(proc))
        # The first run logged "done" once its last chunk was read, and may have stopped before that
        # chunk's reads were stored: this run then resumes the backfill from its last recorded
        # progress (logged at its start, before any epoch could confirm the slot), and must end it.
        if _RESUMED.search(proc.log_tail(400)):
            _settle(accounts, proc)
    assert sum(writer.ops.values()) > 500, f"the writer hardly raced the backfill: {writer.ops}"
    events = _assert_exact(accounts, nats_srv, names)
    reads = sum(1 for e in events if e.event["action"] == "read")
    assert 0.9 * ROWS < reads <= ROWS + writer.ops["insert"]
    # the slot was confirmed again and again while the backfill ran, not only at its end
    moves = sum(1 for a, b in itertools.pairwise(confirmed) if b > a)
    assert moves >= 3, f"the confirmed LSN moved {moves} times during the backfill"


@contextmanager
def _killed_mid_backfill(config: Path, db: Database, nats_srv: Nats, names: TestNames,
                         *args: str) -> Iterator[ServerProcess]:
    """A pipeline killed with SIGKILL once a third of the rows are in the stream and the slot
    has confirmed a low watermark written after a sixth were: one whose chunk is not the first
    (the slot is confirmed one to two epochs behind what is stored: a fast backfill can store a
    third before it confirms any chunk, and then a resume rightly starts from the table's start)."""
    with pipeline(config, *args) as proc:
        wait_for(lambda: stored_count(nats_srv.url, names.stream) > ROWS // 6, timeout=120, interval=0.05,
                 what="a sixth of the reads", check=lambda: assert_running(proc))
        mark = db.current_lsn()
        wait_for(lambda: stored_count(nats_srv.url, names.stream) > ROWS // 3 and slot_confirmed(db) >= mark,
                 timeout=120, interval=0.05, what="a third of the reads, and the slot past a later chunk",
                 check=lambda: assert_running(proc))
        proc.stop(signal.SIGKILL)
        yield proc


@pytest.mark.parametrize("recovery", [False, True], ids=["without-r", "with-r"])
def test_kill_9_mid_backfill_resumes_from_the_last_chunk_and_ends_exact(
    accounts: Database, names: TestNames, nats_srv: Nats, stream_cleanup: str, tmp_path: Path, recovery: bool
) -> None:
    config = _config(tmp_path, accounts, nats_srv, names)
    args = ["-s", "1", *(["-r", str(tmp_path / "recovery"), "-b", "0"] if recovery else [])]
    with Writer(accounts, seed=2):
        with _killed_mid_backfill(config, accounts, nats_srv, names, *args):
            pass
        with pipeline(config, *args, log_suffix="-resumed") as proc:
            wait_for(lambda: "starting where it stopped" in proc.log_tail(400), timeout=60,
                     what="the backfill to resume", check=lambda: assert_running(proc))
            log = proc.log_tail(400)
            assert "initial backfill" not in log, "the initial backfill was requested again"
            _settle(accounts, proc)
    with pipeline(config, *args, log_suffix="-settle") as proc:
        end = accounts.current_lsn()
        wait_for(lambda: slot_confirmed(accounts) >= end, timeout=60, what="the slot to pass the last write",
                 check=lambda: assert_running(proc))
    _assert_exact(accounts, nats_srv, names)
    # it did not start over: it continued after the rows of the last chunk that was durable
    # (the stream cannot tell: rows read twice are published once)
    resumed = re.search(r"starting where it stopped, after ([\d,]+) row", log)
    assert resumed is not None and int(resumed.group(1).replace(",", "")) > 0, log
