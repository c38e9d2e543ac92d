"""The catch-up progress lines: a large backlog is reported once a minute, a small one never."""

from __future__ import annotations

from connectors.postgres.heartbeat import CATCH_UP_BYTES, CatchUpLog

MB = 1_000_000


def test_a_small_lag_is_never_reported() -> None:
    log = CatchUpLog("wf")
    assert [log.sample(t * 5.0, CATCH_UP_BYTES - t, t * MB) for t in range(100)] == [None] * 100


def test_a_large_backlog_is_reported_at_once_then_once_a_minute_until_caught_up() -> None:
    log = CatchUpLog("wf")
    lines: list[tuple[float, str]] = []
    lag, received = 0, 0
    assert log.sample(0.0, lag, received) is None
    lag, received = 3000 * MB, 10 * MB  # a restart after a long stop: 3 GB behind
    for t in range(5, 400, 5):
        line = log.sample(float(t), lag, received)
        if line is not None:
            lines.append((t, line))
        lag, received = max(0, lag - 50 * MB), received + 60 * MB  # 10 MB/s of it heartbeats and other tables
    assert [t for t, _ in lines] == [5, 65, 125, 185, 245, 305]
    assert lines[0][1] == (  # the jump itself, measured over the last sample
        "slot wf: 3.0 GB behind the server's WAL, not catching up (lag growing 600.0 MB/s, reading 2.0 MB/s)")
    assert lines[1][1] == (
        "slot wf: 2.4 GB behind the server's WAL, catching up 10.0 MB/s (reading 12.0 MB/s), ETA 4 min")
    assert lines[-1][1] == "slot wf: caught up (0 B behind) after 5 min"
    assert all(log.sample(400.0 + t, 0, received) is None for t in range(0, 300, 5))


def test_a_growing_backlog_says_so_and_a_lag_between_a_quarter_and_the_threshold_stays_a_backlog() -> None:
    log = CatchUpLog("wf", threshold=100 * MB, every=60)
    assert log.sample(0.0, 90 * MB, 0) is None
    assert log.sample(5.0, 120 * MB, 0) == (
        "slot wf: 120.0 MB behind the server's WAL, not catching up (lag growing 6.0 MB/s, reading 0 B/s)")
    assert log.sample(30.0, 30 * MB, 0) is None  # below the threshold, above a quarter of it: still behind
    assert log.sample(65.0, 300 * MB, 0) == (
        "slot wf: 300.0 MB behind the server's WAL, not catching up (lag growing 3.0 MB/s, reading 0 B/s)")
    assert log.sample(70.0, 20 * MB, 0) == "slot wf: caught up (20.0 MB behind) after 65s"
