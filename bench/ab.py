"""A/B of two commits in the same minutes: the benchmark run in each checkout, alternately.

This machine's speed moves by half within an hour (``pg_recvlogical`` itself), so a change
on the hot path is judged by pairs run back to back, never against a figure of another day:

    git worktree add --detach /tmp/old <commit>
    python -m bench.ab /tmp/old . --pairs 3 -- --quick --only mixed --deployments w1 --rows 100000

Each run is ``python -m bench <args> --out <dir>`` with this interpreter, in the checkout
(its ``bench`` and its walflow: the current directory comes first on ``sys.path``); the
order alternates (old new, new old, …) so that a drift of the machine falls on both. It
prints, per run and deployment of (a), changes/s, CPU µs per change (the process's and
each thread's) and ``pg_recvlogical``'s rate in the same run, then the medians and their
ratio new / old.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def _run(checkout: Path, args: list[str], out: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "bench", *args, "--out", str(out)], cwd=checkout,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the benchmark failed in {checkout} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    (results,) = out.glob("*.json")
    return json.loads(results.read_text())  # type: ignore[no-any-return]


def _figures(results: dict[str, Any], workload: str) -> dict[str, dict[str, float]]:
    """Per deployment: changes/s, CPU µs/change (and per thread of the slot's process), the source ceiling."""
    measured = results["workloads"][workload]
    out: dict[str, dict[str, float]] = {}
    shaped = measured.get("shaped", {}).get("walflow", {})  # --shaping: the same deployments, shaped
    runs = [*measured["walflow"].items(), *((f"{name} shaped", run) for name, run in shaped.items())]
    for name, run in runs:
        source = measured["source_ceiling"]["changes_per_s"]
        figures = {"changes/s": run["changes_per_s"], "µs/change": run["cpu_us_per_change"],
                   "pg_recvlogical/s": source, "× pg_recvlogical": run["changes_per_s"] / source}
        slot = run["processes"][run.get("slot_process") or 0]
        figures["slot's process µs"] = slot["cpu_us_per_change"]
        for thread in slot["threads"]:
            if thread["cpu_us_per_change"] >= 0.05:
                figures[f"{thread['name']} µs"] = thread["cpu_us_per_change"]
        out[name] = figures
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0],
                                     usage="python -m bench.ab OLD NEW [--pairs N] -- BENCH ARGUMENTS")
    parser.add_argument("old", type=Path, help="the old commit's checkout")
    parser.add_argument("new", type=Path, help="the new commit's checkout")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workload", default="mixed-100B")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    bench = argv[split + 1 :]  # after --: the benchmark's own arguments
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="walflow-ab-") as tmp:
        for i in range(args.pairs):
            for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                figures = _figures(_run(getattr(args, side), bench, Path(tmp) / f"{side}{i}"), args.workload)
                runs[side].append(figures)
                for deployment, values in figures.items():
                    shown = ", ".join(f"{k} {v:,.2f}" for k, v in values.items())
                    print(f"pair {i + 1} {side} {deployment}: {shown}", flush=True)
    print(f"\n| {args.workload}, medians of {args.pairs} | old | new | new / old |\n|---|--:|--:|--:|")
    for deployment in runs["old"][0]:
        for key in runs["old"][0][deployment]:
            old = statistics.median(r[deployment].get(key, 0.0) for r in runs["old"])
            new = statistics.median(r[deployment].get(key, 0.0) for r in runs["new"])
            print(f"| {deployment} {key} | {old:,.2f} | {new:,.2f} | {new / old if old else float('nan'):.2f} |")


if __name__ == "__main__":
    main()
