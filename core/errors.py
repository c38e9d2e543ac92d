"""One error taxonomy: every failure walflow reports is fatal or transient, decided where it is raised.

- :class:`FatalError`: an operator must act (a wrong config, a missing privilege, an
  invalidated slot, a message JetStream will never take). Its message is one line that says
  what happened and what to do; the pipeline stops with exit status 2
  (:meth:`core.runtime.Runtime.fatal`), and nothing past the problem is confirmed, so a
  restart after the fix loses nothing.
- :class:`TransientError`: passes by itself (a restarted server, a network reset, a slot
  still held by a previous connection). The part that met it retries with capped backoff,
  resuming exactly where it was.

Library exceptions (psycopg, nats-py) are translated into one of the two at the connector
boundary that knows what they mean; code above it looks at the class only.
"""

from __future__ import annotations


class WalflowError(Exception):
    """Any failure walflow classified."""


class FatalError(WalflowError):
    """An operator must act; the message says what to do. Stops the pipeline (exit 2)."""


class InternalError(FatalError):
    """Something walflow did not foresee escaped a step: a bug. Stops the pipeline like any
    fatal error (nothing past it confirmed), with one line instead of a traceback."""


class TransientError(WalflowError):
    """Passes by itself: retried with backoff by the part that met it."""


class ValueFree(Exception):
    """Marks an exception whose text walflow wrote from the config, names, types and positions
    alone, never from a row's values: a dead letter, a fatal line and a log line say it as it
    is. Any other exception met by a step that sees a row's values (filters, enrichment,
    transforms, routing) is said by its type alone, since its text may quote them
    (``transforms/render.py``)."""
