"""How ``walflow status`` words what it sampled: the seeds' situations from made-up samples, and the screen."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest

from cli.probe import (
    Finding,
    Health,
    Holder,
    Level,
    SlotSample,
    colour_wanted,
    duration,
    lost_slot_fix,
    render,
    size,
)
from cli.status import judge_pipeline, judge_slot, trend
from config.schema import Config, DatabaseConfig
from connectors.postgres.protocol import str_to_lsn

DB = DatabaseConfig.model_validate({"name": "app", "hostname": "db", "database": "app",
                                    "slot": {"name": "wf_slot", "create_if_not_exists": True},
                                    "publication": {"name": "wf_pub"}})
AT = datetime(2026, 11, 30, 8, 15, 5, tzinfo=UTC)
GB = 1024**3


def _holder(app: str = "walflow:wf_slot", *, reply: float = 1.0, flush_lag: float | None = None,
            wait: str = "WalSenderWaitForWAL") -> Holder:
    return Holder(19053, app, "10.0.0.7", wait, True, reply, flush_lag)


def _sample(seconds: float, current: int, confirmed: int, holder: Holder | None, *, wal_status: str = "reserved",
            safe: int | None = None) -> SlotSample:
    return SlotSample(AT + timedelta(seconds=seconds), current, True, "pgoutput", "app", holder is not None,
                      confirmed, wal_status, safe, holder)


def _judge(first: SlotSample, last: SlotSample) -> list[Finding]:
    return judge_slot(DB, "walflow.yaml", first, last, None, [("app-to-nats", "public.orders")], 2.0)


def test_the_first_seed_a_slot_67_gb_behind_whose_confirmed_lsn_stands_still() -> None:
    confirmed = str_to_lsn("1514/6002A288")
    holder = _holder(flush_lag=20 * 60)
    first = _sample(0, confirmed + 67 * GB, confirmed, holder)
    last = _sample(3, confirmed + 67 * GB + 30_000_000, confirmed, holder)
    held, lag, wal = _judge(first, last)
    assert held.level == Level.OK
    assert lag == Finding("slot wf_slot", Level.WARN, "slot lag 67 GB and growing, confirmed LSN 1514/6002A288 stuck "
                          "since 2026-11-30 07:55:08 UTC (20 min): walflow reads but JetStream does not acknowledge "
                          "(see the sinks)")
    assert wal.level == Level.OK


def test_the_first_seed_a_slot_held_by_a_silent_walflow() -> None:
    holder = _holder(reply=14 * 60, wait="ClientWrite")
    sample = _sample(0, 2000, 1000, holder)
    held = _judge(sample, sample)[0]
    assert held.level == Level.FAIL
    assert held.text == ("slot held by PID 19053 (walflow:wf_slot, 10.0.0.7, last reply 14 min ago): that walflow is "
                         "hung (its walsender waits on it and it has not replied for 14 min)")
    assert held.fix == ("start walflow again: a new one ends a silent walsender of its own and takes the slot; or "
                        "SELECT pg_terminate_backend(19053);")


def test_a_silent_walsender_busy_decoding_is_degraded_not_down() -> None:
    sample = _sample(0, 2000, 1000, _holder(reply=120, wait="ReorderBufferWrite"))
    held = _judge(sample, sample)[0]
    assert held.level == Level.WARN and "its walsender is busy (wait event ReorderBufferWrite) and silent" in held.text


def test_a_foreign_holder_is_down_with_the_pid_to_end() -> None:
    sample = _sample(0, 2000, 1000, _holder("pg_recvlogical", reply=30))
    held = _judge(sample, sample)[0]
    assert held.level == Level.FAIL
    assert held.text.startswith("slot held by PID 19053 (pg_recvlogical, 10.0.0.7, last reply 30 s ago): not walflow")
    assert held.fix is not None and "SELECT pg_terminate_backend(19053);" in held.fix


def test_an_epoch_in_flight_is_not_a_stall() -> None:
    """Confirmed LSN still, but only for seconds (flush_lag): a 10 s Bytewax epoch, not a stuck slot."""
    holder = _holder(flush_lag=12)
    first = _sample(0, 10_000, 5_000, holder)
    last = _sample(3, 20_000, 5_000, holder)
    found = trend(first, last)
    assert found is not None and found.stuck and found.stuck_for_s == 12
    assert _judge(first, last)[1].level == Level.OK


def test_a_large_lag_that_grows_while_confirming_is_degraded() -> None:
    holder = _holder(flush_lag=2)
    first = _sample(0, 5 * GB, 1_000, holder)
    last = _sample(2, 5 * GB + 40 * 1024**2, 2_000, holder)
    lag = _judge(first, last)[1]
    assert lag.level == Level.WARN
    assert lag.text == "slot lag 5.0 GB and growing (+20 MB/s): walflow confirms slower than the database writes"


def test_a_lag_that_shrinks_is_fine() -> None:
    holder = _holder(flush_lag=2)
    lag = _judge(_sample(0, 5 * GB, 0, holder), _sample(2, 5 * GB, 1 * GB, holder))[1]
    assert lag.level == Level.INFO and lag.text.startswith("lag 4.0 GB, shrinking (-512 MB/s), confirmed LSN 0/40000000")


def test_wal_about_to_run_out_and_unreserved() -> None:
    holder = _holder()
    first = _sample(0, 1_000_000, 1_000_000, holder, safe=100 * 1024**2)
    last = _sample(2, 3_000_000, 1_000_000, holder, safe=98 * 1024**2)
    wal = _judge(first, last)[2]
    assert wal.level == Level.WARN
    assert wal.text == ("wal_status reserved, safe_wal_size 98 MB: at the present rate PostgreSQL invalidates the slot "
                        "in about 2 min")
    unreserved = _sample(0, 0, 0, holder, wal_status="unreserved", safe=-5)
    wal = _judge(unreserved, unreserved)[2]
    assert wal.level == Level.WARN and wal.text.startswith("wal_status unreserved: PostgreSQL removes WAL the slot needs")


def test_a_lost_slot_says_what_to_run() -> None:
    lost = _sample(0, 2000, 1000, None, wal_status="lost")
    (finding,) = _judge(lost, lost)
    assert finding.level == Level.FAIL and finding.text.startswith("wal_status lost: PostgreSQL invalidated slot wf_slot")
    assert finding.fix == ("SELECT pg_drop_replication_slot('wf_slot'); then start walflow (./run.sh run walflow.yaml), "
                           "which creates the slot again; then backfill what the slot lost: walflow backfill "
                           "walflow.yaml --sink app-to-nats --table public.orders")
    manual = DB.model_copy(update={"slot": DB.slot.model_copy(update={"create_if_not_exists": False})})
    assert lost_slot_fix(manual, "my config.yaml", []) == (
        "SELECT pg_drop_replication_slot('wf_slot'); then SELECT pg_create_logical_replication_slot('wf_slot', "
        "'pgoutput'); then start walflow (./run.sh run 'my config.yaml'); then backfill the tables the sinks read "
        "(walflow backfill CONFIG --sink NAME --table SCHEMA.TABLE)")


@pytest.mark.parametrize(("n", "text"), [(0, "0 bytes"), (592, "592 bytes"), (10 * 1024, "10 kB"),
                                         (67 * GB + 10**8, "67 GB"), (int(1.5 * GB), "1.5 GB")])
def test_sizes_read_as_pg_size_pretty(n: int, text: str) -> None:
    assert size(n) == text


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0 s"), (75, "75 s"), (14 * 60, "14 min"),
                                               (2 * 3600 + 300, "2 h 5 min"), (3 * 3600, "3 h")])
def test_durations(seconds: float, text: str) -> None:
    assert duration(seconds) == text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_on_a_terminal_only_and_never_with_no_color() -> None:
    assert colour_wanted(_Terminal(), {})
    assert not colour_wanted(_Terminal(), {"NO_COLOR": "1"})
    assert not colour_wanted(io.StringIO(), {})
    findings = [Finding("slot s", Level.FAIL, "broken", "mend it"), Finding("slot s", Level.OK, "fine")]
    tags = {Level.OK: "ok", Level.INFO: "note", Level.WARN: "DEGRADED", Level.FAIL: "DOWN"}
    assert render(findings, tags, colour=False) == ["slot s", "  DOWN      broken", "            fix: mend it",
                                                    "  ok        fine"]
    painted = render(findings, tags, colour=True)
    assert painted[1] == "  \x1b[1;31mDOWN    \x1b[0m  broken" and painted[3] == "  \x1b[32mok      \x1b[0m  fine"


CONFIG = Config.model_validate({"databases": [DB.model_dump(mode="json") | {"password": None}],
                                "sinks": [{"name": "app-to-nats", "database": "app",
                                           "destination": {"type": "nats", "host": "nats"}}]})
URL = "http://127.0.0.1:9187/readyz"


def _reader(**fields: object) -> dict[str, object]:
    return {"slot": "wf_slot", "connected": True, "error": None, "confirmed_lsn": "0/1", "heartbeat_age_s": 1.2,
            "heartbeat_rtt_ms": 0.8, "ready": True, "backfills": [], **fields}


def test_the_pipeline_as_its_health_endpoint_says() -> None:
    backfill = {"id": "bf1", "sink": "app-to-nats", "table": "public.orders", "state": "running", "rows": 12000,
                "estimate": 50000, "rows_per_s": 3000.0, "eta_s": 12.7}
    ready, line = judge_pipeline(CONFIG, "c.yaml", Health(URL, True, True, (_reader(backfills=[backfill]),)), True)
    assert ready == Finding("pipeline", Level.OK, f"running and ready at {URL}: slot wf_slot connected, last heartbeat "
                            "1 s ago (0.8 ms round trip)")
    assert line == Finding("pipeline", Level.INFO, "backfill bf1 (running): public.orders → app-to-nats: "
                           "12,000/~50,000 rows, 3,000 rows/s, ETA 13s")
    (odd,) = judge_pipeline(CONFIG, "c.yaml", Health(URL, True, True, (_reader(backfills=[{"id": "x"}]),)), True)[1:]
    assert odd.text == 'backfill: {"id": "x"}'  # a pipeline of another version: shown as it came
    (error,) = judge_pipeline(CONFIG, "c.yaml", Health(URL, True, False, (_reader(error="slot lost"),)), False)
    assert error.level == Level.FAIL and error.text == "pipeline stopped replicating slot wf_slot: slot lost"
    (away,) = judge_pipeline(CONFIG, "c.yaml", Health(URL, True, False, (_reader(connected=False),)), False)
    assert away.level == Level.FAIL and "not connected to slot wf_slot: reconnecting" in away.text
    (stale,) = judge_pipeline(CONFIG, "c.yaml", Health(URL, True, False, (_reader(ready=False, heartbeat_age_s=40),)),
                              True)
    assert stale.level == Level.WARN and stale.text.endswith("no fresh heartbeat through the slot (the last one 40 s ago)")
    (other,) = judge_pipeline(CONFIG, "c.yaml", Health(URL, True, True, ()), True)
    assert other.level == Level.INFO and "does not read slot wf_slot" in other.text
    (silent,) = judge_pipeline(CONFIG, "c.yaml", Health(URL, False, problem="timed out"), True)
    assert silent.level == Level.INFO and "runs elsewhere, or its port was taken" in silent.text
