"""Loaded by walflow's processes under the benchmark only (``bench/walflow.py`` puts this
directory first on their ``PYTHONPATH``): each :mod:`threading` thread gets its Python name
as its OS thread name, so that ``/proc/<pid>/task/<tid>/comm`` tells walflow's threads apart.

CPython 3.11 and 3.12 leave every thread they start named like the executable
(``python``); Bytewax's own threads (``timely:work-0`` …) are named by Rust. The name is
the thread's with ``walflow-`` dropped, cut to the kernel's 15 bytes: ``reader-<slot>``,
``heartbeat-<slot>``, ``async``, ``health``. One ``prctl`` per thread start, on the new
thread, before its target runs; nothing else in the process changes.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

_PR_SET_NAME = 15
_COMM_BYTES = 15

try:
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: names stay as they are
    _prctl = None


def os_name(name: str) -> bytes:
    """The OS thread name for a Python thread's name."""
    return name.removeprefix("walflow-").encode("utf-8", "replace")[:_COMM_BYTES]


_bootstrap_inner: Any = getattr(threading.Thread, "_bootstrap_inner", None)


def _named_bootstrap_inner(self: threading.Thread) -> None:
    try:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(os_name(self.name)), 0, 0, 0)
    except Exception:  # noqa: BLE001, S110 - a name is an aid, never a reason for a thread to fail
        pass
    _bootstrap_inner(self)


if _prctl is not None and _bootstrap_inner is not None:
    threading.Thread._bootstrap_inner = _named_bootstrap_inner  # type: ignore[attr-defined]
