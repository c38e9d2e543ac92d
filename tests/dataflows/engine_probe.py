"""A flow module for ``tests/dataflows/test_engine_run.py``: prints the epoch length
``bytewax.run`` will run with after walflow's default applied, and the cluster it sees,
then runs nothing."""

from __future__ import annotations

import sys

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSource

from dataflows.engine import apply_default_epoch, this_cluster

apply_default_epoch()
main = sys.modules["__main__"]
print(f"epoch_interval={main.kwargs['epoch_interval'].total_seconds()} cluster={tuple(this_cluster())}", flush=True)

flow = Dataflow("engine_probe")
op.inspect("out", op.input("in", flow, TestingSource([])))
