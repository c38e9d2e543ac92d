"""One Python thread state per engine worker thread, kept for the thread's lifetime.

On the threads Bytewax 0.21.1 starts for its workers (every worker of ``-w N`` with N > 1 and
of an ``-i/-a`` cluster process), every callback without an outer GIL acquisition builds and
destroys a Python thread state, several times per item: the cost dominates a multi-worker run.
:func:`keep_thread_state` takes one extra ``PyGILState_Ensure`` on the calling thread and never
releases it, so every later acquisition on the thread reuses the same thread state. Call it
from code Bytewax runs on each worker thread while it builds the dataflow: the ``list_parts``
of a ``FixedPartitionedSource`` or ``FixedPartitionedSink`` and, to be safe, ``build_part``.

The contract and its limits:

- Idempotent per thread: the marker is a ``threading.local``, which lives exactly as long as
  the thread state it pins, so a later thread that reuses the native id is not mistaken for a
  pinned one.
- A no-op on the main thread (its thread state is never destroyed) and while the interpreter
  finalizes.
- On a thread started by :mod:`threading` it is harmless but useless: that thread deletes its
  thread state on exit whatever the counter says.
- The pinned thread state (a few KiB, and its ``threading.local`` values) outlives the engine
  thread until finalization: a process that runs many dataflows in turn keeps one per worker
  thread per run. Why, and what it measured: ``docs/design.md``, *core/threads.py*.
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
