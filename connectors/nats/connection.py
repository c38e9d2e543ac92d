"""Connecting to NATS with the options of Sequin's NATS sink, plus servers, creds, tokens and TLS.

Reconnects never give up (nats-py stops after 60 attempts by default), and nats-py's own
buffering while disconnected is off: it would flush buffered publishes ahead of the ones
walflow re-sends itself, reordering a row's changes. walflow owns every re-send.

What nats-py reports is sorted by :func:`sorted_as`, which looks the server's words up in
:data:`core.errors.NATS_SERVER`. An unreachable server is waited for (transient).
Credentials the server refuses at the first connect are a :class:`~core.errors.NatsAuthError`,
since retrying cannot fix them (nats-py itself would retry forever). A "Permissions Violation"
arrives only through ``error_cb``, while the request it refused just times out: it is
recorded on the client, and :func:`permission_error` turns the failure that follows into
a :class:`~core.errors.NatsPermissionError` naming what to grant.

TLS fails closed. A destination that asks for TLS (:attr:`config.schema.NatsDestination.uses_tls`)
never sends ``CONNECT`` over a connection that is not TLS (:class:`~connectors.nats.natspy.WalflowClient`),
and a first connect that cannot become TLS as configured (not started, a certificate not
verified, a failed handshake) is a :class:`~core.errors.NatsTlsError`, not an endless retry
(:func:`refused_at_connect`); once connected, a reconnect meeting one is logged and retried,
still sending nothing in clear.

Every lost connection, and every failed first connect, counts in ``walflow_reconnects_total``
(``component="nats"``), its cause the last error nats-py reported before it. With several
servers (a cluster) the log names the one lost and the one reconnected to, and
``walflow_nats_connected`` says which one each connection is on.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any

import nats
from nats.aio.client import RawCredentials

from config.schema import NatsDestination
from connectors.nats.natspy import TlsNotStarted, WalflowClient
from core.display import display_url
from core.errors import FatalError, NatsAuthError, NatsPermissionError, NatsTlsError, WalflowError, nats_error
from core.metrics import Metrics

log = logging.getLogger("walflow.nats")

_CREDS_TEMPLATE = (
    "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
    "-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
)


#: Seconds between the client's pings: a hung server is left after about three of them.
PING_INTERVAL = 5


class RateLimitedLog:
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
        # A server that hangs (SIGSTOP, a frozen VM) keeps its socket open: unanswered pings are
        # how the client finds out and moves to another server. nats-py's default (2 unanswered
        # pings 2 minutes apart) would keep a sink on a dead cluster node for 4 minutes.
        "ping_interval": PING_INTERVAL,
        "max_outstanding_pings": 2,
        "inbox_prefix": dest.inbox_prefix,
    }
    if dest.username is not None and dest.password is not None:
        options["user"] = dest.username
        options["password"] = dest.password.get_secret_value()
    if dest.token is not None:
        options["token"] = dest.token.get_secret_value()
    if dest.creds_file is not None:
        options["user_credentials"] = str(dest.creds_file)
    elif dest.jwt is not None:
        seed = dest.nkey_seed.get_secret_value() if dest.nkey_seed is not None else _seed_file(dest)
        options["user_credentials"] = RawCredentials(_CREDS_TEMPLATE.format(jwt=dest.jwt.get_secret_value(), seed=seed))
    elif dest.nkey_seed is not None:
        options["nkeys_seed_str"] = dest.nkey_seed.get_secret_value()
    elif dest.nkey_seed_file is not None:
        options["nkeys_seed"] = str(dest.nkey_seed_file)
    if dest.uses_tls:
        options["tls"] = tls_context(dest)
        options["tls_handshake_first"] = dest.tls_handshake_first
    return options


def _seed_file(dest: NatsDestination) -> str:
    assert dest.nkey_seed_file is not None, "the schema requires a seed with jwt"
    try:
        return dest.nkey_seed_file.read_text().strip()
    except OSError as exc:
        raise NatsAuthError(f"cannot read destination.nkey_seed_file {dest.nkey_seed_file}: {exc.strerror}") from None


def tls_context(dest: NatsDestination) -> ssl.SSLContext:
    """A client context that verifies the server (its certificate and host name) against the
    system's CAs or ``tls_ca_file``, with the client certificate if one is configured."""
    try:
        context = ssl.create_default_context(cafile=str(dest.tls_ca_file) if dest.tls_ca_file else None)
    except (ssl.SSLError, OSError) as exc:
        raise NatsTlsError(f"destination.tls_ca_file {dest.tls_ca_file} holds no CA certificate walflow can read "
                           f"({exc}): give the PEM file of the CA that signed the servers' certificates") from None
    if dest.tls_cert_file is not None:
        try:
            context.load_cert_chain(dest.tls_cert_file, dest.tls_key_file)
        except (ssl.SSLError, OSError) as exc:
            raise NatsTlsError(f"destination.tls_cert_file {dest.tls_cert_file} and tls_key_file {dest.tls_key_file} "
                               f"are not a certificate and its private key walflow can read ({exc}): give PEM files, "
                               "the key unencrypted") from None
    return context


def refused_at_connect(exc: BaseException, dest: NatsDestination, name: str, server: str) -> FatalError | None:
    """The fatal error for what nats-py reported during connection ``name``'s first connect to
    ``server`` (host:port) that retrying cannot fix: refused credentials, or TLS that did not
    come about as ``dest`` asks. None for the rest (an unreachable server is waited for)."""
    if isinstance(exc, TlsNotStarted):
        return NatsTlsError(str(exc))
    if isinstance(exc, ssl.SSLCertVerificationError):
        return NatsTlsError(
            f"NATS at {server} presented a certificate walflow does not trust ({exc.verify_message}): nothing was sent; "
            "set destination.tls_ca_file to the CA that signed it, and connect by a name the certificate is for "
            "(host, or the servers' URLs)"
        )
    if isinstance(exc, ssl.SSLError):
        return NatsTlsError(
            f"the TLS handshake with NATS at {server} failed ({exc.reason or exc}): nothing was sent; check that the "
            "server has TLS on this port, that a server that verifies clients gets a certificate it trusts "
            "(tls_cert_file, tls_key_file), and that tls_handshake_first matches its tls { handshake_first }"
        )
    if sorted_as(exc) is NatsAuthError:
        return NatsAuthError(f"NATS at {', '.join(dest.display_urls)} refused the credentials of sink connection "
                             f"'{name}' ({exc}): check {_credentials_hint(dest)} against the server's users or accounts")
    return None
def _disconnect_cause(exc: BaseException | None) -> str:
    """``walflow_reconnects_total``'s cause for a connection lost after nats-py reported ``exc``."""
    if isinstance(exc, nats.errors.UnexpectedEOF):
        return "eof"  # the server closed it (stopped, restarted)
    if isinstance(exc, OSError):
        return "network"
    return "disconnected"  # nats-py reports no error for unanswered pings or a protocol error


def _netloc(client: WalflowClient | None) -> str:
    """``nats://host:port`` of the server ``client`` is connected to ("" while it is not): never
    the credentials its URL may hold (it is a metric's label too)."""
    url = client.connected_url if client is not None else None
    return display_url(url.geturl()) if url is not None else ""


def sorted_as(exc: BaseException) -> type[WalflowError]:
    """The class :mod:`core.errors` gives what nats-py reported: the server's words
    (:func:`core.errors.nats_error`), of which nats-py's own ``AuthorizationError`` is one."""
    if isinstance(exc, nats.errors.AuthorizationError):
        return NatsAuthError  # nats-py's name for the server's "Authorization Violation"
    return nats_error(str(exc))


def _credentials_hint(dest: NatsDestination) -> str:
    if dest.creds_file is not None:
        return f"the credentials file {dest.creds_file}"
    if dest.jwt is not None:
        return "destination.jwt and its seed"
    if dest.nkey_seed is not None or dest.nkey_seed_file is not None:
        return "destination.nkey_seed" if dest.nkey_seed is not None else f"the seed in {dest.nkey_seed_file}"
    if dest.token is not None:
        return "destination.token"
    if dest.username is not None:
        return f"destination.username ('{dest.username}') and password"
    return "the credentials under the sink's destination (none are set; the server requires some)"


def permission_error(nc: WalflowClient, dest: NatsDestination, doing: str) -> NatsPermissionError | None:
    """The fatal error for a JetStream API request that failed after the server reported a
    permissions violation on this connection; None if it reported none."""
    violation = nc.permission_violation
    if violation is None:
        return None
    who = f"user '{dest.username}'" if dest.username is not None else "the sink's NATS user"
    return NatsPermissionError(
        f"NATS at {', '.join(dest.display_urls)} refused {doing} ({violation.removeprefix('nats: ')}): grant {who} "
        "that subject: docs/nats-permissions.conf lists each one walflow uses (its stream's and bucket's JetStream "
        f"API subjects, and subscribe on {dest.inbox_prefix}.>, its replies)"
    )


class _Refused(Exception):
    """Raised from ``error_cb`` to end nats-py's connect loop, which would retry refused credentials
    (or a TLS failure) forever; carries the fatal error to raise instead."""

    def __init__(self, error: FatalError) -> None:
        super().__init__(str(error))
        self.error = error


async def connect(dest: NatsDestination, name: str, metrics: Metrics | None = None) -> WalflowClient:
    """Connect, retrying with capped backoff until NATS answers: a pipeline waits for its sink.

    Raises :class:`NatsAuthError` if the server refuses the credentials, :class:`NatsTlsError`
    if TLS does not come about as configured. ``metrics``: the process's, which count
    reconnects (else nobody's)."""
    warn = RateLimitedLog()
    options = connect_options(dest, name)
    servers = ", ".join(dest.display_urls)
    connecting = True
    metrics = metrics or Metrics()
    reconnects, connected = metrics.reconnects, metrics.nats_connected
    several = len(dest.server_urls) > 1
    on = ""  # the server the client is (or was last) connected to
    lost_at = time.monotonic()
    last_error: Exception | None = None  # what nats-py reported last: the cause of a disconnect

    async def on_error(exc: Exception) -> None:
        nonlocal last_error
        last_error = exc
        kind = sorted_as(exc)
        refused = refused_at_connect(exc, dest, name, client.server_address if client is not None else servers)
        if refused is not None:
            if connecting:
                raise _Refused(refused)
            warn("refused", "%s; retrying", refused)  # a reconnect: the server (or what sits before it) may change
            return
        if kind is NatsPermissionError:
            if client is not None:
                client.permission_violation = str(exc)
            warn("permission", "NATS at %s: %s", servers, exc)
            return
        if several and isinstance(exc, nats.errors.UnexpectedEOF):
            return  # the server closed the connection: the disconnect's line names it
        if several:  # one server that fails is not all of them: nats-py tries the next
            warn("error", "NATS connection %s: a server failed (%s); trying the others of %s", name, exc, servers)
        else:
            warn("error", "cannot reach NATS at %s (%s); retrying", servers, exc)

    async def on_disconnect() -> None:
        nonlocal last_error, lost_at
        if client is not None and not client.is_closed:  # closing calls this too
            lost_at = time.monotonic()
            warn("disconnect", "NATS connection %s to %s lost (%s); reconnecting%s", name, on, last_error or "no error",
                 " to any of " + servers if several else "")
            reconnects.labels("nats", _disconnect_cause(last_error)).inc()
            connected.labels(name, on).set(0)
        last_error = None
        if client is not None:
            client.drop_pending()

    async def on_reconnect() -> None:
        nonlocal last_error, on
        last_error = None  # the failed attempts' errors are not the next disconnect's cause
        on = _netloc(client)
        connected.labels(name, on).set(1)
        log.info("NATS connection %s reconnected to %s after %.1fs", name, on, time.monotonic() - lost_at)

    client: WalflowClient | None = None
    delay = 0.5
    while True:
        client = WalflowClient()
        try:
            await client.connect(
                **options, error_cb=on_error, disconnected_cb=on_disconnect, reconnected_cb=on_reconnect
            )
            connecting = False
            on = _netloc(client)
            connected.labels(name, on).set(1)
            if several:
                log.info("NATS connection %s connected to %s (of %s)", name, on, servers)
            return client
        except (_Refused, TimeoutError, OSError, nats.errors.Error) as exc:
            refused = exc.error if isinstance(exc, _Refused) else refused_at_connect(exc, dest, name, client.server_address or servers)
            if refused is not None:
                client.abandon()
                raise refused from None
            warn("connect", "cannot reach NATS at %s (%s); retrying", servers, exc)
            reconnects.labels("nats", "unreachable").inc()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
