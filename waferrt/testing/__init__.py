"""Testing your kernels under faults: ``waferrt.testing.plugin`` is the pytest plugin installed with waferrt
(entry point ``pytest11``): the ``wafer`` and ``fault_plan`` fixtures, the ``faults`` and ``wafer`` markers and
the ``--fault-seed`` option. A floor of its own on top of the runtime and the faults."""
