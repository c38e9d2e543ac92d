"""Preparing Bytewax's recovery directory, so ``-r DIR`` works on a first start too.

``bytewax.run`` parses its flags before it imports the dataflow module, and opens the
recovery directory only after: the module can prepare it. Several processes of a cluster
start at once and ``python -m bytewax.recovery`` run twice fails with ``database is
locked``, so the directory is built once, under a lock, in a temporary name that is
renamed into place.

The snapshots are pickles of the flow's state (rows' keys and values before masking, among
them): whoever can write them runs code in walflow, whoever can read them reads the data.
The directory is made ``0700`` (its parent too when walflow makes it) and its files
``0600``; an existing directory that others may enter is warned about with the ``chmod``
to run.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import shlex
import shutil
import stat
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
    """Create ``directory`` with ``partitions`` recovery partitions unless it exists, readable
    by this user only; warn when an existing one is open to others."""
    if directory.exists():
        _warn_if_open(directory)
        return
    previous = os.umask(0o077)  # process-wide, for as long as this runs: the lock, the partitions' files
    try:
        directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(directory.parent / f".{directory.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if directory.exists():  # another process of the cluster made it meanwhile
                return
            building = directory.parent / f".{directory.name}.building-{os.getpid()}"
            shutil.rmtree(building, ignore_errors=True)
            building.mkdir(mode=0o700)
            init_db_dir(building, partitions)
            building.rename(directory)
    finally:
        os.umask(previous)
    log.info("prepared recovery directory %s with %d partitions", directory, partitions)


def _warn_if_open(directory: Path) -> None:
    mode = stat.S_IMODE(directory.stat().st_mode)
    if mode & 0o077:
        log.warning("recovery directory %s is open to other users (mode %o): its snapshots hold the rows before "
                    "masking; run: chmod -R go= %s", directory, mode, shlex.quote(str(directory)),
                    extra={"directory": str(directory), "mode": f"{mode:o}"})
