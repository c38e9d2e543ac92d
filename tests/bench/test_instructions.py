"""bench/instructions.py's steps: each runs over the inputs it counts (no valgrind here)."""

from __future__ import annotations

import pytest

from bench import instructions


@pytest.mark.parametrize("name", ["decode", "dispatch", "render", "shaped", "read", "publish"])
def test_each_step_handles_every_change_of_its_inputs(name: str) -> None:
    assert instructions.step(name, 2) == 2 * instructions.CHANGES  # the typical shaping drops none


def test_an_unknown_step_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="no step 'other': decode, dispatch, render, shaped, read, publish"):
        instructions.step("other", 1)
