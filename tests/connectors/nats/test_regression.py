"""A stream that went back in time (connectors/nats/regression.py), against a real NATS.

What :func:`look` finds for a stream that still holds what it acknowledged, one whose limits
removed it, one that ends before it, one that holds another message there (went back, then
written again), and one deleted and created again; and the one line each regression says.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from connectors.nats.natspy import WalflowClient
from connectors.nats.regression import Acked, AckTimes, Regression, look
from core.runtime import Runtime
from tests.connectors.nats.clients import nats_client
from tests.harness import Nats, TestNames

runtime = Runtime()


@pytest.fixture
def nc(nats_srv: Nats, stream_cleanup: str) -> Iterator[WalflowClient]:
    with nats_client(runtime, nats_srv, "walflow-regression-test") as client:
        yield client


def _fill(nc: WalflowClient, names: TestNames, ids: list[str], max_msgs: int = -1) -> None:
    async def fill() -> None:
        js = nc.jetstream()
        await js.add_stream(name=names.stream, subjects=[f"{names.subject_prefix}.>"], max_msgs=max_msgs)
        for msg_id in ids:
            await js.publish(f"{names.subject_prefix}.x", b"{}", headers={"Nats-Msg-Id": msg_id})

    runtime.run(fill())


def _times(pairs: list[tuple[int, str]], now: float, every: float = 1.0) -> AckTimes:
    """Acknowledgements sampled as a publisher samples them, the last one at ``now``."""
    times = AckTimes()
    for k, (seq, msg_id) in enumerate(pairs):
        times.acked(seq, msg_id, now - every * (len(pairs) - 1 - k))
    return times


def _look(nc: WalflowClient, names: TestNames, acked: Acked, times: AckTimes,
          delay: float = 60.0) -> tuple[Regression | None, str | None]:
    return runtime.run(look(nc, "s", names.stream, acked, times, delay))


def test_a_stream_that_holds_what_it_acknowledged_or_removed_it_by_its_limits_lost_nothing(
    nc: WalflowClient, names: TestNames
) -> None:
    _fill(nc, names, [f"m{i}" for i in range(1, 11)], max_msgs=5)  # 1..5 removed by the limit
    now = time.monotonic()
    found, created = _look(nc, names, Acked(10, "m10"), _times([(10, "m10")], now))
    assert found is None and created is not None
    assert _look(nc, names, Acked(3, "m3", created), _times([], now)) == (None, created)  # under first_seq


def test_a_stream_that_ends_before_what_it_acknowledged_went_back(nc: WalflowClient, names: TestNames) -> None:
    _fill(nc, names, [f"m{i}" for i in range(1, 11)])
    now = time.monotonic()
    times = _times([(seq, f"m{seq}") for seq in range(1, 21)], now)  # it had acknowledged 1..20
    found, _ = _look(nc, names, Acked(20, "m20"), times)
    assert found is not None
    assert (found.acked_seq, found.stream_last, found.kept_seq, found.missing) == (20, 10, 10, 10)
    assert found.age is not None and 9.5 <= found.age <= 10.5 and found.repairable  # acked 10 s ago, delay 60 s
    assert "it ends at sequence 10 but had acknowledged sequence 20, up to 10 message(s) after sequence 10" \
        in found.line()
    assert found.line().endswith("publishes again what the stream no longer has")
    late, _ = _look(nc, names, Acked(20, "m20"), times, delay=12.0)  # 10 s ago is within the 5 s margin of 12
    assert late is not None and not late.repairable and "those changes are LOST" in late.line()
    assert Regression.from_json(found.as_json()) == found


def test_a_stream_written_again_past_what_it_lost_holds_another_message_there(
    nc: WalflowClient, names: TestNames
) -> None:
    _fill(nc, names, [*(f"m{i}" for i in range(1, 6)), *(f"new{i}" for i in range(6, 16))])  # lost m6.., refilled
    now = time.monotonic()
    times = _times([(seq, f"m{seq}") for seq in range(1, 13)], now)
    found, _ = _look(nc, names, Acked(12, "m12"), times)
    assert found is not None and found.kept_seq == 5 and found.missing == 7
    assert "sequence 12 holds another message than the one it acknowledged there" in found.line()


def test_a_stream_deleted_and_created_again_is_another_stream(nc: WalflowClient, names: TestNames) -> None:
    _fill(nc, names, ["m1", "m2"])
    now = time.monotonic()
    _, created = _look(nc, names, Acked(2, "m2"), _times([(2, "m2")], now))
    runtime.run(nc.jetstream().delete_stream(names.stream))
    assert _look(nc, names, Acked(2, "m2", created), _times([], now)) == (None, None)  # gone: nothing to compare
    _fill(nc, names, ["n1"])
    found, again = _look(nc, names, Acked(2, "m2", created), _times([(2, "m2")], now))
    assert found is None and again is not None and again != created
