"""What the NATS sink publishes: a ready-made message, built before it crosses workers.

Compact on purpose: items that cross processes are pickled, so a message carries only its
subject, its JSON payload and its ``Nats-Msg-Id``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NatsMessage:
    subject: str
    payload: bytes
    #: ``Nats-Msg-Id``: the change's idempotency key, stable across replays.
    msg_id: str
