"""One asyncio event loop per process, on its own thread, for nats-py.

nats-py is asyncio-only while Bytewax calls sinks synchronously from its worker threads.
The loop thread owns every NATS connection of the process; worker threads hand it
coroutines and wait for their results. Blocking a worker there is deliberate: it is how
a slow or absent NATS slows the pipeline down instead of filling memory.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    """The process's NATS loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="walflow-nats", daemon=True).start()
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the NATS loop and wait for its result (its exception is raised here)."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result()
