"""Where each µs of a change goes: a py-spy profile spread over the bench's per-thread CPU.

``BENCH_PYSPY=<py-spy> ./run.sh bench …`` records each walflow process with ``py-spy record
--gil --threads -f raw`` (``bench/walflow.py``): a sample is taken of whichever thread holds
the GIL, so a thread's samples are its Python CPU. The bench measures each thread's CPU per
change from ``/proc``. This spreads each thread's µs per change over the files its samples
were in (self time: the innermost frame), so that the README's table says how many µs of a
change each part of walflow costs:

    python -m bench.profile bench/results/<run>.json WF_MIXED_100B_W1.0.txt [--run w1]

With ``BENCH_PYSPY_NATIVE=1`` py-spy records C frames too, and a compiled module's functions
count to its source file (mypyc's C names say which). Samples whose innermost frame is not
walflow's own code are summed under the library they are in (``asyncio``, ``nats``,
``bytewax``); a thread's CPU outside the GIL (libpq, socket calls, Bytewax's Rust waiting)
has no samples of its own and is spread with the rest: the figures are a thread's CPU in
proportion to its Python, not a measure of each file alone.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from core import compiled

#: py-spy's frame: ``function (path/to/file.py:line)``.
_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")
#: The top-level directories of walflow's own code: a frame in one is named by its file.
_OWN = ("connectors", "core", "transforms", "dataflows", "config")
#: py-spy's thread label: ``thread (11330): walflow-async``, or ``thread (11330)`` when it
#: found no name (Bytewax's Rust-made worker threads; now and then a named one).
_THREAD = re.compile(r"^thread \((?P<tid>\w+)\)(?:: (?:walflow-)?(?P<name>.+))?$")
#: A function of the compiled hot path, as mypyc names it in C: the module's last name first.
_NATIVE = re.compile(r"^CPy(?:Def|Py|L)_(?P<module>[a-z_]+?)___")
#: The compiled modules by their last name (each is unique: core/compiled.py's MODULES).
_COMPILED = {Path(source).stem: source for source in compiled.MODULES}
#: Frames of starting up (importing, building the flow): not part of a change's cost, which
#: the bench measures from the first to the last message stored.
_STARTUP = ("_locate_dataflow", "<frozen importlib")


def _compiled(function: str) -> str | None:
    """The source of a function of the compiled hot path (core/compiled.py), named by mypyc
    ``CPyDef_<module>___<name>`` (also ``CPyPy_``, ``CPyL_``, the wrapper and its lambdas)."""
    match = _NATIVE.match(function)
    return None if match is None else _COMPILED.get(match.group("module"))


def _python(path: str) -> bool:
    """Whether a frame is Python's (a file of source, or what Python made) rather than C or Rust."""
    return path.endswith(".py") or path.startswith("<")


def _attributed(frames: list[str]) -> str:
    """Where a sample's CPU goes: its innermost frame that is walflow's (Python or compiled) or
    Python's; C below it (libpython, libc, a library's extension: with ``--native``) counts to it.
    No such frame: the engine's Rust, holding the GIL (pickling, calling a step)."""
    for frame in reversed(frames):
        match = _FRAME.match(frame)
        function, path = (match.group("function"), match.group("path")) if match else (frame, frame)
        if (source := _compiled(function)) is not None:
            return source
        if _python(path):
            return _where(path)
    return "bytewax"


def _where(path: str) -> str:
    """The file a Python frame is in, as walflow's path, or the library it belongs to."""
    for own in _OWN:
        at = path.find(f"/{own}/")
        if at >= 0 or path.startswith(f"{own}/"):
            return path[at + 1 :] if at >= 0 else path
    if path == "run.py":  # bytewax.run's frame: the engine's Rust, holding the GIL
        return "bytewax"
    parts = [p for p in re.split(r"[/\\]", path) if p]  # py-spy shortens a library's path to its package's
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    return parts[0] if parts else "?"


def samples(raw: Path) -> dict[str, Counter[str]]:
    """Per thread name, the samples of each file (innermost frame)."""
    by_tid: dict[str, Counter[str]] = {}
    names: dict[str, str] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        label = _THREAD.match(stack.split(";", 1)[0])
        if label is None or not count.isdigit():
            continue
        if label.group("name"):
            names[label.group("tid")] = label.group("name")
        frames = stack.split(";")[1:]
        if any(marker in frame for frame in frames for marker in _STARTUP):
            continue
        by_tid.setdefault(label.group("tid"), Counter())[_attributed(frames)] += int(count)
    out: dict[str, Counter[str]] = {}
    for tid, counts in by_tid.items():
        name = names.get(tid, "timely")  # never named: a Bytewax worker thread
        out.setdefault("main" if name == "MainThread" else name, Counter()).update(counts)
    return out


def table(run: dict[str, Any], profile: dict[str, Counter[str]], top: int = 8) -> list[str]:
    """Markdown rows: per thread of the run's first process (the slot's, in a cluster), its µs
    per change by file."""
    process = run["processes"][0]
    rows = ["| thread | µs/change | where (µs/change) |", "|---|--:|---|"]
    for thread in process["threads"]:
        us = float(thread["cpu_us_per_change"])
        if us < 0.05:
            continue
        name = str(thread["name"]).removeprefix("walflow-")
        # /proc's names are cut at 15 bytes (reader-wf_nofla), py-spy's are whole
        counts = (profile.get(name) or profile.get(name.split(":")[0])
                  or next((found for whole, found in profile.items() if whole.startswith(name)), Counter()))
        total = sum(counts.values())
        parts = [f"{where} {us * n / total:.1f}" for where, n in counts.most_common(top)] if total else []
        rest = us * sum(n for _, n in counts.most_common()[top:]) / total if total else us
        if rest >= 0.05:
            parts.append(f"other {rest:.1f}")
        rows.append(f"| {name} | {us:.1f} | {', '.join(parts)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the bench's results JSON")
    parser.add_argument("profile", type=Path, help="py-spy's raw output for the run's first process")
    parser.add_argument("--workload", default="mixed-100B")
    parser.add_argument("--run", default="w1", help="the deployment [w1]")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    run = results["workloads"][args.workload]["walflow"][args.run]
    print("\n".join(table(run, samples(args.profile))))


if __name__ == "__main__":
    main()
