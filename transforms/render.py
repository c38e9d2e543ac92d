"""A sink partition's first job: the slot worker's compact items → messages to publish.

Runs in the sink partition's ``write_batch``, on the worker that owns the partition: after
Bytewax's exchange, so in a cluster the CPU-heavy part — converting values
(:mod:`transforms.convert`) and the envelope (:mod:`transforms.envelope`) — is spread over
every process, while the slot's process does only what must be serial
(``transforms/dispatch.py``). Items arrive in lists, in the order the slot's worker sent
them (``core/wire.py``): table descriptions, changes, forgotten versions.
"""

from __future__ import annotations

from config.schema import DatabaseConfig, SinkConfig
from core.events import Message, ReadOf, Table
from core.wire import DESCRIBE, Item, commit_time
from transforms.convert import convert_fields
from transforms.envelope import Envelope


class Render:
    """One sink partition's table versions, and its items → :class:`~core.events.Message` s."""

    def __init__(self, sink: SinkConfig, database: DatabaseConfig) -> None:
        self._envelope = Envelope(sink, database)
        #: uid → the table version it names, as described on this partition.
        self._tables: dict[int, Table] = {}

    def __call__(self, batches: list[list[Item]]) -> list[Message]:
        """The messages of ``batches`` (each a dispatch step's list for this partition), in order."""
        out: list[Message] = []
        envelope, tables = self._envelope, self._tables
        for items in batches:
            for item in items:
                head = item[0]
                if type(head) is int:
                    table = tables.get(head)
                    if table is None:
                        raise RuntimeError(f"a change names table version {head}, which was not described to this "
                                           "partition first: the items from the slot's worker arrived out of order")
                    _, action, new, old, old_is_key, lsn, idx, micros, xid, read, annotations = item  # type: ignore[misc]
                    out.append(envelope(convert_fields(action, table, new, old, old_is_key, lsn, idx,
                                                       commit_time(micros), xid,
                                                       None if read is None else ReadOf(*read), annotations)))
                elif head == DESCRIBE:
                    described: Table = item[1]  # type: ignore[assignment]
                    tables[described.uid] = described
                else:
                    tables.pop(item[1], None)  # type: ignore[arg-type]
        return out

    @property
    def versions(self) -> int:
        """How many table versions this partition holds (superseded ones are forgotten, and at most
        ``transforms.dispatch.MAX_VERSIONS``)."""
        return len(self._tables)
