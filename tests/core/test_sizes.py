"""The size policy's parts without servers: which values a change loses, the marker that takes
their place (across pickle, as between processes), and how it is counted and said."""

from __future__ import annotations

import logging
import pickle

import pytest

from core.events import OversizedValue
from core.ids import row_key
from core.metrics import Metrics
from core.sizes import SMALLEST, OversizedReport, largest, replaced


def test_the_largest_values_go_first_until_the_excess_is_covered() -> None:
    old = (b"k" * 500, b"a" * 100, None, b"s" * SMALLEST)
    new = (b"k" * 500, b"b" * 300, b"c" * 200, b"s")
    assert largest((old, new), {0}, 250) == ([(1, 1, 300)], 300)
    assert largest((old, new), {0}, 301) == ([(1, 1, 300), (1, 2, 200)], 500)
    assert largest((old, new), {0}, 9999) == ([(1, 1, 300), (1, 2, 200), (0, 1, 100)], 600)  # all there are:
    assert largest((None, new), {0}, 0) == ([], 0)  # not the key, nor what its marker would not shorten


def test_ties_go_to_the_earlier_place_and_markers_are_not_chosen_again() -> None:
    row = (b"x" * 500, b"y" * 500, OversizedValue.of(b"z" * 999))
    assert largest((row,), (), 500) == ([(0, 0, 500)], 500)
    assert largest((row,), (), 501) == ([(0, 0, 500), (0, 1, 500)], 1000)


def test_replaced_copies_what_it_keeps_and_marks_the_rest() -> None:
    message = memoryview(b"..abcdef")
    row = (message[2:4], message[4:8], None)
    out = replaced(row, {1})
    assert out == (b"ab", OversizedValue.of(b"cdef"), None) and type(out[0]) is bytes


def test_a_marker_holds_its_size_equals_its_values_marker_only_and_survives_pickle() -> None:
    marker = OversizedValue.of(b"x" * 1000)
    assert (marker.size, marker.text) == (1000, "__walflow_oversized_value:1000")
    assert marker == OversizedValue.of(b"x" * 1000) and hash(marker) == hash(OversizedValue.of(b"x" * 1000))
    assert marker != OversizedValue.of(b"y" * 1000) and marker != b"x" * 1000 and marker != marker.text
    copy = pickle.loads(pickle.dumps(marker))
    assert type(copy) is OversizedValue and copy == marker


def test_a_group_key_with_a_marker_is_total_and_stable() -> None:
    marker = OversizedValue.of(b"x" * 1000)
    key = row_key([b"7", marker])
    assert key == row_key([b"7", pickle.loads(pickle.dumps(marker))]) != row_key([b"7", OversizedValue.of(b"y")])


def test_each_value_is_counted_and_each_column_said_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    caplog.set_level(logging.WARNING, "walflow.sizes")
    first = OversizedReport("max_change", metrics, "its change is larger than walflow.max_change_mb (100 bytes)")
    again = OversizedReport("max_change", metrics, "its change is larger than walflow.max_change_mb (100 bytes)")
    first("public.notes", "a", 300, "the insert at commit LSN 0/3E8 (commit_idx 0)")
    again("public.notes", "a", 400, "the insert at commit LSN 0/3E8 (commit_idx 1)")  # a new session, say
    first("public.notes", "b", 200, "the insert at commit LSN 0/3E8 (commit_idx 1)")
    OversizedReport("max_change", None, "unseen")("public.notes", "a", 1, "a read")  # not counted, said
    assert [r.getMessage() for r in caplog.records] == [
        'public.notes.a: a value of 300 bytes in the insert at commit LSN 0/3E8 (commit_idx 0) is published as '
        '"__walflow_oversized_value:300": its change is larger than walflow.max_change_mb (100 bytes). Later values '
        'of this column are counted in walflow_oversized_values_total{limit="max_change"}, not logged',
        'public.notes.b: a value of 200 bytes in the insert at commit LSN 0/3E8 (commit_idx 1) is published as '
        '"__walflow_oversized_value:200": its change is larger than walflow.max_change_mb (100 bytes). Later values '
        'of this column are counted in walflow_oversized_values_total{limit="max_change"}, not logged',
        'public.notes.a: a value of 1 bytes in a read is published as "__walflow_oversized_value:1": unseen. Later '
        'values of this column are counted in walflow_oversized_values_total{limit="max_change"}, not logged',
    ]
    value = metrics.registry.get_sample_value
    assert value("walflow_oversized_values_total", {"limit": "max_change", "table": "public.notes", "column": "a"}) == 2
    assert value("walflow_oversized_values_total", {"limit": "max_change", "table": "public.notes", "column": "b"}) == 1
