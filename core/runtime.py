"""The process's runtime: built once by the flow, handed to every part, read by health.

It replaces process-global state. It holds:

- the parts that report health (one per replication slot this process reads);
- the process's metrics (:class:`core.metrics.Metrics`), which every part counts into and
  the health endpoint serves;
- the asyncio loop, on its own thread, that async clients (nats-py) run on: Bytewax calls
  sinks synchronously from its worker threads, which hand coroutines to the loop and
  wait. Blocking a worker there is deliberate: it is how a slow or absent NATS slows the
  pipeline down instead of filling memory;
- what a fatal error does. In ``python -m bytewax.run`` it prints one line and exits with
  status 2 at once: raised inside a Bytewax callback, the error would come out as a Rust
  panic and a traceback (and, in a cluster, only as ``Send thread panic``). Stopping
  abruptly loses nothing: nothing past the problem was confirmed, so a restart after the
  fix resumes before it. Elsewhere (tests, embedding) the error is raised;
- what a :class:`~core.errors.RestartRequired` does: the process starts itself again with the
  same command (``execv``), so replication resumes from the slot's confirmed position, and
  hands the new process what it carries (:data:`RESTARTED`, read back as :attr:`Runtime.restarted`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, ParamSpec, Protocol, TypeVar

from core.display import fatal_line
from core.errors import FatalError, InternalError, RestartRequired
from core.metrics import Metrics

log = logging.getLogger("walflow")

T = TypeVar("T")
P = ParamSpec("P")

#: Exit status of a fatal error: distinct from a crash's 1.
FATAL_EXIT = 2
#: The environment variable a process that started itself again finds what it carried in:
#: ``{"reason": ..., "records": [...]}``, the records carried since the operator's start (the
#: latest :data:`_CARRIED` of them).
RESTARTED = "WALFLOW_RESTARTED"
_CARRIED = 100


class Reporter(Protocol):
    """A part whose state readiness depends on."""

    def health(self) -> dict[str, object]: ...


class Runtime:
    """What the parts of one walflow process share."""

    def __init__(self, *, exit_on_fatal: bool = False, restarted: dict[str, Any] | None = None) -> None:
        """``restarted``: what the process that started this one again carried
        (:meth:`restart`); None on an operator's start."""
        self.exit_on_fatal = exit_on_fatal
        #: What the previous process carried when it started this one again: then nothing a
        #: recovery snapshot holds is resumed from (the slot's confirmed position is where the
        #: repair starts). None on an operator's start.
        self.restarted = restarted
        self._restarting = False
        self._lock = threading.Lock()
        self._reporters: list[Reporter] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.metrics = Metrics()

    # -- health --------------------------------------------------------------------------

    def register(self, reporter: Reporter) -> None:
        with self._lock:
            self._reporters.append(reporter)

    def unregister(self, reporter: Reporter) -> None:
        with self._lock:
            if reporter in self._reporters:
                self._reporters.remove(reporter)

    def health(self) -> list[dict[str, object]]:
        with self._lock:
            reporters = list(self._reporters)
        return [reporter.health() for reporter in reporters]

    # -- the async loop --------------------------------------------------------------------

    def loop(self) -> asyncio.AbstractEventLoop:
        """The process's asyncio loop, started on first use."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="walflow-async", daemon=True).start()
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (its exception is raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop()).result()

    # -- failures --------------------------------------------------------------------------

    def fatal(self, exc: FatalError) -> NoReturn:
        """Stop for an error an operator must act on: one line and exit 2, or raise it."""
        if not self.exit_on_fatal:
            raise exc
        print(fatal_line(exc), file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(FATAL_EXIT)

    def restart(self, exc: RestartRequired) -> NoReturn:
        """Start this process again with the same command, carrying ``exc.record``: the
        error's line is logged once; in tests (not ``exit_on_fatal``) it is raised instead."""
        if not self.exit_on_fatal:
            raise exc
        with self._lock:
            if self._restarting:  # another part met it at the same moment: one restart
                threading.Event().wait()
            self._restarting = True
        log.error("%s", exc)
        records = [*(self.restarted or {}).get("records", []), exc.record][-_CARRIED:]
        env = {**os.environ, RESTARTED: json.dumps({"reason": type(exc).__name__, "records": records})}
        logging.shutdown()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

    @contextmanager
    def guard(self, label: str) -> Iterator[None]:
        """Around every call Bytewax makes into walflow: a fatal error stops the process
        (:meth:`fatal`), and so does anything unforeseen (a bug), with one line that names
        the exception's type only (its text may hold a row's values) and the traceback at
        log level debug: never Bytewax's traceback or a cluster's ``Send thread panic``.
        Nothing past the change being handled is confirmed, so a restart resumes before it.
        In tests (not ``exit_on_fatal``) the exception itself is raised."""
        try:
            yield
        except RestartRequired as exc:
            self.restart(exc)
        except FatalError as exc:
            self.fatal(exc)
        except Exception as exc:
            if not self.exit_on_fatal:
                raise
            log.debug("%s failed", label, exc_info=True)
            self.fatal(InternalError(
                f"{label} failed unexpectedly ({type(exc).__name__}): this is a bug in walflow. Nothing after the "
                "change it was handling is confirmed: a restart resumes before it. Report it with the log "
                "at walflow.log_level: debug"))

    def guarded(self, label: str, step: Callable[P, T]) -> Callable[P, T]:
        """``step`` under :meth:`guard`: for the steps Bytewax calls directly (a flow's map)."""

        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            with self.guard(label):
                return step(*args, **kwargs)

        return call
