"""NATS TLS that fails closed, and the ways to log in, against real servers with a CA made here.

A destination that asks for TLS never sends ``CONNECT`` (its credentials) over a connection
that is not TLS: not to a proxy that strips ``tls_required`` from the server's INFO, not to a
plaintext server. A certificate walflow does not trust (another CA, another host name) and a
handshake that fails stop a first connect with one line instead of endless retries. Verified
TLS (also ``tls_handshake_first``), client certificates, tokens and an inbox prefix of
walflow's own work, end to end where it matters (the pipeline publishing over TLS).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import nkeys  # nats-py's nkeys extra
import pytest
import trustme

from cli.probe import ProbeError, close_nats, open_nats
from config.schema import NatsDestination
from connectors.nats.connection import connect, connect_options
from connectors.nats.natspy import WalflowClient
from core.errors import FatalError, NatsAuthError, NatsTlsError
from embedded import NatsServer
from tests.harness import Database, Nats, TestNames
from tests.pipeline import fatal_line, run_to_exit, run_workload, write_config

pytestmark = pytest.mark.servers  # NATS servers of its own, with TLS

PASSWORD = "canary-password-7f3a"
TOKEN = "canary-token-91c2"
#: A user whose replies may arrive only under an inbox prefix of its own.
BOXED_INBOX = "walflow_inbox"
USERS = (
    "authorization {\n  users = [\n"
    f"    {{user: walflow, password: {json.dumps(PASSWORD)}}}\n"
    f"    {{user: boxed, password: {json.dumps(PASSWORD)}, permissions: {{subscribe: {{allow: [\"{BOXED_INBOX}.>\"]}}}}}}\n"
    "  ]\n}"
)


@dataclass(frozen=True)
class Pki:
    ca: Path  # what clients trust
    other_ca: Path  # a CA that signed nothing of the servers'
    cert: Path  # the servers' certificate chain: for "localhost" only (127.0.0.1 is a wrong name)
    key: Path
    client_cert: Path  # a client certificate signed by ``ca``
    client_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    files = Pki(*(directory / name for name in ("ca.pem", "other-ca.pem", "server.pem", "server.key",
                                                 "client.pem", "client.key")))
    ca.cert_pem.write_to_path(str(files.ca))
    other.cert_pem.write_to_path(str(files.other_ca))
    for issued, chain, key in ((ca.issue_cert("localhost"), files.cert, files.key),
                               (ca.issue_cert("walflow@example.com"), files.client_cert, files.client_key)):
        for i, pem in enumerate(issued.cert_chain_pems):
            pem.write_to_path(str(chain), append=i > 0)
        issued.private_key_pem.write_to_path(str(key))
    return files


@pytest.fixture(scope="module")
def tls_nats(pki: Pki) -> Iterator[NatsServer]:
    """TLS required (nats-server's default with a tls block), users with passwords."""
    with NatsServer(extra_config=USERS, tls=(pki.cert, pki.key)) as server:
        yield server


@pytest.fixture(scope="module")
def first_nats(pki: Pki) -> Iterator[NatsServer]:
    """TLS from the first byte (``handshake_first``), a token to log in."""
    with NatsServer(extra_config=f"authorization {{ token: {json.dumps(TOKEN)} }}", tls=(pki.cert, pki.key),
                    tls_config="handshake_first: true") as server:
        yield server


@pytest.fixture(scope="module")
def mtls_nats(pki: Pki) -> Iterator[NatsServer]:
    """TLS that verifies clients: only a certificate signed by the test's CA gets in (and it logs in
    with the server's own login, :attr:`NatsServer.login`, as any client of an embedded NATS)."""
    with NatsServer(tls=(pki.cert, pki.key), tls_config=f"verify: true\n  ca_file: {json.dumps(str(pki.ca))}") as server:
        yield server


def _nkey_seed() -> str:
    """A new nkey user's seed (``SU…``)."""
    return str(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode())


#: The nkey user :func:`nkey_nats` knows; any other seed is a stranger.
NKEY_SEED = _nkey_seed()


@pytest.fixture(scope="module")
def nkey_nats(pki: Pki) -> Iterator[NatsServer]:
    """TLS required, one nkey user: the client signs the server's nonce with the seed."""
    public = nkeys.from_seed(NKEY_SEED.encode()).public_key.decode()
    with NatsServer(extra_config=f"authorization {{ users = [ {{nkey: {public}}} ] }}",
                    tls=(pki.cert, pki.key)) as server:
        yield server


class StrippingProxy:
    """A man in the middle on loopback: forwards both ways to the server on ``port``, except that
    it removes TLS from the server's INFO (``tls_required``, ``tls_verify``, ``tls_available``),
    as an attacker would to read the client's ``CONNECT``; records every byte the client sends.
    With ``strip_from`` = n it leaves the first n - 1 connections alone (a man in the middle who
    arrives later), and :meth:`drop` cuts the connections it relays (so that the client reconnects).

    Runs its own event loop in a thread, so a pipeline in another process can connect to it."""

    def __init__(self, port: int, strip_from: int = 1) -> None:
        self.upstream = port
        self.strip_from = strip_from
        self.port = 0
        self.from_clients = bytearray()
        self.connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> Self:
        self._thread.start()
        start = asyncio.start_server(self._relay, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def drop(self) -> None:
        """Cut every connection relayed so far."""
        for writer in self._writers:
            self._loop.call_soon_threadsafe(writer.close)

    @staticmethod
    def strip(info_line: bytes) -> bytes:
        info = json.loads(info_line.removeprefix(b"INFO "))
        for flag in ("tls_required", "tls_verify", "tls_available"):
            info.pop(flag, None)
        return b"INFO " + json.dumps(info).encode() + b"\r\n"

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers += [client_writer, server_writer]
        info = await server_reader.readline()
        client_writer.write(self.strip(info) if self.connections >= self.strip_from else info)
        await asyncio.gather(self._pipe(client_reader, server_writer, record=True), self._pipe(server_reader, client_writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, record: bool = False) -> None:
        try:
            while data := await reader.read(65536):
                if record:
                    self.from_clients.extend(data)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass  # either side gone: the other goes too
        finally:
            writer.close()


def _dest(port: int, host: str = "localhost", **keys: Any) -> NatsDestination:
    return NatsDestination.model_validate({"type": "nats", "host": host, "port": port, **keys})


def _connect(dest: NatsDestination) -> WalflowClient:
    """walflow's connection as the sink makes it; a failure to fail (endless retries) fails the test."""
    return asyncio.run(asyncio.wait_for(connect(dest, "walflow:test"), 30))


def _refused(dest: NatsDestination) -> str:
    """The fatal error of a first connect with ``dest``."""
    with pytest.raises(FatalError) as info:
        _connect(dest)
    return str(info.value)


async def _jetstream_answers(dest: NatsDestination) -> bool:
    """Whether JetStream answers a request on walflow's connection (its reply comes to the inbox)."""
    nc = await connect(dest, "walflow:test")
    try:
        reply = await nc.request("$JS.API.INFO", b"", timeout=2)
        return "error" not in json.loads(reply.data)
    except TimeoutError:
        return False
    finally:
        await nc.close()


def _answers(dest: NatsDestination) -> bool:
    return asyncio.run(asyncio.wait_for(_jetstream_answers(dest), 30))


def test_a_proxy_that_strips_tls_gets_neither_credentials_nor_connect(tls_nats: NatsServer, pki: Pki) -> None:
    with StrippingProxy(tls_nats.port) as proxy, pytest.raises(NatsTlsError) as info:
        _connect(_dest(proxy.port, username="walflow", password=PASSWORD, tls=True, tls_ca_file=pki.ca))
    assert proxy.connections == 1  # it was asked once, and not retried
    assert bytes(proxy.from_clients) == b""  # not a byte: no CONNECT, no password
    assert str(info.value).startswith(f"NATS at localhost:{proxy.port} did not start TLS although the sink's "
                                      "destination asks for it: walflow refuses to send it anything"), info.value
    assert "a proxy in between may be stripping TLS" in str(info.value)


def test_a_reconnect_through_a_proxy_that_starts_stripping_tls_sends_no_password(
    tls_nats: NatsServer, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    """Connected over TLS, then cut off: every reconnect meets a stripped INFO, refuses it, and
    tries again (the proxy may go away), with nothing but TLS sent in all that time."""

    async def reconnects_refused(proxy: StrippingProxy) -> None:
        nc = await connect(_dest(proxy.port, username="walflow", password=PASSWORD, tls=True, tls_ca_file=pki.ca),
                           "walflow:test")
        try:
            proxy.drop()
            while proxy.connections < 3:  # two reconnects refused, the client still trying
                await asyncio.sleep(0.05)
            assert not nc.is_connected and not nc.is_closed
        finally:
            await nc.close()

    with StrippingProxy(tls_nats.port, strip_from=2) as proxy, caplog.at_level("WARNING", "walflow.nats"):
        asyncio.run(asyncio.wait_for(reconnects_refused(proxy), 30))
    assert PASSWORD.encode() not in proxy.from_clients and b"CONNECT" not in proxy.from_clients
    assert f"NATS at localhost:{proxy.port} did not start TLS" in caplog.text
    assert "; retrying" in caplog.text


@pytest.mark.slow  # it runs the pipeline (python -m bytewax.run) to its exit
def test_the_pipeline_through_a_stripping_proxy_stops_with_one_line_and_sends_no_password(
    tmp_path: Path, database: Database, tls_nats: NatsServer, pki: Pki, names: TestNames
) -> None:
    with StrippingProxy(tls_nats.port) as proxy:
        sink = {"name": "events", "destination": {
            "port": proxy.port, "username": "walflow", "password": PASSWORD, "tls": True, "tls_ca_file": str(pki.ca),
            "subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
        done = run_to_exit(write_config(tmp_path, database, tls_nats, names, [sink], log_level="warning"))
    line = fatal_line(done)  # exit status 2, one line, no traceback
    assert line.startswith(f"walflow: NATS at 127.0.0.1:{proxy.port} did not start TLS"), line
    assert proxy.connections >= 1 and PASSWORD.encode() not in proxy.from_clients
    assert b"CONNECT" not in proxy.from_clients
    assert PASSWORD not in done.stderr + done.stdout


def test_tls_to_a_plaintext_server_is_refused_before_connect(nats_srv: Nats) -> None:
    port = nats_srv.destination["port"]
    message = _refused(_dest(port, host="127.0.0.1", tls=True))
    assert message.startswith(f"NATS at 127.0.0.1:{port} did not start TLS"), message


def test_a_server_certificate_from_another_ca_fails_closed_with_one_line(tls_nats: NatsServer, pki: Pki) -> None:
    message = _refused(_dest(tls_nats.port, username="walflow", password=PASSWORD, tls_ca_file=pki.other_ca))
    assert message == (
        f"NATS at localhost:{tls_nats.port} presented a certificate walflow does not trust (unable to get local "
        "issuer certificate): nothing was sent; set destination.tls_ca_file to the CA that signed it, and connect "
        "by a name the certificate is for (host, or the servers' URLs)"
    )


def test_a_certificate_for_another_host_name_fails_closed_with_one_line(tls_nats: NatsServer, pki: Pki) -> None:
    message = _refused(_dest(tls_nats.port, host="127.0.0.1", username="walflow", password=PASSWORD,
                             tls_ca_file=pki.ca))
    assert message.startswith(f"NATS at 127.0.0.1:{tls_nats.port} presented a certificate walflow does not trust "
                              "(IP address mismatch, certificate is not valid for '127.0.0.1'.)"), message


def test_verified_tls_with_a_password_connects_and_jetstream_answers(tls_nats: NatsServer, pki: Pki) -> None:
    assert _answers(_dest(tls_nats.port, username="walflow", password=PASSWORD, tls_ca_file=pki.ca))


def test_a_wrong_password_over_tls_is_the_credentials_error(tls_nats: NatsServer, pki: Pki) -> None:
    with pytest.raises(NatsAuthError, match="refused the credentials"):
        _connect(_dest(tls_nats.port, username="walflow", password="wrong", tls_ca_file=pki.ca))


def test_replies_arrive_under_the_configured_inbox_prefix(tls_nats: NatsServer, pki: Pki) -> None:
    boxed: dict[str, Any] = {"username": "boxed", "password": PASSWORD, "tls_ca_file": pki.ca}
    assert _answers(_dest(tls_nats.port, inbox_prefix=BOXED_INBOX, **boxed))
    assert not _answers(_dest(tls_nats.port, **boxed))  # _INBOX.> is not this user's to subscribe to


def test_a_client_certificate_gets_into_a_server_that_verifies_clients(mtls_nats: NatsServer, pki: Pki) -> None:
    assert _answers(_dest(mtls_nats.port, tls_ca_file=pki.ca, tls_cert_file=pki.client_cert,
                          tls_key_file=pki.client_key, **mtls_nats.login))


def test_no_client_certificate_for_a_server_that_verifies_clients_fails_with_one_line(mtls_nats: NatsServer,
                                                                                      pki: Pki) -> None:
    message = _refused(_dest(mtls_nats.port, tls_ca_file=pki.ca))
    assert message.startswith(f"the TLS handshake with NATS at localhost:{mtls_nats.port} failed "
                              "(TLSV13_ALERT_CERTIFICATE_REQUIRED): nothing was sent;"), message
    assert "gets a certificate it trusts (tls_cert_file, tls_key_file)" in message


def test_a_client_certificate_that_is_not_one_fails_with_one_line(mtls_nats: NatsServer, pki: Pki) -> None:
    message = _refused(_dest(mtls_nats.port, tls_ca_file=pki.ca, tls_cert_file=pki.client_key,
                             tls_key_file=pki.client_key))
    assert message.startswith(f"destination.tls_cert_file {pki.client_key} and tls_key_file {pki.client_key} are "
                              "not a certificate and its private key walflow can read ("), message


def test_a_token_over_handshake_first_tls_connects(first_nats: NatsServer, pki: Pki) -> None:
    assert _answers(_dest(first_nats.port, token=TOKEN, tls_ca_file=pki.ca, tls_handshake_first=True))
    with pytest.raises(NatsAuthError, match="check destination.token"):
        _connect(_dest(first_nats.port, token="wrong", tls_ca_file=pki.ca, tls_handshake_first=True))


def test_an_nkey_seed_inline_or_from_a_file_connects_and_a_stranger_s_is_refused(nkey_nats: NatsServer, pki: Pki,
                                                                                  tmp_path: Path) -> None:
    seed_file = tmp_path / "user.nk"
    seed_file.write_text(NKEY_SEED + "\n")
    assert _answers(_dest(nkey_nats.port, nkey_seed=NKEY_SEED, tls_ca_file=pki.ca))
    assert _answers(_dest(nkey_nats.port, nkey_seed_file=seed_file, tls_ca_file=pki.ca))
    with pytest.raises(NatsAuthError, match="check destination.nkey_seed against"):
        _connect(_dest(nkey_nats.port, nkey_seed=_nkey_seed(), tls_ca_file=pki.ca))


def test_walflow_check_says_the_same_line_through_a_stripping_proxy(tls_nats: NatsServer, pki: Pki) -> None:
    async def probe(dest: NatsDestination) -> None:
        await close_nats(await open_nats(dest, "walflow:check"))

    with StrippingProxy(tls_nats.port) as proxy:
        dest = _dest(proxy.port, username="walflow", password=PASSWORD, tls_ca_file=pki.ca)
        with pytest.raises(ProbeError) as info:
            asyncio.run(probe(dest))
    assert info.value.text.startswith(f"NATS at localhost:{proxy.port} did not start TLS"), info.value.text
    assert PASSWORD.encode() not in proxy.from_clients


def _tls_sink(names: TestNames, port: int, **keys: Any) -> dict[str, Any]:
    return {"name": "events", "destination": {"host": "localhost", "port": port, "subject_prefix": names.subject_prefix,
                                              "stream": {"name": names.stream}, **keys}}


def _messages(dest: NatsDestination, stream: str) -> int:
    async def count() -> int:
        nc = await connect(dest, "walflow:test")
        try:
            return int((await nc.jetstream().stream_info(stream)).state.messages)
        finally:
            await nc.close()

    return asyncio.run(asyncio.wait_for(count(), 30))


def _three_rows(conn: Any) -> None:
    conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    conn.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c')")


#: The pipeline's cases: the server fixture, and the destination's keys for it (given the test's PKI).
PIPELINE_CASES: dict[str, tuple[str, Callable[[Pki], dict[str, Any]]]] = {
    "password": ("tls_nats", lambda pki: {"username": "walflow", "password": PASSWORD, "tls_ca_file": str(pki.ca)}),
    "token, handshake first": ("first_nats", lambda pki: {"token": TOKEN, "tls_ca_file": str(pki.ca),
                                                          "tls_handshake_first": True}),
    "client certificate": ("mtls_nats", lambda pki: {"tls_ca_file": str(pki.ca), "tls_cert_file": str(pki.client_cert),
                                                     "tls_key_file": str(pki.client_key)}),
    "own inbox prefix": ("tls_nats", lambda pki: {"username": "boxed", "password": PASSWORD,
                                                  "tls_ca_file": str(pki.ca), "inbox_prefix": BOXED_INBOX}),
}


@pytest.mark.slow  # it runs the pipeline (python -m bytewax.run)
@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_the_pipeline_publishes_over_verified_tls(
    request: pytest.FixtureRequest, case: str, tmp_path: Path, database: Database, pki: Pki, names: TestNames
) -> None:
    """Every NATS connection the pipeline makes (the sink's publishes and acknowledgements, its
    stream and its state in KV) uses the destination's TLS, credentials and inbox prefix: the
    server takes no other (the boxed user may receive replies under its own prefix only)."""
    server, keys_for = PIPELINE_CASES[case]
    nats_server: NatsServer = request.getfixturevalue(server)
    keys = {**nats_server.login, **keys_for(pki)}  # the login: the client-certificate server's own
    config = write_config(tmp_path, database, nats_server, names, [_tls_sink(names, nats_server.port, **keys)])
    run_workload(config, database, _three_rows)
    assert _messages(_dest(nats_server.port, **keys), names.stream) == 3


def test_a_ca_file_that_holds_no_certificate_is_one_line_before_any_connection(tmp_path: Path) -> None:
    not_a_ca = tmp_path / "ca.pem"
    not_a_ca.write_text("not a certificate\n")
    with pytest.raises(NatsTlsError) as info:
        connect_options(_dest(4222, tls_ca_file=not_a_ca), "walflow:test")
    assert str(info.value).startswith(f"destination.tls_ca_file {not_a_ca} holds no CA certificate walflow can read ")
