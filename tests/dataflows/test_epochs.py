"""The mission's own command, ``python -m bytewax.run dataflows.cdc`` with no flags, runs
with walflow's 1 s epochs (``dataflows/epochs.py``), not Bytewax's 10 s; a flag wins."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embedded._process import wait_for
from tests.harness import Database, Nats, TestNames, slot_confirmed
from tests.pipeline import ROOT, assert_running, pipeline, write_config


def _epoch(*args: str, **env: str) -> float:
    done = subprocess.run(
        [sys.executable, "-m", "bytewax.run", "tests.dataflows.epoch_probe", *args],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=True,
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("epoch_interval="))
    return float(line.partition("=")[2])


def test_no_flag_gets_walflows_epoch() -> None:
    assert _epoch() == 1.0


def test_a_flag_or_the_variable_wins(tmp_path: Path) -> None:
    assert _epoch("-s", "3") == 3.0
    assert _epoch(BYTEWAX_SNAPSHOT_INTERVAL="4") == 4.0
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True, cwd=ROOT)
    assert _epoch("-r", str(recovery), "-s", "2", "-b", "0") == 2.0


@pytest.mark.slow
def test_no_flag_run_confirms_the_slot_every_second(
    tmp_path: Path, database: Database, nats_srv: Nats, names: TestNames
) -> None:
    """Under continuous writes the slot moves several times in 6 s: with Bytewax's 10 s
    epochs it would move at most once."""
    with database.connect() as conn:
        conn.execute("CREATE TABLE ticks (id serial PRIMARY KEY, at timestamptz DEFAULT now())")
    sink = {"name": "ticks", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, database, nats_srv, names, [sink])
    with pipeline(config) as proc, database.connect() as conn:
        conn.autocommit = True
        first = database.current_lsn()
        conn.execute("INSERT INTO ticks DEFAULT VALUES")
        wait_for(lambda: slot_confirmed(database) > first, timeout=60, what="the first confirmation",
                 check=lambda: assert_running(proc))
        seen = {slot_confirmed(database)}
        end = time.monotonic() + 6
        while time.monotonic() < end:
            conn.execute("INSERT INTO ticks DEFAULT VALUES")
            seen.add(slot_confirmed(database))
            time.sleep(0.05)  # the write rate, not a synchronisation
        assert_running(proc)
        assert len(seen) >= 4, f"the slot moved {len(seen) - 1} times in 6 s"
        assert "epochs of 1 s (bytewax.run was given no -s)" in proc.log_tail(200)
