"""waferrt.model: the Llama model as math and data, with no mesh, no Ray and no sockets.

config (LlamaConfig), weights (LlamaWeights, synthetic weights), reference (the single-process numpy
decoder; its K/V cache in kvcache), sparse (STAR's sparse attention: AttentionMode, dense or sparse:K) and
sampling are the math, imported here. Behind them sit the model's file readers: gguf_loader
(real weights from a GGUF, through the ``gguf`` package: ``GGUFModel`` reads a header once, ``GGUFError``
says what is wrong with a file), npcache (the dequantised weights kept as .npy files and memory-mapped on
later runs: ``load_model``, ``load_meta``) and tokenizer (the GGUF's BPE vocabulary, through
``tokenizers``). Those are imported only on first use of one of their names, so importing the model math,
the scheduler or the cost model never imports ``gguf`` or ``tokenizers``.
"""

import importlib

from waferrt.model.config import SMOLLM2_135M, LlamaConfig
from waferrt.model.kvcache import KVCache
from waferrt.model.reference import (
    Layer,
    ReferenceModel,
    Rope,
    apply_rope,
    attention,
    causal_attention,
    ffn,
    layer_forward,
    layer_prefill,
    linear,
    moe_experts,
    rmsnorm,
    rope,
    rope_cos_sin,
    route,
    silu,
    softmax,
    swiglu,
)
from waferrt.model.sampling import Sampler
from waferrt.model.sparse import DENSE, AttentionMode
from waferrt.model.weights import LayerWeights, LlamaWeights, synthetic_llama, tiny_config, tiny_moe_config

_FILE_READERS = {  # name -> the module that defines it (imported on first use)
    "load_gguf": "gguf_loader", "read_config": "gguf_loader", "smollm2_path": "gguf_loader",
    "GGUFModel": "gguf_loader", "GGUFError": "gguf_loader", "load_model": "npcache", "load_meta": "npcache",
    "Tokenizer": "tokenizer", "TokenizerMetadata": "tokenizer", "StreamDecoder": "tokenizer",
    "DEFAULT_SYSTEM_PROMPT": "tokenizer",
}

__all__ = [
    "DENSE", "AttentionMode", "KVCache", "Layer", "LayerWeights", "LlamaConfig", "LlamaWeights", "ReferenceModel",
    "Rope", "SMOLLM2_135M", "Sampler",
    "apply_rope", "attention", "causal_attention", "ffn", "layer_forward", "layer_prefill", "linear", "moe_experts",
    "rmsnorm", "rope", "rope_cos_sin", "route", "silu", "softmax", "swiglu", "synthetic_llama", "tiny_config",
    "tiny_moe_config", *_FILE_READERS,
]


def __getattr__(name: str):
    if name in _FILE_READERS:
        return getattr(importlib.import_module(f"waferrt.model.{_FILE_READERS[name]}"), name)
    raise AttributeError(f"module 'waferrt.model' has no attribute {name!r}")
