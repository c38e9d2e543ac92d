"""How the flow fits the ``python -m bytewax.run`` that runs it: its epoch length, and where
a cluster's sink partitions go.

``bytewax.run`` (0.21.1, pinned) parses its flags into the module-level dict ``kwargs`` of
its ``__main__``, imports the dataflow module, then calls ``cli_main(**kwargs)``: the import
is where the flow reads the run's shape and may set its epoch length. That shape is
checked, not assumed (:func:`run_kwargs`); pinned by ``tests/dataflows/test_engine_run.py``.

**Epochs.** An epoch is the unit the flow confirms the slot by and the unit the source may
run ahead of the sinks across workers (``connectors/postgres/source.py``: at most the epoch
budget, ``walflow.max_memory_mb``, per epoch). Bytewax's own default of 10 s, used when
neither ``-s`` nor ``BYTEWAX_SNAPSHOT_INTERVAL`` is given and recovery is off, made the
mission's own command a third as fast as ``./run.sh run`` (the budget per 10 s capped the
rate) and left the slot 10–20 s behind. So the flow sets its own default, the same as
``./run.sh run``'s: :data:`EPOCH_INTERVAL`. A flag or the variable given still wins, and
with ``-r`` Bytewax requires ``-s`` anyway. If ``bytewax.run`` does not look as expected
(another Bytewax), the epoch stays Bytewax's and a warning says to pass ``-s 1``.

**Placement.** A cluster's processes share the slots: the k-th slot in name order is
listed (``list_parts``) by process ``k % processes`` only, so Bytewax gives it to one of
that process's workers, and slots spread over processes before they share one. When there
are fewer slots than processes, the processes that read a slot take no sink partitions
(a process that lists none of a sink's partitions gets none): they do only the serial part
(decode, filter, group key, pack) and the others convert, envelope and publish
(:func:`publishes_here`). Otherwise every process publishes.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final, NamedTuple

log = logging.getLogger("walflow.flow")

#: What walflow reads of bytewax.run's parsed flags.
_EXPECTED: Final = frozenset({"epoch_interval", "recovery_config", "process_id", "workers_per_process"})

#: The epoch length walflow runs with when the command gives none (``./run.sh run``'s ``-s 1``).
EPOCH_INTERVAL: Final = timedelta(seconds=1)


def run_kwargs() -> dict[str, Any] | None:
    """The parsed flags of the ``bytewax.run`` this process runs under, None under another runner."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if main is None or spec is None or spec.name != "bytewax.run":
        return None  # run_main / cluster_main / the testing runner: the caller chose
    parsed = getattr(main, "kwargs", None)
    if not isinstance(parsed, dict) or not _EXPECTED <= parsed.keys() or not hasattr(main, "snapshot_interval"):
        log.warning("bytewax.run no longer looks as walflow expects (Bytewax 0.21.1): epochs stay at its own "
                    "default (pass -s 1 for walflow's 1 s) and every process of a cluster publishes")
        return None
    return parsed


def apply_default_epoch() -> timedelta | None:
    """Under ``bytewax.run`` with no epoch length given and no recovery: make the run's epochs
    :data:`EPOCH_INTERVAL` long. Returns the epoch length set, None when it left it alone."""
    parsed = run_kwargs()
    if parsed is None or getattr(sys.modules["__main__"], "snapshot_interval", None) is not None:
        return None  # another runner, or -s / BYTEWAX_SNAPSHOT_INTERVAL given: it wins
    if parsed.get("recovery_config") is not None:
        return None  # -r requires -s
    parsed["epoch_interval"] = EPOCH_INTERVAL
    return EPOCH_INTERVAL


class Cluster(NamedTuple):
    """This process's place in the run: its index, how many processes, workers in each."""

    process: int = 0
    processes: int = 1
    workers_per_process: int = 1


def this_cluster() -> Cluster:
    """The cluster ``bytewax.run`` was started as (``-i``, ``-a``, ``-w``); one process otherwise."""
    parsed = run_kwargs()
    if parsed is None:
        return Cluster()
    addresses = parsed.get("addresses") or []
    return Cluster(int(parsed.get("process_id") or 0), max(1, len(addresses)),
                   int(parsed.get("workers_per_process") or 1))


def slots_here(cluster: Cluster, slots: Sequence[str]) -> frozenset[str]:
    """The slots this process reads: the k-th in name order goes to process ``k % processes``."""
    return frozenset(name for k, name in enumerate(sorted(slots)) if k % cluster.processes == cluster.process)


def publishes_here(cluster: Cluster, slots: int) -> bool:
    """Whether this process takes sink partitions (see the module docstring): when there are
    fewer slots than processes, only the processes that read none."""
    return slots >= cluster.processes or cluster.process >= slots
