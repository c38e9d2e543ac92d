"""A NATS client for the sink's tests, connected as the sink connects."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from config.schema import NatsDestination
from connectors.nats.connection import connect
from connectors.nats.natspy import WalflowClient
from core.runtime import Runtime


@contextmanager
def nats_client(runtime: Runtime, url: str, name: str) -> Iterator[WalflowClient]:
    """walflow's client connected to the server at ``url`` (``nats://host:port``), closed afterwards."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    dest = NatsDestination.model_validate({"type": "nats", "host": host, "port": int(port)})
    client = runtime.run(connect(dest, name=name))
    try:
        yield client
    finally:
        runtime.run(client.close())
