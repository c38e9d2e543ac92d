"""The buffer between the reader thread and the partition: bounded in bytes, markers in order.

A burst of staged items (``put_many``) must behave exactly like the same items put one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from connectors.postgres.buffer import ChangeBuffer
from connectors.postgres.decoder import Item
from connectors.postgres.protocol import PG_EPOCH
from core.events import RawChange, Table

_TABLE = Table("s", "t", ("id",), ("id",), ("id",), (int,))


def _change(n: int) -> RawChange:
    return RawChange("insert", _TABLE, (str(n).encode(),), None, False, n, 0, PG_EPOCH, n)


@dataclass
class ModelBuffer:
    """The buffer as it was: one (item, size) per put or mark, markers collapsing."""

    max_bytes: int
    items: list[tuple[Item, int]] = field(default_factory=list)
    bytes: int = 0
    high_water: int = 0
    wakeups: int = 0

    def put(self, item: Item, size: int) -> None:
        if type(item) is int and self.items and type(self.items[-1][0]) is int:
            self.items[-1] = (item, 0)
        else:
            self.items.append((item, size))
        self.bytes += size
        self.high_water = max(self.high_water, self.bytes)

    def take(self, max_items: int, finish_within: int) -> tuple[list[Item], int]:
        was_full = self.bytes >= self.max_bytes
        out: list[Item] = []
        taken = 0
        while self.items and (len(out) < max_items or (len(out) < max_items + finish_within
                                                        and type(out[-1]) is not int)):
            item, size = self.items.pop(0)
            out.append(item)
            taken += size
        self.bytes -= taken
        if was_full and self.bytes < self.max_bytes:
            self.wakeups += 1
        return out, taken


operations = st.lists(
    st.one_of(
        st.tuples(st.just("burst"), st.lists(st.one_of(st.none(), st.integers(1, 40)), max_size=8)),
        st.tuples(st.just("mark"), st.just([])),
        st.tuples(st.just("put"), st.just([st.integers(1, 40)])),
        st.tuples(st.just("take"), st.lists(st.integers(0, 6), min_size=2, max_size=2)),
    ),
    max_size=40,
)


@given(st.sampled_from([10, 60, 1000]), operations)
def test_buffer_bursts_behave_like_single_puts(max_bytes: int, ops: list[tuple[str, list[Any]]]) -> None:
    wakeups = [0]
    buffer = ChangeBuffer(max_bytes, on_room=lambda: wakeups.__setitem__(0, wakeups[0] + 1))
    model = ModelBuffer(max_bytes)
    lsn = count = 0
    for op, args in ops:
        if op == "burst":  # None: a marker, n: a change of n bytes; staged as the reader stages them
            items: list[Item] = []
            sizes: list[int] = []
            for size in args:
                if size is None:
                    lsn += 1
                    model.put(lsn, 0)
                    if items and type(items[-1]) is int:
                        items[-1] = lsn
                    else:
                        items.append(lsn)
                        sizes.append(0)
                else:
                    count += 1
                    model.put(_change(count), size)
                    items.append(_change(count))
                    sizes.append(size)
            buffer.put_many(items, sizes, sum(sizes))
        elif op == "mark":
            lsn += 1
            model.put(lsn, 0)
            buffer.put_many([lsn], [0], 0)
        elif op == "put":
            count += 1
            model.put(_change(count), 7)
            buffer.put_many([_change(count)], [7], 7)
        else:
            max_items, finish_within = args
            if max_items:
                assert buffer.take(max_items, finish_within) == model.take(max_items, finish_within)
        assert (buffer.size, buffer.full, buffer.high_water, wakeups[0]) == (
            model.bytes, model.bytes >= max_bytes, model.high_water, model.wakeups)
    assert buffer.take(10**6) == model.take(10**6, 0)
