"""Named model shapes (dimensions only, no weights) for planning and estimating at wafer scale.

Contract: ``MODELS`` maps a name to a :class:`NamedModel` (a :class:`LlamaConfig` and where its numbers
come from); ``model_by_name(name_or_path)`` returns (config, label) for a name here or the path of a llama
GGUF (only its metadata is read, through ``gguf_loader.read_config``, imported only then). Every config
is the model's published ``config.json`` (Hugging Face model card) read as a LlamaConfig: hidden_size ->
dim, intermediate_size -> hidden_dim, num_key_value_heads -> n_kv_heads (grouped-query attention),
max_position_embeddings -> max_seq_len, tie_word_embeddings -> tie_embeddings. What LlamaConfig has no
field for is named in the note (Qwen2's q/k/v biases: 2 x (dim + 2 x kv_dim) parameters per layer, left out).
Mixtures of experts read num_local_experts / num_experts / n_routed_experts -> n_experts,
num_experts_per_tok -> top_k, the expert's intermediate size (moe_intermediate_size, or intermediate_size for
Mixtral) -> hidden_dim, and the shared expert's width -> shared_hidden_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import SMOLLM2_135M, LlamaConfig


@dataclass(frozen=True)
class NamedModel:
    label: str
    config: LlamaConfig
    source: str  # where the dimensions come from
    note: str = ""


MODELS: dict[str, NamedModel] = {m.label.lower(): m for m in (
    NamedModel("SmolLM2-135M", SMOLLM2_135M, "huggingface.co/HuggingFaceTB/SmolLM2-135M config.json",
               "tied embeddings, GQA 9/3, rope theta 1e5, vocab 49152"),
    NamedModel("Llama3-8B", LlamaConfig(
        vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, hidden_dim=14336,
        rope_theta=500000.0, norm_eps=1e-5, max_seq_len=8192, tie_embeddings=False),
        "huggingface.co/meta-llama/Meta-Llama-3-8B config.json",
        "untied output head, GQA 32/8, rope theta 5e5, vocab 128256"),
    NamedModel("Llama2-13B", LlamaConfig(
        vocab_size=32000, dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, hidden_dim=13824,
        rope_theta=10000.0, norm_eps=1e-5, max_seq_len=4096, tie_embeddings=False),
        "huggingface.co/meta-llama/Llama-2-13b-hf config.json",
        "untied output head, no GQA (40/40), rope theta 1e4, vocab 32000"),
    NamedModel("CodeLlama-34B", LlamaConfig(
        vocab_size=32000, dim=8192, n_layers=48, n_heads=64, n_kv_heads=8, hidden_dim=22016,
        rope_theta=1000000.0, norm_eps=1e-5, max_seq_len=16384, tie_embeddings=False),
        "huggingface.co/codellama/CodeLlama-34b-hf config.json",
        "untied output head, GQA 64/8, rope theta 1e6, vocab 32000"),
    NamedModel("Qwen2-72B", LlamaConfig(
        vocab_size=152064, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, hidden_dim=29568,
        rope_theta=1000000.0, norm_eps=1e-6, max_seq_len=32768, tie_embeddings=False),
        "huggingface.co/Qwen/Qwen2-72B-Instruct config.json",
        "untied output head, GQA 64/8, rope theta 1e6, vocab 152064; q/k/v biases not modelled"),
    NamedModel("Mixtral-8x7B", LlamaConfig(
        vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, hidden_dim=14336,
        rope_theta=1000000.0, norm_eps=1e-5, max_seq_len=32768, tie_embeddings=False, n_experts=8, top_k=2),
        "huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json",
        "8 experts of 14336 per layer, top-2 (num_local_experts, num_experts_per_tok), GQA 32/8, untied head"),
    NamedModel("Qwen1.5-MoE-A2.7B", LlamaConfig(
        vocab_size=151936, dim=2048, n_layers=24, n_heads=16, n_kv_heads=16, hidden_dim=1408,
        rope_theta=1000000.0, norm_eps=1e-6, max_seq_len=8192, tie_embeddings=False, n_experts=60, top_k=4,
        shared_hidden_dim=5632),
        "huggingface.co/Qwen/Qwen1.5-MoE-A2.7B config.json",
        "60 experts of 1408 (moe_intermediate_size), top-4, a shared expert of 5632; its sigmoid gate, q/k/v "
        "biases and the unnormalised top-k gates (norm_topk_prob false) not modelled"),
    NamedModel("DeepSeek-V2-Lite-like", LlamaConfig(
        vocab_size=102400, dim=2048, n_layers=27, n_heads=16, n_kv_heads=16, hidden_dim=1408,
        rope_theta=10000.0, norm_eps=1e-6, max_seq_len=32768, tie_embeddings=False, n_experts=64, top_k=6,
        shared_hidden_dim=2816),
        "huggingface.co/deepseek-ai/DeepSeek-V2-Lite config.json",
        "64 routed experts of 1408, top-6, 2 shared experts (one of 2816 here); LIKE it, not it: multi-head "
        "latent attention (kv_lora_rank 512) is plain MHA 16/16 of head_dim 128 here, the first layer's dense "
        "FFN (first_k_dense_replace 1) is an MoE layer too, the context is cut to 32768"),
)}


def model_by_name(name: str) -> tuple[LlamaConfig, str]:
    """(config, label) of a named model (case-insensitive) or of a llama GGUF file's metadata."""
    found = MODELS.get(name.lower())
    if found is not None:
        return found.config, found.label
    if Path(name).is_file():
        from .gguf_loader import read_config

        return read_config(name), Path(name).name
    raise ValueError(f"--model {name!r} is neither a named model ({', '.join(sorted(MODELS))}) nor an existing "
                     "llama GGUF file (only its metadata is read)")
