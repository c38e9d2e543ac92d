"""A session's timers, without a server or a clock: status updates, silence, stalls."""

from __future__ import annotations

from connectors.postgres.liveness import CONFIRM_GAP, STALL_WARNING, Liveness


def clock(**kwargs: bool) -> Liveness:
    return Liveness(0.0, 100, status_interval=2.0, wal_sender_timeout=15.0, **kwargs)


def test_a_status_update_goes_out_at_once_then_every_interval() -> None:
    timers = clock()
    assert timers.tick(0.0, 100, False, True).send
    timers.sent(0.0)
    assert not timers.tick(1.9, 100, False, True).send
    assert timers.wake_by(False) == 2.0
    assert timers.tick(2.0, 100, False, True).send


def test_a_moved_confirm_goes_out_soon_but_not_more_often_than_the_gap() -> None:
    timers = clock()
    timers.sent(0.0)
    assert not timers.tick(CONFIRM_GAP / 2, 100, True, True).send
    assert timers.wake_by(True) == CONFIRM_GAP
    assert timers.tick(CONFIRM_GAP, 100, True, True).send


def test_silence_past_an_interval_asks_for_a_reply_and_past_the_limit_is_suspect() -> None:
    timers = clock()
    timers.heard(0.0)
    timers.sent(0.0)
    quiet = timers.tick(2.5, 100, False, True)
    assert quiet.send and quiet.reply and not quiet.suspect
    timers.sent(2.5)
    assert timers.dead_after == 7.5 + 6.0
    assert not timers.tick(13.0, 100, False, True).suspect
    assert timers.tick(14.0, 100, False, True).suspect
    timers.heard(14.0)  # anything at all from the server (or not listening) is not silence
    assert not timers.tick(14.5, 100, False, True).suspect


def test_a_reply_is_asked_for_only_after_silence() -> None:
    timers = clock()
    timers.heard(1.9)
    timers.sent(0.0)
    assert timers.tick(2.0, 100, False, True).reply is False


def test_wal_standing_still_is_warned_of_every_few_minutes_while_reading() -> None:
    timers = clock()
    assert timers.tick(STALL_WARNING, 100, False, True).stalled is None
    assert timers.tick(STALL_WARNING + 1, 100, False, True).stalled == STALL_WARNING + 1
    assert timers.tick(STALL_WARNING + 2, 100, False, True).stalled is None  # said once per period
    assert timers.tick(2 * STALL_WARNING + 2, 100, False, True).stalled == STALL_WARNING + 1
    assert timers.tick(4 * STALL_WARNING, 200, False, True).stalled is None  # it moved


def test_a_full_buffer_or_no_heartbeats_is_no_stall() -> None:
    reading = clock()
    assert reading.tick(STALL_WARNING + 1, 100, False, listening=False).stalled is None
    silent_by_config = clock(watch_stalls=False)
    assert silent_by_config.tick(STALL_WARNING + 1, 100, False, True).stalled is None
