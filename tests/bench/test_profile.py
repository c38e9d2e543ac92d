"""bench/profile.py: py-spy's raw lines → each thread's µs per change, by file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.profile import samples, table

RAW = """\
thread (11): walflow-reader-wf_w1;Thread.run (threading.py:982);Decoder._row (connectors/postgres/decoder.py:300) 30
thread (11): walflow-reader-wf_w1;Thread.run (threading.py:982);Session._read_burst (connectors/postgres/session.py:209) 10
thread (12): MainThread;<module> (run.py:5);_locate_dataflow (run.py:1);_find_and_load (<frozen importlib._bootstrap>:1) 500
thread (12): MainThread;<module> (run.py:5);Render.__call__ (transforms/render.py:130) 20
thread (12);<module> (run.py:5) 20
thread (13) 5
thread (14): walflow-async;Client._read_loop (nats/aio/client.py:1);parse (nats/protocol/parser.py:3) 4
"""


def test_each_threads_cpu_is_spread_over_the_files_its_samples_were_in(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    found = samples(raw)
    assert found["reader-wf_w1"] == {"connectors/postgres/decoder.py": 30, "connectors/postgres/session.py": 10}
    assert found["main"] == {"transforms/render.py": 20, "bytewax": 20}  # starting up is left out
    assert found["async"] == {"nats": 4}
    assert found["timely"] == {"bytewax": 5}  # an unnamed thread is a Bytewax worker's; no Python frame
    run = {"processes": [{"threads": [{"name": "reader-wf_w1", "cpu_us_per_change": 8.0},
                                      {"name": "main", "cpu_us_per_change": 10.0},
                                      {"name": "health", "cpu_us_per_change": 0.0}]}]}
    rows = table(run, found)
    assert rows[2] == "| reader-wf_w1 | 8.0 | connectors/postgres/decoder.py 6.0, connectors/postgres/session.py 2.0 |"
    assert rows[3] == "| main | 10.0 | transforms/render.py 5.0, bytewax 5.0 |"
    assert len(rows) == 4  # a thread without CPU has no row


NATIVE = """\
thread (21): MainThread;<module> (run.py:5);pyo3::call (_bytewax.so);Render.__call__ (transforms/render.py:1);\
CPyDef_envelope___Envelope_____call__ (__native_walflow_hot.c:50624);_PyObject_Malloc (libpython3.11.so.1.0) 7
thread (21): MainThread;<module> (run.py:5);CPyDef_render___Render_____call__ (__native_walflow_hot.c:9);\
datetime_fromtimestamp (_datetimemodule.c:5204) 3
thread (21): MainThread;<module> (run.py:5);pyo3::call (_bytewax.so);Py_DECREF (object.h:537) 2
thread (22): walflow-reader-wf_w1;Session._read_burst (connectors/postgres/session.py:1);\
CPyL_decoder____tuple (__native_walflow_hot.c:1) 4
"""


def test_with_native_frames_c_counts_to_the_compiled_module_or_python_frame_that_called_it(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(NATIVE)
    found = samples(raw)
    assert found["main"] == {"transforms/envelope.py": 7, "transforms/render.py": 3, "bytewax": 2}
    assert found["reader-wf_w1"] == {"connectors/postgres/decoder.py": 4}


def test_a_thread_name_cut_by_the_kernel_finds_its_whole_name() -> None:
    run = {"processes": [{"threads": [{"name": "reader-wf_nofla", "cpu_us_per_change": 6.0}]}]}
    rows = table(run, {"reader-wf_noflags": Counter({"connectors/postgres/decoder.py": 3})})
    assert rows[2] == "| reader-wf_nofla | 6.0 | connectors/postgres/decoder.py 6.0 |"
