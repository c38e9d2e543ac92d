"""A flow module for ``tests/dataflows/test_epochs.py``: prints the epoch length
``bytewax.run`` will run with after walflow's default applied, then runs nothing."""

from __future__ import annotations

import sys

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSource

from dataflows.epochs import apply_default_epoch

apply_default_epoch()
main = sys.modules["__main__"]
print(f"epoch_interval={main.kwargs['epoch_interval'].total_seconds()}", flush=True)

flow = Dataflow("epoch_probe")
op.inspect("out", op.input("in", flow, TestingSource([])))
