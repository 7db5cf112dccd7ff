"""waferrt.model: the Llama model as math and data, with no mesh, no Ray and no sockets.

config (LlamaConfig), weights (LlamaWeights, synthetic weights), gguf_loader (real weights from a GGUF),
tokenizer (the GGUF's BPE vocabulary), reference (the single-process numpy decoder) and sampling.
"""

from waferrt.model.config import SMOLLM2_135M, LlamaConfig
from waferrt.model.gguf_loader import load_gguf, smollm2_path
from waferrt.model.reference import (
    KVCache,
    ReferenceModel,
    apply_rope,
    attention,
    causal_attention,
    layer_forward,
    layer_prefill,
    linear,
    rmsnorm,
    rope,
    rope_cos_sin,
    silu,
    softmax,
    swiglu,
)
from waferrt.model.sampling import Sampler
from waferrt.model.tokenizer import DEFAULT_SYSTEM_PROMPT, StreamDecoder, Tokenizer, TokenizerMetadata
from waferrt.model.weights import LayerWeights, LlamaWeights, synthetic_llama, tiny_config

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "KVCache",
    "LayerWeights",
    "LlamaConfig",
    "LlamaWeights",
    "ReferenceModel",
    "SMOLLM2_135M",
    "Sampler",
    "StreamDecoder",
    "Tokenizer",
    "TokenizerMetadata",
    "apply_rope",
    "attention",
    "causal_attention",
    "layer_forward",
    "layer_prefill",
    "linear",
    "load_gguf",
    "rmsnorm",
    "rope",
    "rope_cos_sin",
    "silu",
    "smollm2_path",
    "softmax",
    "swiglu",
    "synthetic_llama",
    "tiny_config",
]
