"""``./run.sh demo`` headless: it prints events as they arrive, stops by itself, leaves nothing behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline import ROOT


def _processes() -> list[tuple[str, str]]:
    """(command line, WALFLOW_CONFIG) of every process this user may read."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        config = next((e.split(b"=", 1)[1].decode(errors="replace") for e in environ
                       if e.startswith(b"WALFLOW_CONFIG=")), "")
        out.append((cmdline, config))
    return out


@pytest.mark.slow
@pytest.mark.servers
def test_demo_shows_changes_flowing_and_cleans_up() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "demo", "--seconds", "9"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "the pipeline is streaming" in out
    for action in ("read   public.customers", "insert public.customers", "insert public.orders", "update public.orders",
                   "delete public.orders"):
        assert action in out, out
    assert re.search(r"subject=sequin\.demo\.public\.orders\.update\s+commit_lsn=\d+", out)
    count = re.search(r"walflow demo: (\d+) events arrived", out)
    assert count and int(count.group(1)) >= 8
    pg_port = re.search(r"PostgreSQL on 127\.0\.0\.1:(\d+), NATS on nats://127\.0\.0\.1:\d+\n", out)
    assert pg_port, out  # where NATS listens, without its login
    # the demo's own servers and pipeline (other pipelines may be running on this machine meanwhile)
    leftovers = [c for c, config in _processes() if f"port={pg_port.group(1)}" in c
                 or ("dataflows.cdc" in c and config.endswith("/walflow-demo.yaml"))]
    assert leftovers == []
