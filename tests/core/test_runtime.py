"""What a failure inside a step does to the process (:meth:`core.runtime.Runtime.guard`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.runtime import Runtime
from tests.pipeline import ROOT

_STEP = """
from core.runtime import Runtime
runtime = Runtime(exit_on_fatal=True)
def step(value):
    raise TypeError("refusing the row's secret value " + value)
runtime.guarded("sink g: dispatching", step)("hunter2")
"""


def test_an_unforeseen_error_stops_with_one_line_naming_its_type_only() -> None:
    done = subprocess.run([sys.executable, "-c", _STEP], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "hunter2" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("walflow: sink g: dispatching failed unexpectedly (TypeError)")


def test_in_tests_the_error_itself_is_raised() -> None:
    def step() -> None:
        raise TypeError("x")

    with pytest.raises(TypeError):
        Runtime().guarded("step", step)()
