"""The hand-over between the reader thread and the Bytewax partition, bounded in bytes.

The reader puts decoded changes and position markers in; the partition takes them out in
``next_batch``. When the buffered WAL bytes reach the bound, the reader stops reading the
socket (Postgres then holds the rest) but keeps the connection alive; taking items out
wakes it. Position markers (an ``int`` LSN) travel in order with the changes, so the
partition's position only moves once everything before it has been handed on.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from connectors.postgres.changes import Change

Item = Change | int


class ChangeBuffer:
    """A FIFO of changes and LSN markers whose size is counted in WAL bytes."""

    def __init__(self, max_bytes: int, on_room: Callable[[], None]) -> None:
        self.max_bytes = max_bytes
        self._on_room = on_room
        self._items: deque[tuple[Item, int]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self.high_water = 0  # the most bytes ever held: what tests and metrics look at

    @property
    def full(self) -> bool:
        return self._bytes >= self.max_bytes

    @property
    def size(self) -> int:
        return self._bytes

    def put(self, change: Change, size: int) -> None:
        with self._lock:
            self._items.append((change, size))
            self._bytes += size
            self.high_water = max(self.high_water, self._bytes)

    def mark(self, lsn: int) -> None:
        """Everything put so far lies before ``lsn``; consecutive markers collapse into one."""
        with self._lock:
            if self._items and type(self._items[-1][0]) is int:
                self._items[-1] = (lsn, 0)
            else:
                self._items.append((lsn, 0))

    def take(self, max_items: int, finish_within: int = 0) -> tuple[list[Item], int]:
        """Up to ``max_items`` items, oldest first, and their size; wakes the reader if it
        was waiting for room. If that stops inside a transaction whose end is already here,
        up to ``finish_within`` more items are taken to reach it: an epoch that ends between
        transactions can be confirmed to Postgres, one that ends inside one cannot."""
        with self._lock:
            was_full = self._bytes >= self.max_bytes
            out: list[Item] = []
            taken = 0
            limit = max_items + finish_within
            while self._items and (len(out) < max_items or (len(out) < limit and type(out[-1]) is not int)):
                item, size = self._items.popleft()
                taken += size
                out.append(item)
            self._bytes -= taken
            has_room = self._bytes < self.max_bytes
        if was_full and has_room:
            self._on_room()
        return out, taken
