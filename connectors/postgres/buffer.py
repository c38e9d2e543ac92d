"""The hand-over between the reader thread and the Bytewax partition, bounded in bytes.

The reader puts decoded changes and position markers in; the partition takes them out in
``next_batch``. When the buffered WAL bytes reach the bound, the reader stops reading the
socket (Postgres then holds the rest) but keeps the connection alive; taking items out
wakes it. Position markers (an ``int`` LSN) travel in order with the changes, so the
partition's position only moves once everything before it has been handed on.

The reader hands over what it decoded from one burst of messages at once
(:meth:`ChangeBuffer.put_many`): one lock per burst instead of one per change.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from connectors.postgres.decoder import Item


class ChangeBuffer:
    """A FIFO of changes and LSN markers whose size is counted in WAL bytes."""

    def __init__(self, max_bytes: int, on_room: Callable[[], None]) -> None:
        self.max_bytes = max_bytes
        self._on_room = on_room
        # Items and their sizes (0 for a marker) side by side: no tuple per change, which
        # would cost its allocation and its share of the garbage collector's work.
        self._items: deque[Item] = deque()
        self._sizes: deque[int] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self.high_water = 0  # the most bytes ever held: what tests and metrics look at

    @property
    def full(self) -> bool:
        return self._bytes >= self.max_bytes

    @property
    def size(self) -> int:
        return self._bytes

    @property
    def room(self) -> int:
        """Bytes that may still be put before the buffer is full (only grows until the next put)."""
        return self.max_bytes - self._bytes

    def put_many(self, items: list[Item], sizes: list[int], size: int) -> None:
        """Append changes and LSN markers in order, with their sizes (0 for a marker) and the
        sizes' total: what one burst of the reader decoded, under one lock.

        A leading marker collapses into a marker that ends the buffer; the caller collapses
        consecutive markers within ``items``.
        """
        if not items:
            return
        with self._lock:
            queue = self._items
            if queue and type(items[0]) is int and type(queue[-1]) is int:
                queue[-1] = items[0]
                queue.extend(items[1:])
                self._sizes.extend(sizes[1:])
            else:
                queue.extend(items)
                self._sizes.extend(sizes)
            self._bytes += size
            self.high_water = max(self.high_water, self._bytes)

    def take(self, max_items: int, finish_within: int = 0) -> tuple[list[Item], int]:
        """Up to ``max_items`` items, oldest first, and their size; wakes the reader if it
        was waiting for room. If that stops inside a transaction whose end is already here,
        up to ``finish_within`` more items are taken to reach it: an epoch that ends between
        transactions can be confirmed to Postgres, one that ends inside one cannot."""
        with self._lock:
            was_full = self._bytes >= self.max_bytes
            items, pop_item, pop_size = self._items, self._items.popleft, self._sizes.popleft
            count = min(max_items, len(items))
            out = [pop_item() for _ in range(count)]
            taken = sum([pop_size() for _ in range(count)])
            limit = max_items + finish_within
            while items and out and len(out) < limit and type(out[-1]) is not int:
                out.append(pop_item())
                taken += pop_size()
            self._bytes -= taken
            has_room = self._bytes < self.max_bytes
        if was_full and has_room:
            self._on_room()
        return out, taken
