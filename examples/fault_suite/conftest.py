"""The kernels under test live next door, in examples/fault_tolerant_allreduce.py: make them importable.
(Everything else -- the `wafer` and `fault_plan` fixtures, the `faults` marker, --fault-seed -- comes from
the pytest plugin that is installed with waferrt.)"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
