"""Child processes for the embedded servers.

Tests and the demo start real PostgreSQL and NATS servers. They must leave nothing behind,
not even when the parent is killed: each server runs in its own session (so a Ctrl-C in
the terminal reaches the parent first, which then stops it in order), is sent SIGKILL by
the kernel when the parent dies (``PR_SET_PDEATHSIG``), and lives in a private directory
that records its owner's PID so that a later run can sweep what a killed run left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

_PR_SET_PDEATHSIG = 1
_DIR_PREFIX = "walflow-"
_OWNER_FILE = "owner.pid"


class ServerError(RuntimeError):
    """An embedded server could not be found, started or stopped."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for(
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    check: Callable[[], None] | None = None,
    interval: float = 0.05,
) -> None:
    """Poll ``condition`` until it holds; ``check`` may raise to give up early (a dead process)."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        if condition():
            return
        if time.monotonic() >= deadline:
            raise ServerError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass(frozen=True)
class Account:
    """The user a server runs as: ourselves, or an unprivileged one when we are root."""

    uid: int
    gid: int
    name: str

    @classmethod
    def for_servers(cls) -> Account:
        """PostgreSQL refuses to run as root: pick ``postgres`` (or ``nobody``) in that case."""
        if os.geteuid() != 0:
            return cls(os.geteuid(), os.getegid(), pwd.getpwuid(os.geteuid()).pw_name)
        for name in ("postgres", "nobody"):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            return cls(entry.pw_uid, entry.pw_gid, name)
        raise ServerError("running as root and found neither a 'postgres' nor a 'nobody' user to run PostgreSQL as")

    @property
    def is_self(self) -> bool:
        return self.uid == os.geteuid()

    @property
    def switch(self) -> tuple[int | None, int | None, list[int] | None]:
        """``user``, ``group`` and ``extra_groups`` for subprocess: None where no switch is needed."""
        if self.is_self:
            return None, None, None
        return self.uid, self.gid, []


def _die_with_parent() -> None:
    """Runs in the child after setuid: the kernel kills it if the spawning thread dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_dirs() -> None:
    """Remove directories that earlier runs left when they were killed before cleaning up."""
    for path in Path(tempfile.gettempdir()).glob(f"{_DIR_PREFIX}*"):
        owner = path / _OWNER_FILE
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        if not _pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def private_dir(kind: str, account: Account) -> Path:
    """A fresh directory under the system temp dir, owned by ``account``, tagged with our PID."""
    sweep_stale_dirs()
    path = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{kind}-"))
    (path / _OWNER_FILE).write_text(str(os.getpid()))
    if not account.is_self:
        os.chown(path, account.uid, account.gid)
    path.chmod(0o700)
    return path


class ServerProcess:
    """One long-running child process with its output in a log file."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path,
        account: Account,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.account = account
        self.env = env
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        if self.running:
            raise ServerError(f"{self.argv[0]} is already running as PID {self.pid}")
        user, group, extra_groups = self.account.switch
        with open(self.log_path, "ab") as log:
            if not self.account.is_self:
                os.chown(self.log_path, self.account.uid, self.account.gid)
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - started from the main thread only
                user=user,
                group=group,
                extra_groups=extra_groups,
            )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once the process exited; None while it runs (or before it started)."""
        return None if self._proc is None else self._proc.poll()

    def check_running(self) -> None:
        """Raise with the log's tail if the process has exited (used while waiting for readiness)."""
        if self._proc is not None and self._proc.poll() is not None:
            raise ServerError(
                f"{Path(self.argv[0]).name} exited with code {self._proc.returncode}:\n{self.log_tail()}"
            )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Send ``sig`` and wait; escalate to SIGKILL of the whole session if it does not exit."""
        if self._proc is None:
            return
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=timeout)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL; the server's own children (PostgreSQL's backends) notice and exit by themselves."""
        self.stop(signal.SIGKILL)

    def log_tail(self, lines: int = 30, skip: str | None = None) -> str:
        """The log's last ``lines`` lines, leaving out those that contain ``skip``."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        kept = [line for line in text.splitlines() if skip is None or skip not in line]
        return "\n".join(kept[-lines:])


def run_as(argv: Sequence[str], account: Account, *, cwd: Path, what: str) -> None:
    """Run a short command (initdb) as ``account``; raise with its output if it fails."""
    user, group, extra_groups = account.switch
    result = subprocess.run(
        list(argv),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        user=user,
        group=group,
        extra_groups=extra_groups,
    )
    if result.returncode != 0:
        raise ServerError(f"{what} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")


class EmbeddedServer:
    """What the embedded servers share: free ports on first start, a readiness wait, cleanup.

    Subclasses set ``account``, create ``base`` in ``_prepare`` and build the command in
    ``_argv``; a restart reuses the ports and the directory, so clients reconnect to the
    same address and find their data again.
    """

    name = "server"
    account: Account
    #: Text in the log that means the port was taken between probing and binding.
    port_taken_marker = "address already in use"
    #: How ``close`` asks the server to exit: promptly, ending any client sessions.
    close_signal = signal.SIGTERM
    #: Text of log lines that the readiness probe itself causes: left out of the log a timeout shows.
    probe_noise: str | None = None

    def __init__(self) -> None:
        self.base: Path | None = None
        self.port = 0
        self._process: ServerProcess | None = None

    def _prepare(self) -> None:
        raise NotImplementedError

    def _pick_ports(self) -> None:
        self.port = free_port()

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _last_probe(self) -> str:
        """What the readiness probe saw last, for the error when the server never became ready."""
        return ""

    def start(self, timeout: float = 60.0) -> Self:
        """Start (prepared on first use) and wait until the server answers."""
        if self.base is None:
            self._prepare()
        if self.port:
            self._start_once(timeout)
            return self
        for attempt in range(3):
            self._pick_ports()
            try:
                self._start_once(timeout)
                return self
            except ServerError:
                if attempt == 2 or self.port_taken_marker not in self.log_tail().lower():
                    raise
        return self

    def _start_once(self, timeout: float) -> None:
        self.launch()
        self.await_ready(timeout)

    def launch(self) -> None:
        """Start the process on the ports already picked, without waiting for it: for servers that
        become ready only together (the nodes of a NATS cluster: :meth:`await_ready` after all)."""
        if self.base is None:
            self._prepare()
        assert self.base is not None
        self._process = ServerProcess(self._argv(), log_path=self.base / f"{self.name}.log", cwd=self.base,
                                      account=self.account)
        self._process.start()

    def await_ready(self, timeout: float = 60.0) -> None:
        """Wait until the launched server answers; kill it and raise if it does not in time."""
        assert self._process is not None
        try:
            wait_for(self._ready, timeout=timeout, what=f"{self.name} to become ready",
                     check=self._process.check_running)
        except ServerError as exc:
            pid, timed_out = self._process.pid, self._process.running  # else check_running raised with the log
            self._process.kill()
            if not timed_out:
                raise
            probe = self._last_probe()
            raise ServerError(
                f"{exc} (PID {pid} was running{'; ' + probe if probe else ''}); the end of its log "
                f"{self._process.log_path}:\n{self._process.log_tail(40, skip=self.probe_noise)}"
            ) from None

    def _stop(self, sig: int) -> None:
        if self._process is not None:
            self._process.stop(sig)

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        self._stop(signal.SIGKILL)

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self._stop(self.close_signal)
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def log_tail(self, lines: int = 30) -> str:
        return self._process.log_tail(lines) if self._process is not None else "(not started)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
