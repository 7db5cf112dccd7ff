"""waferrt.scheduler: pure planning of a model onto the emulated wafer (no Ray, immutable results).

Contract: ``plan`` places a Llama model on a mesh (layer -> region, embedding/head region, spare cores,
tile -> Ray node) and raises ``PlanError`` with what would fit when it cannot; ``violations`` lists the
rules a placement breaks; ``plan_report`` measures it; ``replan`` moves only the regions that new dead
cores or links broke and lists the moves; ``default_mesh`` sizes the default mesh; ``Admission`` admits
requests into the KV capacity first come, first served; ``draw_png`` draws a placement;
``placement_to_json`` / ``placement_from_json`` round-trip one; ``waferrt.estimator.estimate.estimate``
plans a model on a whole wafer on paper (with ``wafer``, ``advice``, ``streaming``; ``sweep`` over hardware
designs). The value types live in
``waferrt.scheduler.types``, which imports no algorithm. Importing this package imports neither Ray nor
pyzmq (nor matplotlib).
"""

from .placement import default_mesh, plan, violations
from .repair import Move, Replan, replan
from .report import PlanReport, plan_report
from .serial import placement_from_json, placement_to_json
from .speed import run_bound_tokens_per_s
from .types import KVReserve, NodeInfo, Objective, Placement, PlanError, PlanOptions, Strategy

__all__ = [
    "KVReserve", "Move", "NodeInfo", "Objective", "Placement", "PlanError", "PlanOptions", "PlanReport",
    "Replan", "Strategy", "default_mesh", "placement_from_json",
    "placement_to_json", "plan", "plan_report", "replan", "run_bound_tokens_per_s", "violations",
]
