"""Training on the wafer: a Llama block's forward (forward.block_forward_mesh) and the backward of a block, of
the tied head and of the embedding as mesh kernels on a Wafer (block.block_backward, head.head_backward,
head.embedding_backward; docs/ARCHITECTURE.md "Training: the backward on the mesh").

A pure floor: it composes the kernels (waferrt.kernels: gemm_backward, attention_backward, train_ops) with the
model's forward pieces (waferrt.model.reference); no Ray.
"""

from .block import Saved, block_backward, block_forward
from .forward import block_forward_mesh
from .head import embedding_backward, head_backward

__all__ = ["Saved", "block_backward", "block_forward", "block_forward_mesh", "embedding_backward", "head_backward"]
