"""A throwaway PostgreSQL server with ``wal_level=logical``, for tests and the demo.

It runs the system's own binaries (found through ``WALFLOW_PG_BINDIR``, ``pg_config``,
``PATH`` or ``/usr/lib/postgresql/*/bin``) on a free loopback port, in a private directory
that is removed on close. Tests stop, kill and restart it on purpose, so the port and the
data directory survive a restart.

It is reachable only by the user who started it: every connection, local or TCP, is
authenticated with SCRAM-SHA-256, and the superuser's password is random, written only to a
0600 passfile in the private (0700) directory. :meth:`PostgresServer.dsn` names that file
(``passfile=``), so a printed DSN holds no password; :attr:`PostgresServer.password` is for
what cannot read a passfile (a walflow config's ``password:``).
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from embedded._process import Account, EmbeddedServer, ServerError, private_dir, run_as

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

_SHUTDOWN_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


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


class PostgresServer(EmbeddedServer):
    """One embedded PostgreSQL cluster. Use as a context manager, or call ``start``/``close``."""

    name = "postgres"
    superuser = "postgres"
    host = "127.0.0.1"
    port_taken_marker = "could not bind"
    close_signal = signal.SIGINT  # "fast": ends client sessions instead of waiting for them

    def __init__(self, settings: Mapping[str, str] | None = None, tls: tuple[Path, Path] | None = None) -> None:
        """``tls`` = (certificate chain PEM, private key PEM) turns on ``ssl``; plain connections still work."""
        super().__init__()
        self.bindir = find_bindir()
        self.account = Account.for_servers()  # initdb and postgres refuse to run as root
        self.tls = tls
        # relative paths are read from the data directory, where _prepare copies the files
        tls_settings = {"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key"} if tls else {}
        self.settings = {**DEFAULT_SETTINGS, **tls_settings, **(settings or {})}
        #: The superuser's password: random, kept in the passfile :meth:`dsn` names (and initdb's
        #: own, removed before the server first starts).
        self.password = secrets.token_hex(24)

    def _prepare(self) -> None:
        self.base = private_dir("pg", self.account)
        # initdb reads the password as the server account; the file is gone before the server starts
        pwfile = self.base / "initdb.pw"
        pwfile.write_text(self.password)
        pwfile.chmod(0o600)
        if not self.account.is_self:
            os.chown(pwfile, self.account.uid, self.account.gid)
        try:
            run_as(
                [
                    str(self.bindir / "initdb"),
                    "-D", str(self.data_dir),
                    "-U", self.superuser,
                    "--auth-local=scram-sha-256",
                    "--auth-host=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                self.account,
                cwd=self.base,
                what="initdb",
            )
        finally:
            pwfile.unlink()
        self._write_passfile()
        if self.tls is not None:
            self._install_tls(*self.tls)

    def replace_tls(self, cert: Path, key: Path) -> None:
        """Serve ``cert``/``key`` from now on (a renewed certificate, or a wrong one): the files are
        installed and the configuration reloaded; a connection made once the reload is done gets them."""
        self._install_tls(cert, key)
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")

    def _write_passfile(self) -> None:
        """The superuser's line for this server's addresses (TCP and its socket directory), owned by
        the user who started it with mode 0600 (libpq ignores a passfile others may read)."""
        fd = os.open(self.passfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            for host in (self.host, "localhost"):
                out.write(f"{host}:*:*:{self.superuser}:{self.password}\n")

    @property
    def passfile(self) -> Path:
        """The libpq passfile with the superuser's password (:meth:`dsn` names it)."""
        assert self.base is not None, "server not initialised"
        return self.base / "pgpass"

    def _install_tls(self, cert: Path, key: Path) -> None:
        """Copy the pair into the data directory, owned by the server account with mode 0600: postgres reads them
        as that account and refuses a private key that anyone else can read."""
        for source, name in ((cert, "server.crt"), (key, "server.key")):
            target = self.data_dir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            if not self.account.is_self:
                os.chown(target, self.account.uid, self.account.gid)

    @property
    def data_dir(self) -> Path:
        assert self.base is not None, "server not initialised"
        return self.base / "data"

    def _argv(self) -> list[str]:
        assert self.base is not None
        settings = {
            **self.settings,
            "port": str(self.port),
            "listen_addresses": self.host,
            "unix_socket_directories": str(self.base),
        }
        argv = [str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def _ready(self) -> bool:
        try:
            with psycopg.connect(self.dsn(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self, mode: str = "fast") -> None:
        """Shut down: ``smart``, ``fast`` (default) or ``immediate`` (crash-like, recovers on start)."""
        self._stop(_SHUTDOWN_SIGNALS[mode])

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        """A libpq connection string for ``dbname`` as the superuser: its password comes from the
        passfile it names (printing it shows none)."""
        return make_conninfo(host=self.host, port=self.port, user=self.superuser, dbname=dbname,
                             passfile=str(self.passfile), **params)
