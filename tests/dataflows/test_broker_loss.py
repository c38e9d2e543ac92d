"""A JetStream that loses what it acknowledged: the confirm delay and the repair from the slot.

One NATS server with file storage under load is stopped, its store copied and started again;
later it is killed (-9) and the copy put back, as a crash that lost what was not yet synced
would leave it: the stream now lacks the newest messages it had acknowledged. With a confirm
delay longer than that gap walflow notices at its reconnect, starts itself again from the
slot's confirmed position, and the stream ends with every change exactly once and in order;
with a delay of 0 the same loss is permanent, and walflow says so in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from embedded import NatsServer, wait_for
from embedded._process import free_port
from tests.cli.helpers import edit, status
from tests.harness import Database, TestNames, slot_active, slot_confirmed
from tests.pipeline import assert_running, by_labels, pipeline, scrape, stored
from tests.workload import Inserter, setup_events

_GAP = 2_000  # messages the stream acknowledges between the copy and the crash


def _config(database: Database, names: TestNames, server: NatsServer, tmp_path: Path, delay_ms: int,
            health_port: int) -> Path:
    def change(data: dict[str, Any]) -> None:
        data["sinks"][0]["destination"]["confirm_delay_ms"] = delay_ms
        data["walflow"]["health"] = {"enabled": True, "port": health_port}

    return edit(setup_events(database, names, server, tmp_path), change)


def _lose_the_newest(server: NatsServer, names: TestNames, proc_check: Any) -> int:
    """Stop the server, copy its store, start it; once the stream acknowledged :data:`_GAP` more,
    kill it, put the copy back and start it again. Returns how many messages the stream lost."""
    assert server.base is not None
    store = server.base / "jetstream"
    server.stop()
    copy = server.base.parent / f"{server.base.name}-copy"
    shutil.copytree(store, copy)
    kept = len(stored(server.start().url, names.stream))
    wait_for(lambda: len(stored(server.url, names.stream)) >= kept + _GAP, timeout=60,
             what=f"{_GAP} more messages acknowledged", check=proc_check)
    server.kill()
    acked = kept + _GAP
    shutil.rmtree(store)
    shutil.move(copy, store)
    server.start()
    return acked - len(stored(server.url, names.stream))


@pytest.mark.slow
@pytest.mark.parametrize(("delay_ms", "recovery"), [(60_000, False), (60_000, True), (0, False)],
                         ids=["delay-covers-the-gap", "delay-covers-the-gap-r", "no-delay"])
def test_a_stream_that_lost_acknowledged_messages_is_repaired_from_the_slot(
    database: Database, names: TestNames, tmp_path: Path, delay_ms: int, recovery: bool
) -> None:
    port = free_port()
    # with -r the restart must not resume from the recovery snapshots, which are past the loss
    args = ["-s", "1", *(["-r", str(tmp_path / "recovery"), "-b", "0"] if recovery else [])]
    with NatsServer() as server:
        config = _config(database, names, server, tmp_path, delay_ms, port)
        with pipeline(config, *args) as proc:
            running = lambda: assert_running(proc)
            wait_for(lambda: slot_active(database), timeout=60, what="the slot", check=running)
            writer = Inserter(database.dsn, rate=500)
            writer.start()
            wait_for(lambda: len(stored(server.url, names.stream)) >= 1000, timeout=60, what="traffic", check=running)
            lost = _lose_the_newest(server, names, running)
            assert lost >= _GAP // 2, f"the restored store lost only {lost} messages"
            wait_for(lambda: "lost messages it had acknowledged" in proc.log_tail(400), timeout=60,
                     what="walflow to notice the stream went back", check=running)
            writer.stop.set()
            writer.join(10)
            ids = list(range(1, writer.count + 1))
            if delay_ms:
                wait_for(lambda: len({e.msg_id for e in stored(server.url, names.stream)}) >= len(ids), timeout=120,
                         what="every change in the stream again", check=running)
                end = database.current_lsn()
                assert slot_confirmed(database) < end  # the delay still holds the slot back
            else:
                end = database.current_lsn()
                wait_for(lambda: slot_confirmed(database) >= end, timeout=60, what="the slot to pass the load",
                         check=running)
            regressions = by_labels(scrape(port)["walflow_stream_regressions_total"], "sink", "stream", "outcome")
            log = proc.log_tail(2000)
        seen = status(config)
        events = stored(server.url, names.stream)
    stored_ids = [e.event["record"]["id"] for e in events]
    assert len(stored_ids) == len(set(stored_ids)), "a change was published twice"
    outcome = "republished" if delay_ms else "lost"
    assert regressions == {("g", names.stream, outcome): 1.0}
    assert "started again after stream" in log
    regression = seen.data["sinks"][0]["regression"]
    assert regression["stream"] == names.stream and regression["repairable"] == bool(delay_ms)
    seen.finding("info" if delay_ms else "degraded", f"stream {names.stream} lost up to")
    if delay_ms:
        assert sorted(stored_ids) == ids  # every change, each once
        assert "restarts from the slot's confirmed position and publishes again what the stream no longer has" in log
    else:
        missing = set(ids) - set(stored_ids)
        assert missing, "with no confirm delay the loss should have been permanent"
        assert "those changes are LOST" in log
