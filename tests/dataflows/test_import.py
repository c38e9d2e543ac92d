"""Importing the dataflow module connects to nothing: ``flow`` is built when ``bytewax.run`` asks for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WALFLOW_CONFIG": str(config)}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_importing_the_flow_module_reads_no_config_and_opens_no_connection(tmp_path: Path) -> None:
    missing = tmp_path / "no-such.yaml"  # were the flow built at import, this would stop it (exit 2)
    done = _python("import dataflows.cdc as cdc; assert 'flow' not in vars(cdc); print('imported')", missing)
    assert (done.returncode, done.stdout.strip()) == (0, "imported"), done.stderr


def test_asking_for_the_flow_builds_it(tmp_path: Path) -> None:
    done = _python("import dataflows.cdc as cdc; cdc.flow", tmp_path / "no-such.yaml")
    assert done.returncode == 2  # it was built now: the missing config stops it with one line
    assert done.stderr.startswith("walflow: "), done.stderr
