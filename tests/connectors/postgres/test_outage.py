"""What an outage looks like in the log (connectors/postgres/outage.py), on a clock of the test's own."""

from __future__ import annotations

import logging

import pytest

from connectors.postgres.outage import REPEAT_EVERY, OutageLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    out = [(r.levelname, r.getMessage()) for r in caplog.records]
    caplog.clear()
    return out


@pytest.fixture
def outage(caplog: pytest.LogCaptureFixture) -> tuple[OutageLog, Clock]:
    caplog.set_level(logging.DEBUG, logger="test.outage")
    clock = Clock()
    return OutageLog(logging.getLogger("test.outage"), clock), clock


def test_a_crash_is_one_warning_then_one_line_when_it_works_again(
    outage: tuple[OutageLog, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, clock = outage
    log.recovered("replication streams")  # the first start: no outage, nothing to say
    log.failed("connection", "interrupted: %s", "server closed the connection unexpectedly")
    clock.now += 0.5
    log.failed("connection", "interrupted: %s", "the database system is not yet accepting connections")
    clock.now += 1.1
    assert log.ongoing and log.attempts == 2
    log.recovered("replication streams")
    assert _said(caplog) == [
        ("WARNING", "interrupted: server closed the connection unexpectedly"),
        ("DEBUG", "interrupted: the database system is not yet accepting connections"),
        ("INFO", "replication streams again after 1.6s (2 failed attempts)"),
    ]
    assert not log.ongoing and log.attempts == 0
    log.failed("connection", "interrupted again")  # a new outage: a warning of its own
    clock.now += 2
    log.recovered("it works")
    assert _said(caplog) == [("WARNING", "interrupted again"), ("INFO", "it works again after 2.0s (1 failed attempt)")]


def test_a_failure_of_another_kind_and_a_long_outage_are_said_again(
    outage: tuple[OutageLog, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, clock = outage
    log.failed("connection", "lost")
    log.failed("slot_in_use", "held by someone else")  # news: a warning
    log.failed("slot_in_use", "still held")
    clock.now += REPEAT_EVERY
    log.failed("slot_in_use", "still held, 30 s on")
    clock.now += 1
    log.failed("slot_in_use", "still held, 31 s on")
    assert [level for level, _ in _said(caplog)] == ["WARNING", "WARNING", "DEBUG", "WARNING", "DEBUG"]
