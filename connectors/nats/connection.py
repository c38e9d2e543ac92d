"""Connecting to NATS with the options of Sequin's NATS sink, plus servers, creds and a CA.

Reconnects never give up (nats-py stops after 60 attempts by default), and nats-py's own
buffering while disconnected is off: it would flush buffered publishes ahead of the ones
walflow re-sends itself, reordering a row's changes. walflow owns every re-send.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client, RawCredentials
from nats.aio.subscription import Subscription

from config.schema import NatsDestination

log = logging.getLogger("walflow.nats")

_CREDS_TEMPLATE = (
    "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
    "-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
)


#: Called with a message's subject, payload and raw header block (None without headers).
DirectHandler = Callable[[bytes, bytes, bytes | None], None]


class WalflowClient(Client):
    """nats-py's client, plus a raw path for the publishing hot loop.

    Per message, nats-py's ``publish`` checks the subject, builds the header block and may
    ask its flusher to run; each delivered message becomes a ``Msg`` on a queue, handed to
    a task. For JetStream acks, at tens of thousands a second, that is most of walflow's
    CPU. :meth:`send_raw` queues ready-made protocol commands in nats-py's own outgoing
    queue (so they keep their place behind whatever nats-py queued before), and a
    subscription made with :meth:`subscribe_direct` has its messages handed to a plain
    function, straight from the protocol parser. Everything else — connecting, auth, TLS,
    pings, reconnects and resubscribing — stays nats-py's.
    """

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, tuple[Subscription, DirectHandler]] = {}

    async def send_raw(self, commands: bytes) -> bool:
        """Queue protocol ``commands`` for the socket; False (nothing queued) while disconnected:
        nats-py would otherwise send them after a reconnect, ahead of walflow's own re-sends."""
        if not self.is_connected:
            return False
        self._pending.append(commands)
        self._pending_data_size += len(commands)
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()
        return True

    async def subscribe_direct(self, subject: str, handler: DirectHandler) -> int:
        """Subscribe ``handler`` to ``subject``; returns the subscription id."""
        sub = await self.subscribe(subject)
        self._direct[sub._id] = (sub, handler)
        return sub._id

    async def unsubscribe_direct(self, sid: int) -> None:
        entry = self._direct.pop(sid, None)
        if entry is not None and not self.is_closed:
            await entry[0].unsubscribe()

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        entry = self._direct.get(sid)
        if entry is None:
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
        else:
            try:
                entry[1](subject, data, headers)
            except Exception:  # an escape would end nats-py's read loop, silently
                log.exception("handling a message on %s failed", subject.decode(errors="replace"))


class _RateLimitedLog:
    """nats-py reports an outage about twice a second: say it once every ``every`` seconds."""

    def __init__(self, every: float = 30.0) -> None:
        self.every = every
        self._last: dict[str, float] = {}

    def __call__(self, key: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -self.every) >= self.every:
            self._last[key] = now
            log.warning(message, *args)


def connect_options(dest: NatsDestination, name: str) -> dict[str, Any]:
    """nats-py ``connect`` keyword arguments for ``dest`` (secrets included: never log them)."""
    options: dict[str, Any] = {
        "servers": dest.server_urls,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 1,
        "pending_size": 0,
        "connect_timeout": 5,
    }
    if dest.username is not None and dest.password is not None:
        options["user"] = dest.username
        options["password"] = dest.password.get_secret_value()
    if dest.creds_file is not None:
        options["user_credentials"] = str(dest.creds_file)
    elif dest.jwt is not None and dest.nkey_seed is not None:
        creds = _CREDS_TEMPLATE.format(jwt=dest.jwt.get_secret_value(), seed=dest.nkey_seed.get_secret_value())
        options["user_credentials"] = RawCredentials(creds)
    elif dest.nkey_seed is not None:
        options["nkeys_seed_str"] = dest.nkey_seed.get_secret_value()
    if dest.tls or dest.tls_ca_file is not None or any(url.startswith("tls://") for url in dest.server_urls):
        options["tls"] = ssl.create_default_context(cafile=str(dest.tls_ca_file) if dest.tls_ca_file else None)
    return options


async def connect(dest: NatsDestination, name: str) -> WalflowClient:
    """Connect, retrying with capped backoff until NATS answers: a pipeline waits for its sink."""
    warn = _RateLimitedLog()
    options = connect_options(dest, name)

    async def on_error(exc: Exception) -> None:
        warn("error", "cannot reach NATS at %s (%s); retrying", ", ".join(dest.server_urls), exc)

    async def on_disconnect() -> None:
        warn("disconnect", "NATS disconnected (%s); reconnecting", name)
        # nats-py would send what it still queued once it reconnects, ahead of walflow's own
        # in-order re-sends of what was lost: drop it (those messages time out, are re-sent).
        if client is not None:
            client._pending = []
            client._pending_data_size = 0

    async def on_reconnect() -> None:
        log.info("NATS reconnected (%s)", name)

    client: WalflowClient | None = None
    delay = 0.5
    while True:
        try:
            client = WalflowClient()
            await client.connect(
                **options, error_cb=on_error, disconnected_cb=on_disconnect, reconnected_cb=on_reconnect
            )
            return client
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            if isinstance(exc, nats.errors.AuthorizationError):
                raise
            warn("connect", "cannot reach NATS at %s (%s); retrying", ", ".join(dest.server_urls), exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
