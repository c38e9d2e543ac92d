"""What the NATS sink publishes: a ready-made message, built before it crosses workers.

Compact on purpose: items that cross processes are pickled, so a message carries only its
subject, its JSON payload and its ``Nats-Msg-Id``. A ``NamedTuple``: immutable like a
frozen dataclass, but built in a third of the time, once per change.
"""

from __future__ import annotations

from typing import NamedTuple


class NatsMessage(NamedTuple):
    subject: str
    payload: bytes
    #: ``Nats-Msg-Id``: the change's idempotency key, stable across replays.
    msg_id: str
