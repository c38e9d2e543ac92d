"""tests/tiers.py: the rule (which command needs which marker), and the check on tests of its own
run by pytester, with stand-in programs named as the real ones (nothing is started)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.tiers import needs

ROOT = Path(__file__).resolve().parent.parent

PY = sys.executable


@pytest.mark.parametrize(("argv", "markers"), [
    ([PY, "-m", "bytewax.run", "dataflows.cdc"], {"slow"}),
    ([PY, "-mbytewax.run", "tests.dataflows.engine_probe", "-s", "2"], {"slow"}),
    ([PY, "-m", "demo", "--seconds", "9"], {"slow", "servers"}),
    (["/usr/lib/postgresql/15/bin/postgres", "-D", "data"], {"servers"}),
    (["/usr/lib/postgresql/15/bin/initdb", "-D", "data"], {"servers"}),
    ([".venv/bin/nats-server", "-c", "nats.conf"], {"servers"}),
    ([PY, "-c", "from embedded import PostgresServer\nwith PostgresServer(): pass"], {"servers"}),
    ([PY, "-m", "bytewax.recovery", "dir", "1"], set()),
    ([PY, "-m", "ruff", "check"], set()),
    ([PY, "-c", "print('postgres')"], set()),
    ([".venv/bin/walflow", "check", "walflow.yaml"], set()),
    (["/usr/lib/postgresql/15/bin/pg_recvlogical", "--start"], set()),  # a client: its test has the fixtures
    ([], set()),
])
def test_which_command_needs_which_marker(argv: list[str], markers: set[str]) -> None:
    assert needs(argv) == markers


def _stand_in(directory: Path, name: str) -> Path:
    """An executable called ``name`` that exits 0 at once."""
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def child(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose child pytest runs the tiers plugin alone (not this suite's conftest)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    pytester.makeini(textwrap.dedent("""
        [pytest]
        addopts = --strict-markers -p tests.tiers -p no:cacheprovider
        markers =
            servers: needs the servers
            slow: slow
            alone: alone
    """))
    return pytester


def test_a_test_that_starts_a_server_or_a_pipeline_without_its_marker_fails(
        child: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = child.mkdir("bin")
    monkeypatch.setenv("STAND_IN_BIN", str(bin_dir))
    for name in ("postgres", "nats-server", "python"):
        _stand_in(bin_dir, name)
    child.makepyfile(test_cases=textwrap.dedent("""
        import os, subprocess, threading
        import pytest

        BIN = os.environ["STAND_IN_BIN"]

        def run(*argv):
            subprocess.run([os.path.join(BIN, argv[0]), *argv[1:]], check=True)

        def test_postgres_unmarked():
            run("postgres", "-D", "data")

        @pytest.mark.servers
        def test_postgres_marked():
            run("postgres", "-D", "data")

        def test_pipeline_unmarked():
            run("python", "-m", "bytewax.run", "dataflows.cdc")

        @pytest.mark.slow
        def test_pipeline_marked():
            run("python", "-m", "bytewax.run", "dataflows.cdc")

        @pytest.mark.servers
        def test_nats_in_a_thread_unmarked_slow_is_fine():
            thread = threading.Thread(target=run, args=("nats-server", "-c", "nats.conf"))
            thread.start()
            thread.join()

        def test_pipeline_in_a_thread_unmarked():
            thread = threading.Thread(target=run, args=("python", "-m", "bytewax.run", "dataflows.cdc"))
            thread.start()
            thread.join()

        def test_other_commands_need_nothing():
            run("python", "-m", "bytewax.recovery", "dir", "1")
    """))
    result = child.runpytest_subprocess("-rA", "-p", "no:threadexception")
    outcomes = result.parseoutcomes()
    # the thread's test passes its call and fails at teardown, where its violation is read
    assert (outcomes.get("passed"), outcomes.get("failed"), outcomes.get("errors")) == (5, 2, 1), result.stdout.str()
    result.stdout.re_match_lines([
        r"test_cases.py::test_postgres_unmarked runs '.*/bin/postgres -D data' but is not marked @pytest.mark.servers ",
        r"test_cases.py::test_pipeline_unmarked runs '.*/bin/python -m bytewax.run dataflows.cdc' "
        r"but is not marked @pytest.mark.slow ",
        r"ERROR test_cases.py::test_pipeline_in_a_thread_unmarked - ",
        r"FAILED test_cases.py::test_postgres_unmarked - ",
        r"FAILED test_cases.py::test_pipeline_unmarked - ",
    ], consecutive=False)
    for name in ("test_postgres_marked", "test_pipeline_marked", "test_nats_in_a_thread_unmarked_slow_is_fine",
                 "test_other_commands_need_nothing"):
        result.stdout.fnmatch_lines([f"PASSED test_cases.py::{name}"], consecutive=False)


def test_servers_is_applied_from_the_fixture_closure(child: pytest.Pytester) -> None:
    child.makeconftest(textwrap.dedent("""
        import pytest

        @pytest.fixture(scope="session")
        def pg_server():
            return "pg"

        @pytest.fixture(scope="session")
        def nats_server():
            return "nats"

        @pytest.fixture
        def database(pg_server):
            return pg_server

        @pytest.fixture
        def through_two(database):
            return database
    """))
    child.makepyfile(test_closure=textwrap.dedent("""
        def test_direct(nats_server): pass
        def test_through_fixtures(through_two): pass
        def test_pure(tmp_path): pass
    """))
    result = child.runpytest_subprocess("-m", "servers", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["test_closure.py::test_direct", "test_closure.py::test_through_fixtures",
                                 "*2/3 tests collected (1 deselected)*"])
    assert "test_pure" not in result.stdout.str()


def test_the_summary_names_an_unmarked_test_that_took_long(child: pytest.Pytester) -> None:
    child.makeconftest(textwrap.dedent("""
        import pytest

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(item):
            report = yield
            report.duration = 11.5 if item.name != "test_quick" else 0.1  # as if it took that long
            return report
    """))
    child.makepyfile(test_durations=textwrap.dedent("""
        import pytest

        def test_long_unmarked(): pass
        @pytest.mark.slow
        def test_long_marked(): pass
        def test_quick(): pass
    """))
    result = child.runpytest_subprocess()
    result.stdout.re_match_lines([r".* not marked slow, over 10 s .*", r"\s*11\.5s test_durations.py::test_long_unmarked$"])
    assert "test_long_marked" not in result.stdout.str() and "test_quick" not in result.stdout.str()
    assert result.ret == 0


_LOCK_CASES = textwrap.dedent("""
    import os, time, uuid
    import pytest

    def busy(name, seconds):
        # the test's interval on the wall clock, with a workload long enough for the other worker's to overlap it
        start = time.monotonic()
        time.sleep(seconds)
        with open(os.path.join(os.environ["RECORD_DIR"], uuid.uuid4().hex), "w") as f:
            f.write(f"{name} {start} {time.monotonic()} {os.environ['PYTEST_XDIST_WORKER']}")

    @pytest.mark.alone
    def test_alone():
        busy("alone", 1.0)

    @pytest.mark.parametrize("n", range(6))
    def test_quick(n):
        busy(f"quick{n}", 0.5)

    @pytest.mark.slow
    @pytest.mark.parametrize("n", range(2))
    def test_slow(n):
        busy(f"slow{n}", 0.5)
""")


@pytest.mark.slow
def test_under_xdist_an_alone_test_runs_while_no_other_does(child: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    record = child.mkdir("record")
    monkeypatch.setenv("RECORD_DIR", str(record))
    child.makeconftest(textwrap.dedent("""
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(items):
            # the alone test where the second worker starts (tiers.py puts it last, where little overlaps it)
            alone = next(i for i in items if i.name == "test_alone")
            items.remove(alone)
            items.insert(2, alone)
    """))
    child.makepyfile(test_lock=_LOCK_CASES)
    result = child.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=9)
    runs = {name: (float(start), float(end), worker) for name, start, end, worker
            in (p.read_text().split() for p in record.iterdir())}
    alone_start, alone_end, _ = runs.pop("alone")
    assert [name for name, (start, end, _) in runs.items() if start < alone_end and end > alone_start] == []
    overlapping = [(a, b) for a in runs for b in runs
                   if a < b and runs[a][0] < runs[b][1] and runs[b][0] < runs[a][1]]
    assert overlapping  # the others did run at once


@pytest.mark.slow
def test_under_xdist_the_slow_tests_come_first_and_the_alone_ones_last(child: pytest.Pytester,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECORD_DIR", str(child.mkdir("record")))
    monkeypatch.setenv("ORDER_DIR", str(child.mkdir("order")))
    child.makeconftest(textwrap.dedent("""
        import os
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(session):
            if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller: it runs nothing
                return
            with open(os.path.join(os.environ["ORDER_DIR"], os.environ["PYTEST_XDIST_WORKER"]), "w") as f:
                f.write(" ".join(item.name for item in session.items))
    """))
    child.makepyfile(test_lock=_LOCK_CASES)
    child.runpytest_subprocess("-n", "2").assert_outcomes(passed=9)
    orders = {p.name: p.read_text() for p in (child.path / "order").iterdir()}
    expected = " ".join(["test_slow[0]", "test_slow[1]", *(f"test_quick[{n}]" for n in range(6)), "test_alone"])
    assert orders == {"gw0": expected, "gw1": expected}
