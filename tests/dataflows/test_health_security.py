"""The health endpoint's credentials, its request bounds and its warning beyond loopback, on the
real HTTP server (in process: what it serves is the runtime's, whatever runs the flow); and
``walflow status``'s request to it, which carries the config's credentials and no proxy sees."""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from cli.probe import read_health
from config.schema import HealthSettings
from core.runtime import Runtime
from dataflows.health import MAX_REQUEST, REQUEST_TIMEOUT, loopback, serve
from embedded._process import free_port

TOKEN = "t0ken-of-the-endpoint"


def _settings(**auth: Any) -> HealthSettings:
    return HealthSettings.model_validate({"host": "127.0.0.1", "port": free_port(), **auth})


@pytest.fixture
def endpoint(request: pytest.FixtureRequest) -> Iterator[tuple[HealthSettings, ThreadingHTTPServer]]:
    settings = _settings(**request.param)
    server = serve(Runtime(), settings)
    assert server is not None
    try:
        yield settings, server
    finally:
        server.shutdown()
        server.server_close()


def _get(settings: HealthSettings, path: str, authorization: str | None = None) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{settings.port}{path}")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as reply:
            return reply.status, dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


BEARER = {"token": TOKEN}
BASIC = {"username": "prom", "password": "s3cret"}


@pytest.mark.parametrize("endpoint", [BEARER], indirect=True)
def test_a_bearer_token_guards_readyz_and_metrics_but_not_healthz(
    endpoint: tuple[HealthSettings, ThreadingHTTPServer]
) -> None:
    settings, _ = endpoint
    for path in ("/readyz", "/metrics"):
        code, headers = _get(settings, path)
        assert (code, headers.get("WWW-Authenticate")) == (401, 'Bearer realm="walflow"'), path
        assert _get(settings, path, "Bearer wrong-token")[0] == 401
        assert _get(settings, path, _basic("prom", TOKEN))[0] == 401  # the right secret, the wrong scheme
        assert _get(settings, path, f"bearer {TOKEN}")[0] in (200, 503)  # RFC 9110: schemes ignore case
    assert _get(settings, "/healthz")[0] == 200  # liveness probes carry no credentials


@pytest.mark.parametrize("endpoint", [BASIC], indirect=True)
def test_basic_credentials_guard_readyz_and_metrics(endpoint: tuple[HealthSettings, ThreadingHTTPServer]) -> None:
    settings, _ = endpoint
    assert _get(settings, "/metrics")[1].get("WWW-Authenticate") == 'Basic realm="walflow"'
    assert _get(settings, "/metrics", _basic("prom", "wrong"))[0] == 401
    assert _get(settings, "/metrics", _basic("other", "s3cret"))[0] == 401
    assert _get(settings, "/metrics", _basic("prom", "s3cret"))[0] == 200
    # walflow status sends the same credentials, from the same settings
    health = read_health(settings)
    assert health.answering and not health.denied


@pytest.mark.parametrize("endpoint", [{}], indirect=True)
def test_without_credentials_the_endpoint_is_open(endpoint: tuple[HealthSettings, ThreadingHTTPServer]) -> None:
    settings, _ = endpoint
    assert _get(settings, "/metrics")[0] == 200


@pytest.mark.parametrize("endpoint", [BEARER], indirect=True)
def test_status_with_other_credentials_is_told_it_was_refused(
    endpoint: tuple[HealthSettings, ThreadingHTTPServer]
) -> None:
    settings, _ = endpoint
    health = read_health(settings.model_copy(update={"token": None}))
    assert (health.answering, health.denied) == (False, True)
    assert health.problem is not None and TOKEN not in json.dumps(health.as_json())


@pytest.mark.parametrize("endpoint", [BEARER], indirect=True)
def test_status_reaches_the_endpoint_past_an_http_proxy_of_the_environment(
    endpoint: tuple[HealthSettings, ThreadingHTTPServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, _ = endpoint
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: a request through it fails
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(urllib.error.URLError):  # what a default opener made now does: the test can fail
        urllib.request.build_opener().open(f"http://127.0.0.1:{settings.port}/healthz", timeout=5)
    health = read_health(settings)
    assert health.answering and not health.denied, health.problem


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed ``sock`` (read returns EOF or the connection is reset)."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


@pytest.mark.parametrize("endpoint", [{}], indirect=True)
def test_a_client_that_sends_nothing_or_trickles_is_closed_at_the_request_deadline(
    endpoint: tuple[HealthSettings, ThreadingHTTPServer]
) -> None:
    settings, _ = endpoint
    with socket.create_connection(("127.0.0.1", settings.port)) as silent, \
            socket.create_connection(("127.0.0.1", settings.port)) as trickle:
        trickle.sendall(b"GET /readyz HTTP/1.1\r\n")
        for _ in range(3):  # a header every second keeps each read alive, never the request
            time.sleep(1)  # the trickle itself, not synchronisation
            trickle.sendall(b"X-Slow: 1\r\n")
        assert _closed_within(trickle, REQUEST_TIMEOUT + 5) < REQUEST_TIMEOUT + 2
        assert _closed_within(silent, REQUEST_TIMEOUT + 5) < REQUEST_TIMEOUT + 2
    assert _get(settings, "/healthz")[0] == 200  # and the endpoint still answers others


@pytest.mark.parametrize("endpoint", [{}], indirect=True)
def test_headers_over_the_bound_are_refused(endpoint: tuple[HealthSettings, ThreadingHTTPServer]) -> None:
    settings, _ = endpoint
    with socket.create_connection(("127.0.0.1", settings.port), timeout=10) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\n" + b"X-Big: " + b"a" * MAX_REQUEST + b"\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.split(b"\r\n", 1)[0].split(b" ")[1] in (b"431", b"400"), reply[:80]


@pytest.mark.parametrize(("host", "local"), [("127.0.0.1", True), ("127.8.0.2", True), ("::1", True),
                                             ("localhost", True), ("0.0.0.0", False), ("", False),
                                             ("10.1.2.3", False), ("health.example.com", False)])
def test_loopback_is_only_this_machine(host: str, local: bool) -> None:
    assert loopback(host) is local


@pytest.mark.parametrize("auth", [{}, BEARER])
def test_listening_beyond_loopback_without_credentials_is_warned_of_once(
    auth: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    settings = HealthSettings.model_validate({"host": "0.0.0.0", "port": free_port(), **auth})
    with caplog.at_level(logging.WARNING, logger="walflow.health"):
        server = serve(Runtime(), settings)
    assert server is not None
    server.shutdown()
    server.server_close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if auth:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "beyond loopback without credentials" in warnings[0]


@pytest.mark.parametrize(("keys", "problem"), [
    ({"username": "prom"}, "username and password go together"),
    ({"password": "x"}, "username and password go together"),
    ({"token": "t", "username": "u", "password": "p"}, "either token or username and password"),
    ({"token": ""}, "token is empty"),
])
def test_health_credentials_that_cannot_work_are_refused(keys: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        HealthSettings.model_validate(keys)
