"""waferrt.training: training a Llama on the wafer -- AdamW, the corpus and its batcher, the off-wafer
memory of weights and optimizer state, a step of one function per layer phase, its cost in closed form.

Pure (no Ray, no sockets, no model-file readers): adamw (the optimizer), corpus (the project's docs as a
training text; the seeded batcher), store (ParamStore: Cerebras' MemoryX for training), step (train_step:
the phases and the streamed bytes), cost (bytes and cycles of a step), faults (a dead tile or a corrupted
gradient payload, and the payload CRC that finds the latter). The backward math is the model's
(``waferrt.model.backward``); the Ray actors that run a step with its store off the wafer are in
``actors/training.py``. The backward as mesh kernels on a Wafer: block (``block_forward``,
``block_backward``), forward (``block_forward_mesh``: the block's forward as one kernel), head
(``head_backward``, ``embedding_backward``), onwafer (running one as a kernel); they compose waferrt.kernels
(gemm_backward, attention_backward, train_ops); mesh (``mesh_phases``) puts them at the step's seam in place
of the reference's phases (docs/ARCHITECTURE.md "Training").
"""

from .block import Saved, block_backward, block_forward
from .forward import block_forward_mesh
from .head import embedding_backward, head_backward

__all__ = ["Saved", "block_backward", "block_forward", "block_forward_mesh", "embedding_backward", "head_backward"]
