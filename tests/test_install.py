"""The install is locked and minimal (README: Setup): ``requirements/*.lock`` pin every package
with the sha256 of its files, each venv that ``./run.sh setup`` makes holds exactly one lock's
pins, the runtime lock is exactly the closure of pyproject's ``dependencies`` (no test or bench
package reaches ``.venv-runtime``), and the commands that run walflow never install anything.

The venvs are checked as installed (importlib.metadata), the closure from the metadata of the
distributions themselves, so a dependency that a new release adds shows up here, not in
production.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: The one distribution in a venv that no lock pins: the venv's own pip (from the interpreter's
#: ensurepip; setup never upgrades it, as that would be an unlocked download).
UNLOCKED = frozenset({"pip"})
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Pin:
    """One requirement of a lock file: ``name==version [; marker]`` and its hashes."""

    name: str
    version: str
    marker: Marker | None
    hashes: tuple[str, ...]


def read_lock(name: str) -> list[Pin]:
    """The pins of ``requirements/NAME``; anything but ``==`` pins with sha256 hashes fails here."""
    pins = []
    text = (LOCKS / name).read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, options = line.partition(" --")
        options = "--" + options if options else ""
        hashes = tuple(HASH.findall(options))
        assert hashes and HASH.sub("", options).strip() == "", f"{name}: {line!r} needs --hash=sha256: and nothing else"
        requirement = Requirement(spec)
        (specifier, *more) = requirement.specifier
        assert specifier.operator == "==" and not more and "*" not in specifier.version, f"{name}: {spec!r} is no pin"
        pins.append(Pin(canonicalize_name(requirement.name), specifier.version, requirement.marker, hashes))
    assert pins, f"{name} pins nothing"
    return pins


def applicable(pins: Iterable[Pin], environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """name → version of the pins whose markers hold here (one per name: a lock forks by markers only)."""
    out: dict[str, str] = {}
    for pin in pins:
        if pin.marker is None or pin.marker.evaluate(dict(environment or {})):
            assert pin.name not in out, f"{pin.name} pinned twice for one environment"
            out[pin.name] = pin.version
    return out


def closure(requirements: Iterable[str]) -> set[str]:
    """Every distribution that ``requirements`` need here, extras included, from installed metadata."""
    wanted: dict[str, set[str]] = {}

    def visit(requirement: Requirement, extras: set[str]) -> None:
        if requirement.marker is not None and not any(requirement.marker.evaluate({"extra": e}) for e in extras):
            return
        name = canonicalize_name(requirement.name)
        new = ({""} | requirement.extras) - wanted.setdefault(name, set())
        if new:
            wanted[name] |= new
            for line in importlib.metadata.requires(name) or []:
                visit(Requirement(line), new)

    for line in requirements:
        visit(Requirement(line), {""})
    return set(wanted)


def installed(python: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """name → versions of the distributions in ``python``'s environment, and its marker variables
    that can differ between two venvs on one machine (the Python version)."""
    script = (
        "import importlib.metadata as m, json, platform, sys\n"
        "dists = {}\n"
        "for d in m.distributions(): dists.setdefault(d.metadata['Name'], []).append(d.version)\n"
        "print(json.dumps([dists, {'python_full_version': platform.python_version(),"
        " 'python_version': '.'.join(platform.python_version_tuple()[:2])}]))\n"
    )
    # -I: the venv's own site-packages only, not this checkout on sys.path (its walflow.egg-info)
    result = subprocess.run([python, "-I", "-c", script], capture_output=True, text=True, check=True)
    dists, environment = json.loads(result.stdout)
    return {canonicalize_name(k): sorted(set(v)) for k, v in dists.items()}, environment


@pytest.mark.parametrize("lock", ["build.lock", "runtime.lock", "dev.lock"])
def test_every_lock_line_is_a_pin_with_hashes(lock: str) -> None:
    assert read_lock(lock)


@pytest.mark.parametrize(
    ("venv", "lock"),
    [(".venv", "dev.lock"), (".venv-runtime", "runtime.lock")],
)
def test_a_venv_holds_exactly_its_locks_pins(venv: str, lock: str) -> None:
    python = ROOT / venv / "bin" / "python"
    assert python.exists(), f"{venv}/ is missing: ./run.sh setup makes it"
    dists, environment = installed(python)
    want = applicable(read_lock(lock), environment) | applicable(read_lock("build.lock"), environment)
    want[canonicalize_name(PROJECT["name"])] = PROJECT["version"]
    got = {name: versions for name, versions in dists.items() if name not in UNLOCKED}
    assert got == {name: [version] for name, version in want.items()}


def test_the_runtime_lock_is_exactly_the_closure_of_pyprojects_dependencies() -> None:
    pins = applicable(read_lock("runtime.lock"))
    assert set(pins) == closure(PROJECT["dependencies"])
    for line in PROJECT["dependencies"]:
        requirement = Requirement(line)
        assert requirement.specifier.contains(pins[canonicalize_name(requirement.name)]), line


def test_the_dev_lock_is_the_runtime_lock_plus_the_closure_of_the_test_and_bench_extras() -> None:
    dev = applicable(read_lock("dev.lock"))
    extras = PROJECT["optional-dependencies"]
    assert set(dev) == closure([*PROJECT["dependencies"], *extras["test"], *extras["bench"]])
    runtime = applicable(read_lock("runtime.lock"))
    assert {name: dev[name] for name in runtime} == runtime
    for line in [*extras["test"], *extras["bench"]]:
        requirement = Requirement(line)
        assert requirement.specifier.contains(dev[canonicalize_name(requirement.name)]), line


def _copy(tmp_path: Path) -> Path:
    """run.sh with what it reads to judge .venv-runtime, in a directory of its own."""
    shutil.copy(ROOT / "run.sh", tmp_path)
    shutil.copytree(LOCKS, tmp_path / "requirements")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "walflow.yaml").write_text("")
    return tmp_path


def _fake_runtime_venv(copy: Path, stamp: str) -> None:
    """A .venv-runtime whose python is this one, except that running anything with ``-m`` or a
    command of its own only prints what it was asked: what ``./run.sh`` hands it is the outcome."""
    bin_dir = copy / ".venv-runtime" / "bin"
    bin_dir.mkdir(parents=True)
    stub = f'#!/bin/sh\ncase "$1" in -c) exec {sys.executable} "$@" ;; esac\necho "ran $0 $*"\n'
    for name in ("python", "walflow"):
        (bin_dir / name).write_text(stub)
        (bin_dir / name).chmod(0o755)
    (copy / ".venv-runtime" / ".walflow-setup").write_text(stamp + "\n")


def _run_sh(copy: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    # Any pip download would fail at once: nothing listens on port 9.
    env = {**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/", "PIP_NO_INDEX": "1"}
    return subprocess.run(["bash", str(copy / "run.sh"), *argv], cwd=copy, capture_output=True, text=True,
                          env=env, timeout=60, check=False)


COMMANDS = [["run", "walflow.yaml"], ["check", "walflow.yaml"], ["status", "walflow.yaml"],
            ["backfill", "walflow.yaml", "--sink", "s", "--table", "public.t"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_a_runtime_command_without_a_runtime_venv_asks_for_setup(tmp_path: Path, argv: list[str]) -> None:
    copy = _copy(tmp_path)
    result = _run_sh(copy, *argv)
    assert result.returncode == 1
    assert result.stderr == (f"walflow: .venv-runtime/ is not set up; run ./run.sh setup first (it downloads the locked"
                             f" packages; ./run.sh {argv[0]} never does)\n")
    assert not (copy / ".venv-runtime").exists()


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_a_runtime_command_with_a_stale_runtime_venv_refuses_and_installs_nothing(tmp_path: Path,
                                                                                   argv: list[str]) -> None:
    copy = _copy(tmp_path)
    _fake_runtime_venv(copy, "0" * 64)
    before = sorted(p.relative_to(copy) for p in (copy / ".venv-runtime").rglob("*"))
    result = _run_sh(copy, *argv)
    assert result.returncode == 1
    assert result.stderr == (f"walflow: .venv-runtime/ is out of date with requirements/runtime.lock or pyproject.toml;"
                             f" run ./run.sh setup (it downloads; ./run.sh {argv[0]} never does)\n")
    assert sorted(p.relative_to(copy) for p in (copy / ".venv-runtime").rglob("*")) == before


def test_run_with_a_current_runtime_venv_starts_the_flow_from_it(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    parts = [(copy / "requirements" / "build.lock"), (copy / "requirements" / "runtime.lock"), copy / "pyproject.toml"]
    _fake_runtime_venv(copy, hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest())
    result = _run_sh(copy, "run", "walflow.yaml", "-w", "2")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"ran {copy}/.venv-runtime/bin/python -m bytewax.run dataflows.cdc -w 2\n"
