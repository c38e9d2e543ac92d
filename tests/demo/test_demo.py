"""``./run.sh demo`` headless: it prints events as they arrive, stops by itself, leaves nothing behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.pipeline import ROOT


def _cmdlines() -> list[str]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return out


def test_demo_shows_changes_flowing_and_cleans_up() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "demo", "--seconds", "9"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "the pipeline is streaming" in out
    for action in ("insert public.customers", "insert public.orders", "update public.orders", "delete public.orders"):
        assert action in out, out
    assert re.search(r"subject=walflow\.demo\.public\.orders\.update\s+commit_lsn=\d+", out)
    count = re.search(r"walflow demo: (\d+) events arrived", out)
    assert count and int(count.group(1)) >= 8
    pg_port = re.search(r"PostgreSQL on 127\.0\.0\.1:(\d+)", out)
    assert pg_port
    leftovers = [c for c in _cmdlines() if f"port={pg_port.group(1)}" in c or "dataflows.cdc" in c]
    assert leftovers == []
