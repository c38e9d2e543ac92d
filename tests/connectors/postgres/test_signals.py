"""Backfill signals as written into the WAL and read back (:mod:`connectors.postgres.signals`).

Any role may write under walflow's prefix, so :func:`decode` is total: a signal, None for
another slot's, or why it is not one, never an exception.
"""

from __future__ import annotations

import base64
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.postgres.signals import BackfillRequest, CursorSeal, NotASignal, Signal, decode

REQUEST = BackfillRequest("0123456789abcdef", "app-to-nats", "public.orders", "updated_at", "2025-01-01")
KEY = b"k" * 32


def test_a_signal_reads_back_as_written() -> None:
    for signal in (
        Signal("request", "s1", REQUEST),
        Signal("low", "s1", REQUEST, run="r1", chunk=3, after=["2025-02-01 00:00:00+00", None], rows=10, estimate=99),
        Signal("high", "s1", REQUEST, run="r1", chunk=3, after=None, last=True, error="table was dropped"),
    ):
        assert decode(signal.encode().encode(), "s1") == signal
        assert decode(signal.encode(KEY).encode(), "s1", KEY) == signal
        assert decode(signal.encode(KEY).encode(), "s1") == signal  # a signature nobody checks is no harm


def test_another_slots_signal_is_none() -> None:
    assert decode(Signal("request", "s1", REQUEST).encode().encode(), "s2") is None  # another deployment's


def _reason(content: bytes, key: bytes | None = None) -> str:
    result = decode(content, "s1", key)
    assert isinstance(result, NotASignal), content
    return result.reason


def test_what_is_not_a_signal_as_walflow_writes_it_is_malformed() -> None:
    good = json.loads(Signal("request", "s1", REQUEST).encode())
    bad: list[object] = [
        [], "x", 1, None, {"v": 2, "slot": "s1"}, {**good, "kind": "other"}, {**good, "extra": 1},
        {**good, "request": {**good["request"], "id": [1]}},  # the TypeError
        {**good, "rows": "x"},  # the ValueError
        {**good, "rows": -1}, {**good, "rows": True}, {**good, "chunk": 1.5}, {**good, "after": "2025"},
        {**good, "after": [1]}, {**good, "request": {**good["request"], "id": "../x"}},
        {**good, "request": {**good["request"], "table": "t" * 10_000}},
        {**good, "request": {k: v for k, v in good["request"].items() if k != "table"}},
    ]
    for data in bad:
        assert _reason(json.dumps(data).encode()) == "malformed", data
    for content in (b"", b"{", b"\xff\xfe", b"[" * 5000 + b"]" * 5000, b'{"v":1' + b"\n" + b"0" * 64):
        assert _reason(content) == "malformed", content[:20]


def test_with_a_key_only_signals_signed_with_it_are_acted_on() -> None:
    signal = Signal("request", "s1", REQUEST)
    assert _reason(signal.encode().encode(), KEY) == "unauthenticated"
    assert _reason(signal.encode(b"another key").encode(), KEY) == "unauthenticated"
    forged = signal.encode(KEY).replace("public.orders", "public.secrets").encode()
    assert _reason(forged, KEY) == "unauthenticated"


CANARY = "canary-4111-1111"


def test_a_covered_tables_position_is_sealed_and_only_its_key_opens_it() -> None:
    low = Signal("low", "s1", REQUEST, run="r1", chunk=3, after=["2025-02-01", CANARY], rows=10)
    seal = CursorSeal(["public.orders"], None)
    text = low.encode(KEY, seal)
    assert CANARY not in text and "2025-02-01" not in text and json.loads(text.splitlines()[0])["after"] is None
    assert low.encode(KEY, seal) != text  # a fresh nonce: equal positions do not look equal
    assert decode(text.encode(), "s1", KEY, seal) == low  # this run reads its own positions
    unknown = decode(text.encode(), "s1", KEY, CursorSeal(["public.orders"], None))  # another run's own key
    assert unknown == Signal("low", "s1", REQUEST, run="r1", chunk=3, after=None, rows=10, unknown_position=True)
    assert decode(text.encode(), "s1", KEY) == unknown  # no seal at all: the same
    # a key from walflow.backfill.secret: every run of the config opens what another sealed
    shared = low.encode(KEY, CursorSeal(["public.orders"], b"the secret"))
    assert CANARY not in shared and decode(shared.encode(), "s1", KEY, CursorSeal([], b"the secret")) == low
    # a table no sink hides columns of: its position is written as it is
    assert CANARY in low.encode(KEY, CursorSeal(["public.customers"], None))


def test_a_tampered_seal_opens_as_an_unknown_position() -> None:
    seal = CursorSeal(["public.orders"], None)
    data = json.loads(Signal("low", "s1", REQUEST, run="r1", chunk=0, after=[CANARY]).encode(None, seal))
    sealed = bytearray(base64.b64decode(data["sealed"]))
    sealed[-1] ^= 1
    for bad in (base64.b64encode(bytes(sealed)).decode(), "not base64!", base64.b64encode(b"short").decode()):
        result = decode(json.dumps({**data, "sealed": bad}).encode(), "s1", None, seal)
        assert isinstance(result, Signal) and result.after is None and result.unknown_position


@settings(max_examples=300)
@given(st.binary(max_size=300) | st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                                               lambda inner: st.lists(inner, max_size=4)
                                               | st.dictionaries(st.text(max_size=8), inner, max_size=4)
                                               ).map(lambda v: json.dumps(v).encode()))
def test_decode_is_total(content: bytes) -> None:
    for result in (decode(content, "s1", KEY), decode(content, "s1", None, CursorSeal(["public.orders"], None))):
        assert result is None or isinstance(result, NotASignal | Signal)


def test_new_requests_have_fresh_ids() -> None:
    a, b = BackfillRequest.new("s", "public.t"), BackfillRequest.new("s", "public.t")
    assert a.id != b.id and len(a.id) == 16 and int(a.id, 16) >= 0
