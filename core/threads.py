"""One Python thread state per engine worker thread, kept for the thread's lifetime.

Bytewax 0.21.1 (PyO3 0.21) runs each dataflow worker on a thread the engine starts
(every worker of ``-w N`` with N > 1, and every worker of an ``-i/-a`` cluster process;
``-w 1`` alone runs on the main thread). Every callback takes the GIL with
``PyGILState_Ensure`` and gives it back with ``PyGILState_Release``. With no outer
acquisition on that thread, the release drops the thread state's nesting counter to zero
and CPython destroys the thread state; the next callback builds a new one, with a fresh
frame stack (mmap/munmap) and empty ``threading.local`` storage. Several calls are made
per item (a ``FixedPartitionedSink``'s ``part_fn``, the key wrap after a stateful step,
pickling across processes), so this happens per item.

:func:`keep_thread_state` takes one extra ``PyGILState_Ensure`` on the calling thread and
never releases it (CPython gh-146219 documents the pattern): the counter never drops to
zero again, so every later acquisition on the thread reuses the same thread state. Call it
from code Bytewax runs on each worker thread while it builds the dataflow: the
``list_parts`` of a ``FixedPartitionedSource`` or ``FixedPartitionedSink`` (called once
on every worker) and, to be safe, ``build_part``.

The contract and its limits:

- Idempotent per thread: the marker is a ``threading.local``, which lives exactly as long
  as the thread state it pins, so a later thread that reuses the native id is not
  mistaken for a pinned one.
- A no-op on the main thread (its thread state is never destroyed) and while the
  interpreter finalizes.
- On a thread started by :mod:`threading` it is harmless but useless: that thread deletes
  its thread state on exit whatever the counter says.
- The pinned thread state outlives the engine thread: when the worker thread ends, its
  thread state (a few KiB) stays in the interpreter's list until finalization, which
  clears it with every other. A process that runs many dataflows in turn (tests) keeps one
  per worker thread per run. Its ``threading.local`` values stay alive with it.
"""

from __future__ import annotations

import ctypes
import sys
import threading

_api = ctypes.pythonapi

_ensure = _api.PyGILState_Ensure
_ensure.argtypes = []
_ensure.restype = ctypes.c_int

_current = _api.PyThreadState_Get
_current.argtypes = []
_current.restype = ctypes.c_void_p

_marker = threading.local()


def keep_thread_state() -> bool:
    """Keep the calling thread's Python thread state alive until the thread ends.

    Returns whether this call pinned it (False: main thread, already pinned, or the
    interpreter is finalizing). The caller must hold the GIL, as any Python code does.
    """
    if threading.get_ident() == threading.main_thread().ident or sys.is_finalizing():
        return False
    if getattr(_marker, "pinned", False):
        return False
    # ctypes.pythonapi calls keep the GIL: this only increments the nesting counter of the
    # current thread state (it returns PyGILState_LOCKED), and nothing ever decrements it.
    _ensure()
    _marker.pinned = True
    return True


def thread_state_pinned() -> bool:
    """Whether :func:`keep_thread_state` pinned the calling thread's current thread state."""
    return bool(getattr(_marker, "pinned", False))


def thread_state_address() -> int:
    """The address of the calling thread's current ``PyThreadState`` (for diagnostics and tests).

    Two calls that return different addresses ran on different thread states; equal
    addresses do not prove the same one (a freed thread state's memory is often reused).
    """
    address = _current()
    assert address is not None  # PyThreadState_Get aborts the process rather than return NULL
    return int(address)
