"""Preparing Bytewax's recovery directory, so ``-r DIR`` works on a first start too.

``bytewax.run`` parses its flags before it imports the dataflow module, and opens the
recovery directory only after: the module can prepare it. Several processes of a cluster
start at once and ``python -m bytewax.recovery`` run twice fails with ``database is
locked``, so the directory is built once, under a lock, in a temporary name that is
renamed into place.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from bytewax.recovery import init_db_dir

log = logging.getLogger("walflow.recovery")


def recovery_dir(argv: Sequence[str], env: Mapping[str, str]) -> Path | None:
    """The ``-r``/``--recovery-directory`` that ``bytewax.run`` was given, if any."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-r", "--recovery-directory")
    known, _ = parser.parse_known_args(list(argv))
    value = known.recovery_directory or env.get("BYTEWAX_RECOVERY_DIRECTORY")
    return Path(value) if value else None


def prepare(directory: Path, partitions: int) -> None:
    """Create ``directory`` with ``partitions`` recovery partitions unless it exists."""
    if directory.exists():
        return
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if directory.exists():  # another process of the cluster made it meanwhile
            return
        building = directory.parent / f".{directory.name}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        init_db_dir(building, partitions)
        building.rename(directory)
    log.info("prepared recovery directory %s with %d partitions", directory, partitions)
