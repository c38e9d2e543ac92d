"""How the flow fits ``bytewax.run`` (``dataflows/engine.py``): the mission's own command,
``python -m bytewax.run dataflows.cdc`` with no flags, runs with walflow's 1 s epochs, not
Bytewax's 10 s (a flag wins); the cluster's shape as the flow sees it, and which processes
take sink partitions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataflows.engine import Cluster, publishes_here, slots_here
from embedded._process import free_port, wait_for
from tests.harness import Database, Nats, TestNames, slot_confirmed
from tests.pipeline import ROOT, assert_running, pipeline, write_config


def _probe(*args: str, **env: str) -> tuple[float, tuple[int, ...]]:
    """The epoch length and cluster a flow sees under ``bytewax.run`` with ``args``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bytewax.run", "tests.dataflows.engine_probe", *args],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:  # a process of a cluster waits for its peers: read its line, then stop it
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("epoch_interval="):
                epoch, _, cluster = line.strip().partition(" cluster=")
                return float(epoch.partition("=")[2]), tuple(int(n) for n in cluster.strip("()").split(","))
        raise AssertionError(f"the probe printed nothing (exit {proc.wait()})")
    finally:
        proc.kill()
        proc.wait()


def _epoch(*args: str, **env: str) -> float:
    return _probe(*args, **env)[0]


@pytest.mark.slow
def test_no_flag_gets_walflows_epoch() -> None:
    assert _epoch() == 1.0


@pytest.mark.slow
def test_a_flag_or_the_variable_wins(tmp_path: Path) -> None:
    assert _epoch("-s", "3") == 3.0
    assert _epoch(BYTEWAX_SNAPSHOT_INTERVAL="4") == 4.0
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery), "1"], check=True, cwd=ROOT)
    assert _epoch("-r", str(recovery), "-s", "2", "-b", "0") == 2.0


@pytest.mark.slow
def test_the_flow_sees_the_cluster_it_runs_in() -> None:
    assert _probe()[1] == (0, 1, 1)
    assert _probe("-w", "2")[1] == (0, 1, 2)
    assert _probe("-i", "1", "-a", f"127.0.0.1:{free_port()};127.0.0.1:{free_port()};127.0.0.1:{free_port()}")[1] \
        == (1, 3, 1)


@pytest.mark.parametrize(
    ("processes", "slots", "readers", "publishers"),
    [
        (1, 1, {0: ["a"]}, {0}),
        (1, 2, {0: ["a", "b"]}, {0}),  # one process (any -w) does everything
        (2, 1, {0: ["a"]}, {1}),  # the slot's process only reads
        (3, 1, {0: ["a"]}, {1, 2}),
        (2, 2, {0: ["a"], 1: ["b"]}, {0, 1}),  # every process reads a slot: every process publishes
        (3, 2, {0: ["a"], 1: ["b"]}, {2}),
        (2, 3, {0: ["a", "c"], 1: ["b"]}, {0, 1}),
    ],
)
def test_slots_spread_over_processes_and_publishing_goes_where_none_is_read(
    processes: int, slots: int, readers: dict[int, list[str]], publishers: set[int]
) -> None:
    names = ["c", "a", "b"][:slots] if slots == 3 else ["a", "b"][:slots]
    clusters = [Cluster(p, processes, 2) for p in range(processes)]
    assert {c.process: sorted(slots_here(c, names)) for c in clusters if slots_here(c, names)} == readers
    assert {c.process for c in clusters if publishes_here(c, slots)} == publishers


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
