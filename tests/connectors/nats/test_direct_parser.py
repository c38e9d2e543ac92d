"""DirectParser (connectors/nats/natspy.py) against nats-py's own parser: the same calls, in the
same order, for any mix of frames cut into reads anywhere; no servers."""

from __future__ import annotations

import asyncio
import itertools
import re
from itertools import pairwise
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from nats.aio.subscription import Subscription
from nats.protocol.parser import Parser

from connectors.nats.frames import direct_frames
from connectors.nats.natspy import DirectParser, WalflowClient

DIRECT, OTHER = 7, 9


class Recording(WalflowClient):
    """A client that records what its parser hands it instead of acting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[Any, ...]] = []
        self._direct[DIRECT] = (Subscription(self, DIRECT, "_INBOX.x.*"), self._on_direct)

    def _on_direct(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        self.events.append(("direct", subject, data, headers))

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if sid == DIRECT:
            await super()._process_msg(sid, subject, reply, data, headers)
        else:
            self.events.append(("msg", sid, subject, reply, data, headers))

    async def _process_ping(self) -> None:
        self.events.append(("ping",))

    async def _process_pong(self) -> None:
        self.events.append(("pong",))

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        self.events.append(("info", info))

    async def _process_err(self, err_msg: str) -> None:
        self.events.append(("err", err_msg))


def _ack(token: int) -> bytes:
    payload = b'{"stream":"WALFLOW","seq":%d}' % (token + 1000)
    return b"MSG _INBOX.x.%d %d %d\r\n%s\r\n" % (token, DIRECT, len(payload), payload)


FRAMES = st.one_of(
    st.integers(1, 10**6).map(_ack),
    st.just(b"MSG _INBOX.x.5 7 0\r\n\r\n"),  # empty payload
    st.just(b"MSG _INBOX.x.6 7 4\r\n\r\nab\r\n"),  # CRLF inside the payload
    st.just(b"MSG other.subject 9 5\r\nhello\r\n"),
    st.just(b"MSG _INBOX.x.8 7 reply.to 3\r\nabc\r\n"),
    st.just(b"HMSG _INBOX.x.9 7 16 21\r\nNATS/1.0 503\r\n\r\n{\"a\"}\r\n"),
    st.just(b"PING\r\n"),
    st.just(b"PONG\r\n"),
    st.just(b"+OK\r\n"),
    st.just(b"-ERR 'Permissions Violation for Publish to x'\r\n"),
    st.just(b'INFO {"server_id":"s","max_payload":1048576}\r\n'),
)


async def _feed(parser: Parser, reads: list[bytes]) -> None:
    for data in reads:
        await parser.parse(data)


def _events(parser_of: Any, reads: list[bytes]) -> list[tuple[Any, ...]]:
    client = Recording()
    asyncio.run(_feed(parser_of(client), reads))
    return client.events


@given(st.lists(FRAMES, max_size=30), st.lists(st.integers(0, 2000), max_size=12))
def test_the_same_calls_as_nats_pys_parser_wherever_the_reads_end(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frames)
    bounds = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    reads = [stream[a:b] for a, b in pairwise(bounds)]
    expected = _events(Parser, reads)
    assert _events(lambda client: client._ps, reads) == expected
    assert len(expected) == len(frames) - frames.count(b"+OK\r\n")


def test_the_client_parses_with_it() -> None:
    assert type(WalflowClient()._ps) is DirectParser


def test_acks_after_a_frame_nats_py_handled_take_the_short_way_again() -> None:
    client = Recording()
    parser = client._ps
    direct_calls: list[bytes] = []
    client._direct[DIRECT] = (client._direct[DIRECT][0], lambda subject, data, headers: direct_calls.append(data))
    asyncio.run(_feed(parser, [b"PING\r\n" + _ack(1)[:10], _ack(1)[10:] + _ack(2)]))
    assert client.events == [("ping",)]
    assert len(direct_calls) == 2
    assert parser.buf == bytearray()


def test_a_handler_that_raises_is_logged_and_the_frames_after_it_still_arrive() -> None:
    client = Recording()
    seen: list[bytes] = []

    def handler(subject: bytes, data: bytes, headers: bytes | None) -> None:
        seen.append(data)
        if len(seen) == 1:
            raise RuntimeError("boom")

    client._direct[DIRECT] = (client._direct[DIRECT][0], handler)
    asyncio.run(_feed(client._ps, [_ack(1) + _ack(2)]))
    assert len(seen) == 2


#: How a direct frame's control line was read before it was read byte by byte.
_CONTROL = re.compile(rb"MSG (\S+) (\d+) (\d+)\r\n")
#: A control line's parts, each with what nats-server writes first and near misses after it.
_PARTS: list[list[bytes]] = [
    [b"MSG ", b"MSG", b"MSG  ", b"HMSG ", b"MSg ", b"MSG\t", b"MSG.", b"MSG\r\n"],
    [b"_INBOX.x.1", b"", b"a\tb", b"a\x0bb", b"a\x0cb", b"a\rb", b"a\nb", b"\x1f", b"\xff", b"\x08", b"\x0e", b"7"],  # subject
    [b" ", b"", b"  ", b"\t"],
    [b"7", b"9", b"07", b"0", b"", b"-1", b"x", b"\xd9", b"7a"],  # the sid: 7 is the direct one
    [b" ", b"", b"  ", b"\t"],
    [b"3", b"0", b"12", b"", b"-1", b"x", b"\xd9", b"+3", b"/", b":"],  # the size
    [b"\r\n", b"\r", b"\n", b"", b" \r\n", b"\n\r"],
    [b"abc\r\n", b"", b"ab", b"abc\r"],  # the payload and its end
]


def _lines_off_in_at_most_two_parts() -> list[bytes]:
    good = [part[0] for part in _PARTS]
    lines = [b"".join(good)]
    for a, b in itertools.combinations(range(len(_PARTS)), 2):
        for miss_a in _PARTS[a]:
            for miss_b in _PARTS[b]:
                line = list(good)
                line[a], line[b] = miss_a, miss_b
                lines.append(b"".join(line))
    return lines


def _by_pattern(data: bytes, direct: dict[int, Any]) -> tuple[list[tuple[bytes, bytes]], tuple[int, bool]]:
    """What the frames' regex reading handed on, and where it stopped."""
    calls: list[tuple[bytes, bytes]] = []
    pos = 0
    while (frame := _CONTROL.match(data, pos)) is not None:
        subject, sid, length = frame.groups()
        if int(sid) not in direct:
            break
        end = frame.end() + int(length)
        if end + 2 > len(data):
            return calls, (pos, True)
        calls.append((subject, data[frame.end() : end]))
        pos = end + 2
    return calls, (pos, False)


def test_direct_frames_reads_a_control_line_as_the_pattern_did() -> None:
    """Every line off in at most two parts, alone and before a direct ack."""
    for line in _lines_off_in_at_most_two_parts():
        for data in (line, line + _ack(5)):
            calls: list[tuple[bytes, bytes]] = []
            record = calls.append
            direct: dict[int, Any] = {DIRECT: (None, lambda subject, payload, _, record=record: record((subject, payload)))}
            stopped = direct_frames(data, direct)
            assert (calls, stopped) == _by_pattern(data, direct), data
