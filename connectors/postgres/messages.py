"""Logical messages: the trust boundary between what any database role may write and what walflow acts on.

Every role of a database may call ``pg_logical_emit_message``, and pgoutput hands every
message to every slot that streams messages. So a logical message is input, not a command:
walflow acts on one only after it has checked it, and nothing a message holds can stop
the flow, hold the slot back or make walflow publish what its config does not ask for.

- **Prefixes walflow does not own** (:data:`OWNED` lists the ones it does) are passed
  over by the decoder without copying their content or decoding their prefix as text.
- **Sizes are checked first**, on the message's length, before its content is copied:
  a message over its prefix's limit (:data:`LIMITS`) is ignored.
- **Content is validated against a strict schema** (types, sizes, known fields) by the
  module that owns the prefix: heartbeats (:mod:`connectors.postgres.heartbeat`), backfill
  signals (:mod:`connectors.postgres.signals`, then the config's rules in
  :mod:`connectors.postgres.backfill`), transaction annotations (JSON of any depth is
  published as that JSON, anything else as null: :mod:`transforms.envelope`). A decode returns a value or
  a reason it is not one; it never raises.
- **What is ignored is said**: ``walflow_ignored_messages_total{prefix,reason}`` counts
  each, and one warning per prefix and reason at most every :data:`WARN_EVERY` seconds
  says how many were ignored and why (never their content: it may be anyone's).

Messages another walflow deployment wrote for its own slot, and this slot's own
heartbeats from an earlier run, are not ignored input but someone else's: passed over
without a word.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final, Literal

from core.metrics import Metrics

log = logging.getLogger("walflow.postgres")

HEARTBEAT: Final = "walflow.heartbeat"
BACKFILL: Final = "walflow.backfill"
#: Sequin's prefixes for annotating a transaction's changes (as its slot producer reads them).
ANNOTATIONS_SET: Final = "sequin:transaction_annotations.set"
ANNOTATIONS_CLEAR: Final = "sequin:transaction_annotations.clear"

#: The largest content walflow reads under each prefix it owns: a heartbeat is ~60 bytes, a
#: signal a few hundred (its cursor holds key texts, which an index keeps under 2.7 kB each),
#: annotations are copied into every message of their transaction (Sequin's are small JSON).
LIMITS: Final[dict[bytes, int]] = {
    HEARTBEAT.encode(): 1024,
    BACKFILL.encode(): 64 * 1024,
    ANNOTATIONS_SET.encode(): 64 * 1024,
    ANNOTATIONS_CLEAR.encode(): 64 * 1024,
}
OWNED: Final = frozenset(LIMITS)

#: Why a message was ignored: the ``reason`` label's values (a bounded set).
Reason = Literal["too_large", "malformed", "unauthenticated", "refused", "too_many"]
#: How often the warning for one prefix and reason may be repeated (seconds).
WARN_EVERY: Final = 60.0


class IgnoredMessages:
    """Counts and reports the logical messages a slot's reader ignores (thread-safe: the
    reader thread and the source partition's worker both report here)."""

    def __init__(self, slot: str, metrics: Metrics) -> None:
        self.slot = slot
        self._counter = metrics.ignored_messages
        self._lock = threading.Lock()
        #: (prefix, reason) -> (when the last warning was logged, how many since)
        self._warned: dict[tuple[str, str], tuple[float, int]] = {}

    def __call__(self, prefix: str, reason: Reason, detail: str = "") -> None:
        """One message under ``prefix`` (one walflow owns) was ignored for ``reason``;
        ``detail`` says why in walflow's words (never the message's content)."""
        self._counter.labels(prefix, reason).inc()
        now = time.monotonic()
        with self._lock:
            last, since = self._warned.get((prefix, reason), (None, 0))
            if last is not None and now - last < WARN_EVERY:
                self._warned[prefix, reason] = (last, since + 1)
                return
            self._warned[prefix, reason] = (now, 0)
        more = f" ({since} more since the last warning)" if since else ""
        log.warning("slot %s: ignored a logical message under prefix %s: %s%s%s", self.slot, prefix, reason,
                    f": {detail}" if detail else "", more)
