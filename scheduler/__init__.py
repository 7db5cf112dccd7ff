"""waferrt.scheduler: pure planning of a model onto the emulated wafer (no Ray, immutable results).

Contract: ``plan`` places a Llama model on a mesh (layer -> region, embedding/head region, spare cores,
tile -> Ray node) and raises ``PlanError`` with what would fit when it cannot; ``replan`` moves only the
regions that new dead cores or links broke and lists the moves; ``default_mesh`` sizes the default
mesh; ``Admission`` admits requests into the KV capacity first come, first served; ``draw_png`` draws
a placement. Importing this package imports neither Ray nor pyzmq (nor matplotlib).
"""

from .admission import Admission, Refusal, Request
from .draw import draw_png
from .placement import KVReserve, NodeInfo, Placement, PlanError, default_mesh, plan
from .repair import Move, Replan, replan
from .report import PlanReport

__all__ = [
    "Admission", "KVReserve", "Move", "NodeInfo", "Placement", "PlanError", "PlanReport", "Refusal",
    "Replan", "Request", "default_mesh", "draw_png", "plan", "replan",
]
