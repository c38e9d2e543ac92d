"""How an AckPublisher takes the acks JetStream writes (its window's ``on_ack``), read straight from the wire; no servers."""

from __future__ import annotations

import itertools
import re

import pytest

from connectors.nats.natspy import WalflowClient
from connectors.nats.publisher import AckPublisher
from connectors.nats.window import InFlight, sequence
from core.errors import NoStreamError
from core.message import Message

MESSAGE = Message(b"p.d.public.orders.insert", b"{}", "id-1", ("public.orders", "insert"))


def _ack(data: bytes, headers: bytes | None = None) -> InFlight:
    publisher = AckPublisher(WalflowClient(), window=8, ack_timeout=5.0, label="t")
    entry = InFlight(MESSAGE, 0.0, 0)
    reply = publisher._window.reply_prefix + b"3"
    publisher._window.waiting[reply] = entry
    publisher._acks(reply, data, headers)
    assert reply not in publisher._window.waiting
    return entry


@pytest.mark.parametrize(("data", "seq"), [
    (b'{"stream":"WALFLOW","seq":12}', 12),
    (b'{"stream":"WALFLOW","seq":12,"duplicate":true}', 12),
    (b'{"stream":"WALFLOW","domain":"hub","seq":9007199254740993}', 9007199254740993),
    (b'{"stream": "WALFLOW", "seq": 7 }\r\n', 7),
    (b'{"stream":"error","seq":4}', 4),  # a stream named "error" is no error
])
def test_an_ack_gives_its_sequence(data: bytes, seq: int) -> None:
    entry = _ack(data)
    assert (entry.seq, entry.error) == (seq, None)


@pytest.mark.parametrize("data", [
    b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"W","seq":5}',
    b'{"stream":"W"}',
    b'{"stream":"W","seq":"x"}',
    b"",
])
def test_an_ack_without_a_sequence_or_with_an_error_fails_the_message(data: bytes) -> None:
    entry = _ack(data)
    assert entry.seq == 0
    assert entry.error is not None


def test_no_responders_is_no_stream() -> None:
    assert isinstance(_ack(b"", b"NATS/1.0 503\r\n\r\n").error, NoStreamError)


#: What an ack's sequence was read with before it was read by hand.
_PATTERN = re.compile(rb'"seq":\s*(\d+)')
#: Pieces an ack is made of, and what could confuse a reading of it.
_PIECES = [b'"seq":', b'"seq"', b":", b" ", b"\t", b"\n", b"\x0b", b"\x0c", b"\r", b"\x1c", b"0", b"7", b"12",
           b"9007199254740993", b"-", b"/", b"x", b'"', b"\xd9"]


def test_the_sequence_is_read_as_the_pattern_reads_it() -> None:
    """Every string of up to three pieces, alone and between an ack's start and its end."""
    for n in range(4):
        for pieces in itertools.product(_PIECES, repeat=n):
            for data in (b"".join(pieces), b'{"stream":"W",' + b"".join(pieces) + b"}"):
                found = _PATTERN.search(data)
                assert sequence(data) == (int(found.group(1)) if found is not None else -1), data
