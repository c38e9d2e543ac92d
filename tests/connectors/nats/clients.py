"""A NATS client for the sink's tests, connected as the sink connects, and messages as render makes them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from config.schema import NatsDestination
from connectors.nats.connection import connect
from connectors.nats.natspy import WalflowClient
from core.message import Message
from core.runtime import Runtime
from core.subjects import subject as default_subject
from tests.harness import Nats


@contextmanager
def nats_client(runtime: Runtime, server: Nats, name: str) -> Iterator[WalflowClient]:
    """walflow's client connected to ``server`` (with its login), closed afterwards."""
    dest = NatsDestination.model_validate({"type": "nats", **server.destination})
    client = runtime.run(connect(dest, name=name))
    try:
        yield client
    finally:
        runtime.run(client.close())


def message(prefix: str, table: str, action: str, payload: bytes, msg_id: str, commit_ts: float = 0.0, *,
            subject: bytes | None = None, headers: bytes = b"", database: str = "app", schema: str = "public") -> Message:
    """A message as render makes one: on ``<prefix>.<database>.<schema>.<table>.<action>`` unless
    ``subject`` routes it elsewhere, counted under ``(schema.table, action)``."""
    default = default_subject(prefix, database, schema, table, action).encode()
    return Message(subject or default, payload, msg_id, (f"{schema}.{table}", action), commit_ts, headers)
