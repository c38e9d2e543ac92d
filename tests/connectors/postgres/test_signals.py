"""Backfill signals as written into the WAL and read back (:mod:`connectors.postgres.signals`)."""

from __future__ import annotations

from connectors.postgres.signals import BackfillRequest, Signal, decode

REQUEST = BackfillRequest("0123456789abcdef", "app-to-nats", "public.orders", "updated_at", "2025-01-01")


def test_a_signal_reads_back_as_written() -> None:
    for signal in (
        Signal("request", "s1", REQUEST),
        Signal("low", "s1", REQUEST, run="r1", chunk=3, after=["2025-02-01 00:00:00+00", None], rows=10, estimate=99),
        Signal("high", "s1", REQUEST, run="r1", chunk=3, after=None, last=True, error="table was dropped"),
    ):
        assert decode(signal.encode().encode(), "s1") == signal


def test_what_is_not_a_signal_for_this_slot_is_none() -> None:
    good = Signal("request", "s1", REQUEST).encode()
    assert decode(good.encode(), "s2") is None  # another deployment's slot
    for content in (b"", b"[]", b"{", b'{"v": 2, "slot": "s1"}', good.replace('"request",', '"nonsense",', 1).encode(),
                    good.replace('"table"', '"tabel"').encode(), good.replace('"kind":"request"', '"kind":"other"').encode()):
        assert decode(content, "s1") is None, content


def test_new_requests_have_fresh_ids() -> None:
    a, b = BackfillRequest.new("s", "public.t"), BackfillRequest.new("s", "public.t")
    assert a.id != b.id and len(a.id) == 16 and int(a.id, 16) >= 0
