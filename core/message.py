"""What a sink publishes: :class:`Message`, one per change, built on the sink partition's hot path.

Its own module so that it is compiled with the hot path (``core/compiled.py``): a native class,
which the compiled envelope and render build without a Python ``__init__`` frame and read
by C attribute access. The changes it is made from are in :mod:`core.events`.
Why a class with ``__slots__`` and not a frozen dataclass or a tuple: ``docs/design.md``,
*core/events.py*.
"""

from __future__ import annotations

from typing import Final, final

#: What :meth:`Message.__eq__` compares.
_PUBLISHED: Final = ("commit_ts", "headers", "labels", "msg_id", "payload", "subject")


@final
class Message:
    """What a sink publishes: its subject, payload, ``Nats-Msg-Id`` and further header lines,
    and what its acknowledgement is counted under (as Bytewax's ``KafkaSinkMessage`` carries its
    topic). Render builds every one (the envelope, shaping, dead letters) and nothing changes
    one after: each attribute is ``Final`` but :attr:`row`, which render sets once. A class with
    ``__slots__``, built positionally on the hot path (why not a frozen dataclass:
    ``docs/design.md``, *core/events.py*)."""

    __slots__ = ("commit_ts", "headers", "labels", "msg_id", "payload", "row", "subject")

    def __init__(self, subject: bytes, payload: bytes, msg_id: str, labels: tuple[str, str], commit_ts: float = 0.0,
                 headers: bytes = b"") -> None:
        #: Where it is published: ``<prefix>.<database>.<schema>.<table>.<action>`` (:func:`core.subjects.subject`)
        #: unless routing gave it another.
        self.subject: Final = subject
        self.payload: Final = payload
        #: The idempotency id (``Nats-Msg-Id``), stable across replays (:mod:`core.ids`).
        self.msg_id: Final = msg_id
        #: ``(schema.table, action)`` of its change: ``walflow_changes_published_total``'s labels,
        #: one tuple per table and action (its acknowledgement is counted by it).
        self.labels: Final = labels
        #: The commit's time (Unix seconds; 0.0 for a backfill's read or a dead letter): where the
        #: commit → acknowledgement latency starts (``walflow_commit_to_ack_seconds``).
        self.commit_ts: Final = commit_ts
        #: Header lines after ``Nats-Msg-Id``, each ``Name: value\r\n``, already validated.
        self.headers: Final = headers
        #: The row it is a change of, as the slot's worker named it (a hash of its group key; 0:
        #: none): the publisher never has two messages of one row in flight at once, so none can
        #: be stored ahead of an earlier one JetStream dropped (``connectors/nats/publisher.py``).
        #: :data:`BARRIER`: stored after everything before it and before anything after it.
        self.row = 0

    def __eq__(self, other: object) -> bool:
        """Equal by what is published and counted (not by :attr:`row`, the publisher's concern)."""
        return type(other) is Message and all(getattr(self, name) == getattr(other, name) for name in _PUBLISHED)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and not meant as a key

    def __repr__(self) -> str:
        return (f"Message({self.subject!r}, {len(self.payload)} bytes, {self.msg_id!r}, {self.labels!r}, "
                f"{self.commit_ts!r}, {self.headers!r})")
