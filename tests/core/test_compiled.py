"""The compiled hot path (core/compiled.py): what ``./run.sh setup`` builds is what runs, and the
pure-Python modules, its reference and fallback, pass the same unit tests.

The suite itself runs on whichever the process imports (compiled where built); the pure leg runs
the unit tests of every compiled module again in a child with ``WALFLOW_PURE_PYTHON=1``, as
psycopg tests its C and Python implementations with one suite.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core import compiled
from embedded import wait_for
from tests.harness import Database, Nats, TestNames
from tests.pipeline import assert_running, pipeline, stored, write_config

ROOT = compiled.ROOT
#: The unit tests that exercise the compiled modules (their servers' tests are left out: a pure
#: leg of those would double the suite's time for code the unit tests already cover).
UNIT_TESTS = ("tests/core", "tests/transforms", "tests/connectors/postgres/test_decoder.py",
              "tests/connectors/postgres/test_types.py", "tests/connectors/postgres/test_pgoutput_reference.py",
              "tests/connectors/postgres/test_json.py", "tests/connectors/postgres/test_source_values.py",
              "tests/connectors/nats/test_window.py", "tests/connectors/nats/test_acks.py",
              "tests/connectors/nats/test_direct_parser.py")


def _name(source: str) -> str:
    return source.removesuffix(".py").replace("/", ".")


def _pure_env() -> dict[str, str]:
    return {**os.environ, compiled.PURE_PYTHON_VARIABLE: "1"}


def test_every_compiled_module_exists_and_its_package_extends_its_path() -> None:
    for source in compiled.MODULES:
        assert (ROOT / source).is_file(), source
        package = (ROOT / source).parent / "__init__.py"
        assert "extend(__path__, __name__)" in package.read_text(), f"{package} does not call core.compiled.extend"


def test_the_digest_changes_with_any_byte_of_a_compiled_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edited source is a build of other sources: never imported as the old one's."""
    for source in compiled.MODULES:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_bytes((ROOT / source).read_bytes())
    monkeypatch.setattr(compiled, "ROOT", tmp_path)
    assert compiled.digest() == (before := compiled.digest())
    edited = tmp_path / compiled.MODULES[-1]
    edited.write_bytes(edited.read_bytes() + b"\n")
    assert compiled.digest() != before


@pytest.mark.skipif(os.environ.get(compiled.PURE_PYTHON_VARIABLE) == "1", reason="the pure leg")
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler: pure Python")
def test_where_a_compiler_exists_the_suite_runs_the_compiled_modules() -> None:
    assert compiled.implementation() == "compiled", (
        f"{compiled.implementation()}: run ./run.sh setup (it builds the hot path after any edit of "
        f"{', '.join(compiled.MODULES)})")
    for source in compiled.MODULES:
        module = importlib.import_module(_name(source))
        assert module.__file__ is not None and not module.__file__.endswith(".py"), module.__file__


def test_the_pure_python_variable_imports_the_sources() -> None:
    names = [_name(source) for source in compiled.MODULES]
    code = ("import importlib, core.compiled as c; "
            f"print(c.implementation()); print(*[importlib.import_module(n).__file__ for n in {names!r}], sep='\\n')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_pure_env(), capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    assert out[0] == f"pure Python ({compiled.PURE_PYTHON_VARIABLE}=1)"
    assert [Path(file) for file in out[1:]] == [ROOT / source for source in compiled.MODULES]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(compiled.PURE_PYTHON_VARIABLE) == "1", reason="the pure leg itself")
def test_the_pure_python_modules_pass_the_same_unit_tests() -> None:
    if compiled.implementation() != "compiled":
        pytest.skip("this run is the pure-Python one already")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0",
         "-m", "not servers and not alone", *UNIT_TESTS], check=False, cwd=ROOT, env=_pure_env(), capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("pure", [False, True], ids=["as-built", "pure-python"])
def test_the_pipeline_streams_either_way_and_says_when_it_runs_pure_python(
    tmp_path: Path, database: Database, nats_srv: Nats, names: TestNames, pure: bool
) -> None:
    with database.connect() as conn:
        conn.execute("CREATE TABLE hot (id int PRIMARY KEY, at timestamptz, doc jsonb, amount numeric)")
    sink = {"name": "hot", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    config = write_config(tmp_path, database, nats_srv, names, [sink])
    env = {compiled.PURE_PYTHON_VARIABLE: "1"} if pure else {}
    with pipeline(config, "-s", "1", env=env) as proc, database.connect() as conn:
        wait_for(lambda: "streaming slot" in proc.log_tail(200), timeout=60, what="the slot to stream",
                 check=lambda: assert_running(proc))
        conn.execute("INSERT INTO hot VALUES (1, '2026-12-04 01:02:03.456789+00', '{\"a\": [1, 2]}', 12.50)")
        conn.commit()
        wait_for(lambda: len(stored(nats_srv.url, names.stream)) == 1, timeout=60, what="the change in the stream",
                 check=lambda: assert_running(proc))
        record = stored(nats_srv.url, names.stream)[0].event["record"]
        assert record == {"id": 1, "at": "2026-12-04T01:02:03.456789Z", "doc": {"a": [1, 2]}, "amount": "12.50"}
        said = proc.log_tail(400).count("the hot path runs as pure Python")
        assert said == (1 if pure or compiled.implementation() != "compiled" else 0)
