"""A throwaway PostgreSQL server with ``wal_level=logical``, for tests and the demo.

It runs the system's own binaries (found through ``WALFLOW_PG_BINDIR``, ``pg_config``,
``PATH`` or ``/usr/lib/postgresql/*/bin``) on a free loopback port, in a private directory
that is removed on close. Tests stop, kill and restart it on purpose, so the port and the
data directory survive a restart.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Mapping

import psycopg
from psycopg.conninfo import make_conninfo

from embedded._process import Account, ServerError, ServerProcess, free_port, private_dir, run_as, wait_for

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, postgres) were not found. Install them "
    "(Debian/Ubuntu: 'sudo apt-get install postgresql'; macOS: 'brew install postgresql') "
    "or set WALFLOW_PG_BINDIR to the directory that holds initdb and postgres."
)

#: Settings for a disposable server: logical decoding on, durability traded for speed
#: (fsync off survives process crashes, which is what the tests inject, not power loss).
DEFAULT_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical",
    "max_wal_senders": "20",
    "max_replication_slots": "20",
    "max_prepared_transactions": "10",
    "max_connections": "100",
    "shared_buffers": "64MB",
    "fsync": "off",
    "full_page_writes": "off",
    "log_min_messages": "warning",
    "log_line_prefix": "%m [%p] %a ",
}


class PostgresNotFound(ServerError):
    """The server binaries are missing; the message says how to install them."""


def find_bindir() -> Path:
    """The directory holding ``initdb`` and ``postgres``, newest major version first."""
    candidates: list[str] = []
    if os.environ.get("WALFLOW_PG_BINDIR"):
        candidates.append(os.environ["WALFLOW_PG_BINDIR"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            candidates.append(out.stdout.strip())
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    candidates.extend(sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major_version, reverse=True))
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "postgres").is_file():
            return path
    raise PostgresNotFound(INSTALL_HINT)


def _major_version(bindir: str) -> int:
    try:
        return int(Path(bindir).parent.name)
    except ValueError:
        return 0


class PostgresServer:
    """One embedded PostgreSQL cluster. Use as a context manager, or call ``start``/``close``."""

    superuser = "postgres"
    host = "127.0.0.1"

    def __init__(self, settings: Mapping[str, str] | None = None) -> None:
        self.bindir = find_bindir()
        self.account = Account.for_servers()
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.base: Path | None = None
        self.port = 0
        self._process: ServerProcess | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> "PostgresServer":
        """Initialise on first use, then start and wait until it accepts connections."""
        if self.base is None:
            self._initdb()
        if self.port:
            self._start_once(timeout)
            return self
        for attempt in range(3):  # a free port can be taken between probing and binding
            self.port = free_port()
            try:
                self._start_once(timeout)
                return self
            except ServerError:
                if attempt == 2 or "could not bind" not in self.log_tail():
                    raise
        return self

    def _initdb(self) -> None:
        self.base = private_dir("pg", self.account)
        run_as(
            [
                str(self.bindir / "initdb"),
                "-D", str(self.data_dir),
                "-U", self.superuser,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            self.account,
            cwd=self.base,
            what="initdb",
        )

    @property
    def data_dir(self) -> Path:
        assert self.base is not None, "server not initialised"
        return self.base / "data"

    def _start_once(self, timeout: float) -> None:
        assert self.base is not None
        argv = [str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        settings = {
            **self.settings,
            "port": str(self.port),
            "listen_addresses": self.host,
            "unix_socket_directories": str(self.base),
        }
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        self._process = ServerProcess(argv, log_path=self.base / "postgres.log", cwd=self.base, account=self.account)
        self._process.start()
        try:
            wait_for(self._accepts_connections, timeout=timeout, what="PostgreSQL to accept connections",
                     check=self._process.check_running)
        except ServerError:
            self._process.kill()
            raise

    def _accepts_connections(self) -> bool:
        try:
            with psycopg.connect(self.dsn(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop(self, mode: str = "fast") -> None:
        """Shut down: ``smart``, ``fast`` (default) or ``immediate`` (crash-like, recovers on start)."""
        sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        if self._process is not None:
            self._process.stop(sig)

    def kill(self) -> None:
        """SIGKILL the postmaster, as the OOM killer would."""
        if self._process is not None:
            self._process.kill()

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop("immediate")
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- access --------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        """A libpq connection string for ``dbname`` as the superuser."""
        return make_conninfo(host=self.host, port=self.port, user=self.superuser, dbname=dbname, **params)

    def log_tail(self, lines: int = 30) -> str:
        return self._process.log_tail(lines) if self._process is not None else "(not started)"
