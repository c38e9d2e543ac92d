"""The test tiers kept true: ``servers`` and ``slow`` say what a test needs, and a test that
does more than its markers say fails.

``servers`` is applied at collection from the fixture closure: a test that reaches
``pg_server`` or ``nats_server`` through any fixture needs the real PostgreSQL or NATS. What
no fixture shows, a subprocess does: an audit hook sees every ``subprocess.Popen`` of the
test process and fails the running test when the command needs a marker it lacks
(:func:`needs`): a pipeline (``python -m bytewax.run``, the demo) needs ``slow``; a server
binary, or a Python child that starts the embedded servers, needs ``servers``. ``slow`` for a
test over ~5 s is the author's to write; the summary of a one-process run lists unmarked tests
that took longer than :data:`SLOW_SECONDS`.

Under pytest-xdist the workers run the slow tests first (the longest are there: they should
not be the last to start), handed out one at a time (``--maxschedchunk 1`` unless given),
and a test marked ``alone`` (it measures its process's CPU) runs with no other test at once:
every test holds a shared lock, an ``alone`` one an exclusive lock, through a turnstile so
that it is not starved. A pytest plugin, registered by ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

#: Fixtures that start (or stand for) the session's servers; every other server fixture needs one of them.
SERVER_FIXTURES = frozenset({"pg_server", "nats_server"})
#: Executables that are a server, or make one.
SERVER_PROGRAMS = frozenset({"postgres", "initdb", "pg_ctl", "nats-server"})
#: Python modules that start the embedded servers (``./run.sh demo``, ``./run.sh bench``).
SERVER_MODULES = frozenset({"demo", "bench"})
#: Python modules that start the pipeline: ``bytewax.run`` itself, and the commands that run it.
PIPELINE_MODULES = frozenset({"bytewax.run", "demo", "bench"})
#: In a ``python -c`` script: the embedded servers, started in the child.
SERVER_CLASSES = ("PostgresServer", "NatsServer")
#: A test not marked ``slow`` that took longer than this is named in the summary (not failed: the machine is noisy).
SLOW_SECONDS = 10.0

#: Set by the xdist controller for its workers: the file whose locks keep an ``alone`` test alone.
LOCK_VARIABLE = "WALFLOW_TESTS_ALONE_LOCK"

_violations = pytest.StashKey[list[str]]()
_failed = pytest.StashKey[bool]()
_lock_made = pytest.StashKey[tuple[str, str | None]]()
_current: pytest.Item | None = None
_hooked = False
_unmarked_slow: list[tuple[float, str]] = []


def _python_option(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``python ... -m MODULE`` or ``-c CODE`` (also written ``-mMODULE``), else None."""
    for i, arg in enumerate(argv[1:], start=1):
        if arg == flag:
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith(flag) and not arg.startswith("--"):
            return arg[len(flag):]
    return None


def needs(argv: Sequence[str]) -> frozenset[str]:
    """The markers a test must carry to run ``argv`` as a subprocess."""
    if not argv:
        return frozenset()
    out = set()
    module = _python_option(argv, "-m")
    if module in PIPELINE_MODULES:
        out.add("slow")
    script = _python_option(argv, "-c") or ""
    if Path(argv[0]).name in SERVER_PROGRAMS or module in SERVER_MODULES or any(c in script for c in SERVER_CLASSES):
        out.add("servers")
    return frozenset(out)


def missing(item: pytest.Item, argv: Sequence[str]) -> frozenset[str]:
    """The markers ``item`` lacks for running ``argv``."""
    return frozenset(name for name in needs(argv) if item.get_closest_marker(name) is None)


def _argv(args: tuple[Any, ...]) -> list[str]:
    """The command of a ``subprocess.Popen`` audit event (executable, args, cwd, env)."""
    executable, argv = args[0], args[1]
    if isinstance(argv, str | bytes | os.PathLike):
        argv = [argv]
    out = [os.fsdecode(a) for a in argv]
    if executable is not None and out:
        out[0] = os.fsdecode(executable)
    return out


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Runs for every audited event of the process: as little as possible unless it is a Popen during a test."""
    if event != "subprocess.Popen" or _current is None:
        return
    item, argv = _current, _argv(args)
    lacking = missing(item, argv)
    if lacking:
        marks = " and ".join(f"@pytest.mark.{name}" for name in sorted(lacking))
        message = (f"{item.nodeid} runs {' '.join(argv)[:160]!r} but is not marked {marks} "
                   "(tests/tiers.py: a test's markers say what it needs)")
        item.stash.setdefault(_violations, []).append(message)
        pytest.fail(message, pytrace=False)


def _parallel(config: pytest.Config) -> bool:
    """True in the controller of a pytest-xdist run that starts workers."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    global _hooked
    if not _hooked:  # an audit hook cannot be removed: one per process, reading the running test
        sys.addaudithook(_audit)
        _hooked = True
    if _parallel(config) and getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1  # the queue taken one test at a time, else one worker gets every slow test
    if _parallel(config):  # the workers, started after this, inherit it (a run inside a test makes its own)
        fd, path = tempfile.mkstemp(prefix="walflow-tests-alone-", suffix=".lock")
        os.close(fd)
        config.stash[_lock_made] = (path, os.environ.get(LOCK_VARIABLE))
        os.environ[LOCK_VARIABLE] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_lock_made, None)
    if made is not None:
        path, before = made
        if before is None:
            os.environ.pop(LOCK_VARIABLE, None)
        else:
            os.environ[LOCK_VARIABLE] = before
        with contextlib.suppress(OSError):
            os.unlink(path)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)
    if hasattr(config, "workerinput"):  # every worker sorts alike, so their collections stay the same
        items.sort(key=_order)


def _order(item: pytest.Item) -> int:
    """Slow tests first, ``alone`` tests last (where the others they wait for are quick); stable within each."""
    if item.get_closest_marker("alone") is not None:
        return 2
    return 0 if item.get_closest_marker("slow") is not None else 1


@contextlib.contextmanager
def _turn(item: pytest.Item) -> Iterator[None]:
    """Under xdist: a shared lock for the test, or an exclusive one if it is marked ``alone``.

    Byte 0 of the lock file is the turnstile (held while a lock on byte 1 is being taken), byte 1
    the lock itself: an ``alone`` test waiting at byte 1 keeps new tests out at byte 0. POSIX
    record locks belong to the process: each worker is one.
    """
    path = os.environ.get(LOCK_VARIABLE)
    if path is None or not hasattr(item.config, "workerinput"):
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    with open(path, "r+b") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX, 1, 0)
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH, 1, 1)
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN, 1, 0)
        try:
            yield
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN, 1, 1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    global _current
    with _turn(item):
        _current = item
        try:
            return (yield)
        finally:
            _current = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A violation in one of the test's threads (where the failure was raised only in that thread) fails it too."""
    report = yield
    if report.failed:
        item.stash[_failed] = True
    found = item.stash.get(_violations, [])
    if found and report.when == "teardown" and not item.stash.get(_failed, False):
        report.outcome = "failed"
        report.longrepr = "\n".join(found)
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Seen where reports arrive (the controller under xdist): how long each unmarked test took."""
    if report.when == "call" and report.duration > SLOW_SECONDS and "slow" not in report.keywords:
        _unmarked_slow.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """In a one-process run only: under parallel workers a test's time is the machine's contention as much as its own."""
    if _unmarked_slow and not _parallel(config):
        terminalreporter.section(f"not marked slow, over {SLOW_SECONDS:.0f} s (mark them, or make them quick)")
        for seconds, nodeid in sorted(_unmarked_slow, reverse=True):
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")
