"""Training on the wafer: the backward of a Llama block as one composed mesh kernel (block.block_backward).

A pure floor: it composes the kernels (waferrt.kernels: gemm_backward, attention_backward, train_ops) with the
model's forward pieces (waferrt.model.reference); no Ray.
"""
