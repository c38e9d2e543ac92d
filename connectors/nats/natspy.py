"""Every use of a nats-py private name, fenced in one module and checked when it is imported.

walflow's publishing hot path bypasses three of nats-py's per-message layers (see
:class:`WalflowClient`), which needs these private names:

- ``Client._pending``, ``Client._pending_data_size``: its outgoing queue, which
  :meth:`WalflowClient.send_raw` appends ready-made commands to and :func:`drop_pending`
  empties on a disconnect;
- ``Client._flush_queue``, ``Client._flush_pending()``: its flusher, woken by ``send_raw``;
- ``Client._process_msg(sid, subject, reply, data, headers)``: what its protocol parser
  calls per delivered message, overridden to hand direct subscriptions' messages to a
  plain function;
- ``Subscription._id``: a subscription's id, as the parser names it;
- ``Client._ps``, its protocol parser, replaced by a :class:`DirectParser`: a subclass of
  ``nats.protocol.parser.Parser`` that relies on its ``parse(data)`` coroutine, its
  ``buf`` (bytes received and not yet parsed) and ``state`` (``AWAITING_CONTROL_LINE``
  between frames);
- ``Client._connect_command()``, which builds the ``CONNECT`` line (the credentials), checked
  first by :class:`WalflowClient`: with ``Client.options["tls"]`` set, the connection's
  transport (``Client._transport``, a ``TcpTransport`` whose ``_io_writer`` is the socket's
  stream) must be TLS by then; ``Client._current_server`` names the server in the refusal.

nats-py is pinned to the minor version tested (:data:`PIN`, ``pyproject.toml``). Should
another version be installed anyway, importing this module fails at once, naming the
version and the pin (:class:`NatsPyIncompatible`), rather than the pipeline failing later
in the middle of a publish; ``tests/connectors/nats/test_natspy_contract.py`` checks the
same list, and exercises the hooks against a real server.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
from typing import Final

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.aio.transport import TcpTransport
from nats.protocol import parser as natspy_parser
from nats.protocol.parser import Parser

from connectors.nats.frames import DirectHandler, direct_frames

log = logging.getLogger("walflow.nats")

#: The nats-py versions the hooks were written and tested against (as ``pyproject.toml`` pins it).
PIN: Final = "nats-py[nkeys]>=2.16,<2.17"

#: Instance attributes of ``Client`` that the hooks read or write.
CLIENT_ATTRIBUTES: Final = ("_pending", "_pending_data_size", "_flush_queue", "_ps", "_transport", "_current_server",
                             "options")
#: Methods of ``Client`` the hooks call or override, with the parameters they rely on.
CLIENT_METHODS: Final[dict[str, tuple[str, ...]]] = {
    "_flush_pending": (),  # called without arguments
    "_process_msg": ("sid", "subject", "reply", "data", "headers"),  # called positionally by the parser
}
#: Plain (not coroutine) methods of ``Client`` overridden, all called without arguments.
CLIENT_PLAIN_METHODS: Final = ("_connect_command",)
#: Instance attributes of ``TcpTransport`` the hooks read.
TRANSPORT_ATTRIBUTES: Final = ("_io_writer",)
#: Instance attributes of ``Subscription`` the hooks read.
SUBSCRIPTION_ATTRIBUTES: Final = ("_id",)
#: Instance attributes of ``Parser`` :class:`DirectParser` reads or writes.
PARSER_ATTRIBUTES: Final = ("buf", "state")


class NatsPyIncompatible(ImportError):
    """The installed nats-py lacks an internal walflow hooks: install the pinned version."""


def installed_version() -> str:
    try:
        return importlib.metadata.version("nats-py")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


def contract_problems(client_cls: type[Client] = Client, subscription_cls: type[Subscription] = Subscription) -> list[str]:
    """What of the hooked internals ``client_cls`` / ``subscription_cls`` do not have as expected."""
    problems: list[str] = []
    try:
        client = client_cls()
        attributes = vars(client)
    except Exception as exc:  # noqa: BLE001 - a changed constructor is one more problem to name
        return [f"Client() failed: {exc!r}"]
    problems += [f"Client.{name} (attribute)" for name in CLIENT_ATTRIBUTES if name not in attributes]
    parser = attributes.get("_ps")
    if "_ps" in attributes and not isinstance(parser, Parser):
        problems.append("Client._ps (a nats.protocol.parser.Parser)")
    problems += [f"Parser.{name} (attribute)" for name in PARSER_ATTRIBUTES if name not in vars(parser or Parser())]
    if not isinstance(getattr(natspy_parser, "AWAITING_CONTROL_LINE", None), int):
        problems.append("nats.protocol.parser.AWAITING_CONTROL_LINE (a state)")
    if not inspect.iscoroutinefunction(getattr(Parser, "parse", None)):
        problems.append("Parser.parse() (coroutine method)")
    for name, expected in CLIENT_METHODS.items():
        method = getattr(client_cls, name, None)
        if not callable(method) or not inspect.iscoroutinefunction(method):
            problems.append(f"Client.{name}() (coroutine method)")
            continue
        params = list(inspect.signature(method).parameters.values())[1:]  # without self
        names = tuple(param.name for param in params[: len(expected)])
        rest = params[len(expected) :]
        if names != expected or any(param.default is inspect.Parameter.empty for param in rest):
            got = ", ".join(param.name for param in params)
            problems.append(f"Client.{name}({', '.join(expected)}) (has ({got}))")
    for name in CLIENT_PLAIN_METHODS:
        method = getattr(client_cls, name, None)
        if not callable(method) or inspect.iscoroutinefunction(method) or len(inspect.signature(method).parameters) != 1:
            problems.append(f"Client.{name}() (plain method without arguments)")
    transport = vars(TcpTransport())  # type: ignore[no-untyped-call]
    problems += [f"TcpTransport.{name} (attribute)" for name in TRANSPORT_ATTRIBUTES if name not in transport]
    try:
        sub = subscription_cls(client, 7, "walflow.contract")
        sub_attributes = vars(sub)
    except Exception as exc:  # noqa: BLE001
        return [*problems, f"Subscription(conn, id, subject) failed: {exc!r}"]
    for name in SUBSCRIPTION_ATTRIBUTES:
        if name not in sub_attributes:
            problems.append(f"Subscription.{name} (attribute)")
    if sub_attributes.get("_id") != 7:
        problems.append("Subscription._id (the subscription id)")
    return list(dict.fromkeys(problems))


def check() -> None:
    """Raise :class:`NatsPyIncompatible` if the installed nats-py lacks what the hooks use."""
    problems = contract_problems()
    if problems:
        raise NatsPyIncompatible(
            f"walflow: nats-py {installed_version()} is installed, but walflow's publishing path hooks nats-py "
            f"internals it does not have as expected: {'; '.join(problems)}. Install the version walflow "
            f"pins: pip install '{PIN}' (connectors/nats/natspy.py)"
        )


check()


class TlsNotStarted(nats.errors.Error):
    """A connection walflow gave a TLS context to is not TLS when its ``CONNECT`` is due: nothing
    was sent, credentials least of all. A ``nats.errors.Error``, so nats-py's connect loop hands
    it to ``error_cb`` (which ends a first connect: :mod:`connectors.nats.connection`)."""


class WalflowClient(Client):
    """nats-py's client, plus a raw path for the publishing hot loop.

    Per message, nats-py's ``publish`` checks the subject, builds the header block and may
    ask its flusher to run; each delivered message becomes a ``Msg`` on a queue, handed to
    a task. For JetStream acks, at tens of thousands a second, that is most of walflow's
    CPU. :meth:`send_raw` queues ready-made protocol commands in nats-py's own outgoing
    queue (so they keep their place behind whatever nats-py queued before), and a
    subscription made with :meth:`subscribe_direct` has its messages handed to a plain
    function, straight from the protocol parser — for a plain ``MSG`` frame (an ack), before
    nats-py's parser sees it (:class:`DirectParser`). Everything else — connecting, auth, TLS,
    pings, reconnects and resubscribing — stays nats-py's, except that a connection given a TLS
    context never sends ``CONNECT`` unless it is TLS by then (:meth:`_connect_command`).
    """

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, tuple[Subscription, DirectHandler]] = {}
        self._ps = DirectParser(self, self._direct)
        #: The last "Permissions Violation" the server reported (nats-py reports it only
        #: through ``error_cb``; the request it refused then times out).
        self.permission_violation: str | None = None

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

    @property
    def server_address(self) -> str:
        """``host:port`` of the server this client is connected or connecting to ("" before any)."""
        server = self._current_server
        return f"{server.uri.hostname}:{server.uri.port}" if server is not None else ""

    def abandon(self) -> None:
        """Close the socket of a connection attempt refused for good, without waiting: nats-py's
        ``close`` waits for the socket's stream to report it closed, which never happens after a
        failed TLS handshake (asyncio closed the socket under the TLS layer). Before a first
        connect succeeds nats-py has started no task: closing the socket is all there is."""
        if self._transport is not None:
            self._transport.close()  # type: ignore[no-untyped-call]

    def _connect_command(self) -> bytes:
        """nats-py upgrades to TLS only when the server's INFO says ``tls_required`` (or with
        ``tls_handshake_first``): whoever sits in between and drops the flag would receive
        ``CONNECT``, the credentials in it, in clear. With a TLS context, refuse unless the
        socket really is TLS, and close it: nats-py would leave it open to whoever answered
        (a reconnect opens a new one, and forgets the old)."""
        if "tls" in self.options and not self._on_tls():
            self.abandon()
            raise TlsNotStarted(
                f"NATS at {self.server_address} did not start TLS although the sink's destination asks for it: "
                "walflow refuses to send it anything, its credentials least of all; a proxy in between may be "
                "stripping TLS (the server's INFO did not ask for it), or the server has no tls block. Give the "
                "server TLS, or set tls_handshake_first: true with a server that has tls { handshake_first: true }, "
                "which makes stripping impossible"
            )
        return super()._connect_command()

    def _on_tls(self) -> bool:
        writer = getattr(self._transport, "_io_writer", None)  # a WebSocket transport has none: not TLS to us
        return writer is not None and writer.get_extra_info("ssl_object") is not None

    def drop_pending(self) -> None:
        """Forget what nats-py still queued for the socket. On a disconnect: it would send it
        once it reconnects, ahead of walflow's own in-order re-sends of what was lost (those
        messages time out and are re-sent)."""
        self._pending = []
        self._pending_data_size = 0

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        entry = self._direct.get(sid)
        if entry is None:
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
        else:
            try:
                entry[1](subject, data, headers)
            except Exception:  # an escape would end nats-py's read loop, silently
                log.exception("handling a message on %s failed", subject.decode(errors="replace"))


_AWAITING_CONTROL_LINE: Final[int] = natspy_parser.AWAITING_CONTROL_LINE


class DirectParser(Parser):
    """nats-py's protocol parser, with a short way for the ``MSG`` frames of direct subscriptions.

    Per frame, nats-py's parser matches a regex, fills a dict, deletes the frame from the
    front of its buffer (moving the rest: quadratic in the frames of one read) and awaits a
    coroutine. JetStream acks are nearly all of walflow's incoming frames, so while the
    frames are ``MSG <subject> <sid> <size>`` of a direct subscription, they are read here
    from the bytes as received, by offset, and handed to the handler at once
    (:func:`connectors.nats.frames.direct_frames`, compiled with the hot path). At the first
    frame that is anything else (headers, a reply subject, another subscription's, PING,
    INFO, -ERR, a control line not received whole), everything from there goes to nats-py's
    parser, in order; a direct frame whose payload is not received whole waits in ``buf``
    for the next read, between frames as far as nats-py's state is concerned.
    """

    def __init__(self, nc: Client, direct: dict[int, tuple[Subscription, DirectHandler]]) -> None:
        super().__init__(nc)
        self._direct = direct

    async def parse(self, data: bytes = b"") -> None:
        if self.state != _AWAITING_CONTROL_LINE:  # in the middle of a frame nats-py began
            await super().parse(data)
            return
        buf = self.buf
        if buf:
            buf.extend(data)
            data = bytes(buf)
            buf.clear()
        pos, waiting = direct_frames(data, self._direct)
        if waiting:
            buf.extend(data[pos:])
        elif pos < len(data):
            await super().parse(data[pos:] if pos else data)
