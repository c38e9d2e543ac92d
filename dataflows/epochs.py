"""walflow's epoch length under ``python -m bytewax.run dataflows.cdc`` when no ``-s`` is given.

An epoch is the unit the flow confirms the slot by and the unit the source may run ahead
of the sinks across workers (``connectors/postgres/source.py``: at most the epoch budget,
``walflow.max_memory_mb``, per epoch). Bytewax's own default of 10 s, used when neither
``-s`` nor ``BYTEWAX_SNAPSHOT_INTERVAL`` is given and recovery is off, made the mission's
own command a third as fast as ``./run.sh run`` (the budget per 10 s capped the rate) and
left the slot 10–20 s behind. So the flow sets its own default, the same as
``./run.sh run``'s: :data:`EPOCH_INTERVAL`. A flag or the variable given still wins, and
with ``-r`` Bytewax requires ``-s`` anyway.

How: ``bytewax.run`` (0.21.1, pinned) parses its flags into the module-level dict
``kwargs`` of its ``__main__``, imports the dataflow module, then calls
``cli_main(**kwargs)``; the import is where the flow can set ``kwargs["epoch_interval"]``.
That shape is checked, not assumed: if it differs (another Bytewax), the epoch stays
Bytewax's and a warning says to pass ``-s 1``. Pinned by ``tests/dataflows/test_epochs.py``.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from typing import Final

log = logging.getLogger("walflow.flow")

#: The epoch length walflow runs with when the command gives none (``./run.sh run``'s ``-s 1``).
EPOCH_INTERVAL: Final = timedelta(seconds=1)


def apply_default_epoch() -> timedelta | None:
    """Under ``bytewax.run`` with no epoch length given and no recovery: make the run's epochs
    :data:`EPOCH_INTERVAL` long. Returns the epoch length set, None when it left it alone."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if main is None or spec is None or spec.name != "bytewax.run":
        return None  # run_main / cluster_main / the testing runner: the caller chose the epoch
    parsed = getattr(main, "kwargs", None)
    if not isinstance(parsed, dict) or "epoch_interval" not in parsed or not hasattr(main, "snapshot_interval"):
        log.warning("bytewax.run no longer looks as walflow expects (Bytewax 0.21.1): its epochs stay at its "
                    "own default; pass -s 1 for walflow's 1 s epochs")
        return None
    if main.snapshot_interval is not None or parsed.get("recovery_config") is not None:
        return None  # -s or BYTEWAX_SNAPSHOT_INTERVAL given (and always with -r): it wins
    parsed["epoch_interval"] = EPOCH_INTERVAL
    return EPOCH_INTERVAL
