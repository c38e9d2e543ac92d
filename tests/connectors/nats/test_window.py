"""The publisher's window on plain data (connectors/nats/window.py): commands, the row fence, acks; no servers."""

from __future__ import annotations

from connectors.nats.window import HEADERS_SIZE, InFlight, Window
from core.errors import PublishRefused
from core.message import Message

PREFIX = b"_INBOX_walflow.abc."


def _entry(payload: bytes, row: int = 0, msg_id: str = "db:s:1:0", headers: bytes = b"") -> InFlight:
    message = Message(b"p.db.public.orders.insert", payload, msg_id, ("public.orders", "insert"), 1.0, headers)
    message.row = row
    return InFlight(message, 5.0, 7)


def test_a_batch_is_one_block_of_hpub_commands_each_with_its_reply_token() -> None:
    window = Window(PREFIX)
    first, second = _entry(b'{"a":1}', msg_id="id-1"), _entry(b"{}", msg_id="id-22", headers=b"X-A: b\r\n")
    block, sent, taken = window.commands([first, second], 1 << 20)
    assert block == (
        b"HPUB p.db.public.orders.insert _INBOX_walflow.abc.1 31 38\r\nNATS/1.0\r\nNats-Msg-Id: id-1\r\n\r\n"
        b'{"a":1}\r\n'
        b"HPUB p.db.public.orders.insert _INBOX_walflow.abc.2 40 42\r\nNATS/1.0\r\nNats-Msg-Id: id-22\r\nX-A: b\r\n"
        b"\r\n{}\r\n")
    assert (sent, taken, window.token) == (2, 2, 2)
    assert window.waiting == {PREFIX + b"1": first, PREFIX + b"2": second}
    assert list(window.inflight) == [first, second]
    assert len(b"NATS/1.0\r\nNats-Msg-Id: id-1\r\n\r\n") == HEADERS_SIZE + len(b"id-1") == 31  # what HPUB says


def test_tokens_go_on_counting_across_batches() -> None:
    window = Window(PREFIX)
    window.commands([_entry(b"1")], 1 << 20)
    block, _, _ = window.commands([_entry(b"2")], 1 << 20)
    assert b" _INBOX_walflow.abc.2 " in block


def test_a_message_too_large_is_refused_and_nothing_after_it_goes_out() -> None:
    window = Window(PREFIX)
    fits, too_large, after = _entry(b"x" * 10), _entry(b"x" * 100), _entry(b"y")
    block, sent, taken = window.commands([fits, too_large, after], HEADERS_SIZE + len("db:s:1:0") + 50)
    assert (sent, taken) == (1, 2)  # in the window, not sent: settle sees its error
    assert block.count(b"HPUB ") == 1
    assert isinstance(too_large.error, PublishRefused) and "max_payload" in str(too_large.error)
    assert list(window.inflight) == [fits, too_large] and after.error is None


def test_a_rows_second_message_is_held_until_its_first_is_stored() -> None:
    window = Window(PREFIX)
    first, second, other, third = _entry(b"1", row=9), _entry(b"2", row=9), _entry(b"3", row=4), _entry(b"4", row=9)
    _, sent, taken = window.commands([first, second, other, third], 1 << 20)
    assert (sent, taken) == (2, 2)
    assert window.held == [second, third] and window.held_rows == {9: 2}
    assert window.rows == {9: first, 4: other}
    entry, stored, unfenced = window.acked(PREFIX + b"1", b'{"stream":"S","seq":11}')
    assert (entry, stored, unfenced, first.seq) == (first, True, 9, 11)
    assert 9 not in window.rows


def test_an_ack_names_its_message_and_sequence_once() -> None:
    window = Window(PREFIX)
    entry = _entry(b"1")
    window.commands([entry], 1 << 20)
    assert window.acked(PREFIX + b"1", b'{"stream":"S","seq":3,"duplicate":true}') == (entry, True, 0)
    assert window.acked(PREFIX + b"1", b'{"stream":"S","seq":3}') == (None, False, 0)  # late: given up on
    assert window.acked(PREFIX + b"x", b'{"stream":"S","seq":3}') == (None, False, 0)  # not ours


def test_an_error_ack_leaves_the_sequence_and_the_fence() -> None:
    window = Window(PREFIX)
    entry = _entry(b"1", row=5)
    window.commands([entry], 1 << 20)
    data = b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"W","seq":5}'
    assert window.acked(PREFIX + b"1", data) == (entry, False, 0)
    assert entry.seq == 0 and window.rows == {5: entry}


def test_a_resend_is_a_fresh_entry_of_the_same_first_send() -> None:
    entry = _entry(b"1")
    entry.seq, entry.error = 0, PublishRefused("x")
    again = entry.again()
    assert (again.message, again.first_sent, again.floor_seq, again.seq, again.error, again.done) == (
        entry.message, 5.0, 7, 0, None, False)
    assert entry.done and entry.published_on == "p.db.public.orders.insert"
