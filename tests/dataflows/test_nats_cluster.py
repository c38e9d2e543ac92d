"""A 3-node NATS cluster with an R3 stream under a mixed load: the stream's leader killed -9 (and
walflow with it once), a node paused for 20 s, every node restarted in turn.

Each run ends with every committed change in the stream exactly once and in per-row order, and
the slot never seen ahead of the stream (``tests/cluster.py``). The stream's duplicate window
is one second, so JetStream's deduplication cannot hide a replay — but for the pause, where a
window shorter than the pause would store the paused node's late copy (what a window is for).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from embedded import wait_for
from embedded._process import ServerProcess, free_port
from embedded.nats import NatsCluster, NatsNode
from tests.cluster import Counters, SlotWatch, check_counters, cluster, setup_counters
from tests.harness import Database, TestNames
from tests.harness import slot_active as _slot_active
from tests.harness import slot_confirmed as _confirmed
from tests.pipeline import assert_running, by_labels, pipeline, scrape

RATE = 800  # changes a second
PAUSE = 20.0  # seconds a node stays stopped


def _progress(watch: SlotWatch, more: int, proc: ServerProcess, timeout: float = 60) -> None:
    """Wait until the stream holds ``more`` messages beyond what it held now."""
    before = watch.samples[-1][1] if watch.samples else 0
    wait_for(lambda: bool(watch.samples) and watch.samples[-1][1] >= before + more, timeout=timeout,
             what=f"{more} more messages in the stream", check=lambda: assert_running(proc))


def _other_leader(nodes: NatsCluster, stream: str, old: NatsNode) -> Callable[[], bool]:
    return lambda: (leader := nodes.stream_leader(stream)) is not None and leader is not old


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.parametrize("scenario", ["leader-kill", "pause", "rolling-restart"])
def test_r3_stream_through_failover_keeps_every_change_once_in_order(
    scenario: str, database: Database, names: TestNames, tmp_path: Path
) -> None:
    port = free_port()
    with cluster() as nodes:
        # A paused node still holds what it had read from walflow's connection and stores it when it
        # wakes, long after walflow re-sent it elsewhere: only a duplicate window longer than the
        # pause recognises that copy (as the default 2 min does; README, "A NATS cluster").
        window = 3 * int(PAUSE * 1000) if scenario == "pause" else 1000
        config = setup_counters(database, names, nodes, tmp_path, window, health={"enabled": True, "port": port})
        writer = Counters(database.dsn, RATE)
        watch = SlotWatch(database, nodes, names.stream)
        started = time.monotonic()
        try:
            with pipeline(config, "-s", "1") as proc:
                wait_for(lambda: _slot_active(database), timeout=60, what="the slot",
                         check=lambda: assert_running(proc))
                writer.start()
                watch.start()
                _progress(watch, 1000, proc)
                leader = nodes.wait_for_stream_leader(names.stream)
                if scenario == "leader-kill":
                    leader.kill()
                    wait_for(_other_leader(nodes, names.stream, leader), timeout=30, what="a new leader")
                    _progress(watch, 1000, proc)
                    metrics = scrape(port)
                    proc.kill()  # walflow too, once, with the old leader still down
                elif scenario == "pause":
                    leader.pause()
                    paused = time.monotonic()
                    wait_for(_other_leader(nodes, names.stream, leader), timeout=PAUSE, what="a new leader")
                    time.sleep(max(0.0, PAUSE - (time.monotonic() - paused)))  # the fault's length itself
                    leader.resume()
                    _progress(watch, 1000, proc)
                else:
                    for node in nodes.nodes:
                        nodes.restart(node)
                        _progress(watch, 500, proc)
                if scenario != "leader-kill":
                    metrics = scrape(port)
            with pipeline(config, "-s", "1", log_suffix=".2") as proc:
                if scenario == "leader-kill":
                    _progress(watch, 1000, proc)
                    leader.start()  # the killed node comes back, with its store, and catches up
                    _progress(watch, 1000, proc)
                writer.stop.set()
                writer.join(10)
                end = database.current_lsn()
                wait_for(lambda: _confirmed(database) >= end, timeout=120, what="the slot to catch up",
                         check=lambda: assert_running(proc))
                _progress(watch, 0, proc)  # one more sample, after the end
        finally:
            writer.stop.set()
            watch.stop.set()
            watch.join(10)
        assert writer.error is None and watch.error is None, (writer.error, watch.error)
        events, out_of_order = check_counters(database, nodes, names.stream, watch)
        log = "\n".join(p.read_text() for p in sorted(tmp_path.glob("walflow*.log")))
    assert "no stream captures subject" not in log  # the stream existed throughout: it lacked a leader at most
    assert "cannot reach NATS at " + ", ".join(nodes.addresses) not in log  # one node is not all of them
    retries = by_labels(metrics.get("walflow_publish_retries_total", {}), "reason")
    unanswered = by_labels(metrics.get("walflow_publish_failures_total", {}), "code").get(("503",), 0)
    elections = by_labels(metrics.get("walflow_stream_leaderless_seconds_count", {}), "sink").get(("c",), 0)
    assert elections > 0 or unanswered == 0, (unanswered, elections)  # publishes unanswered: an election seen
    print(f"cluster {scenario}: {len(events)} events, {writer.commits} commits, {len(watch.samples)} slot samples, "
          f"retries {retries}, {unanswered:.0f} unanswered, {elections:.0f} election(s), "
          f"{len(out_of_order)} row(s) out of order, {time.monotonic() - started:.0f}s")
    assert not out_of_order, f"{len(out_of_order)} row(s) out of order: {list(out_of_order.items())[:3]}"
