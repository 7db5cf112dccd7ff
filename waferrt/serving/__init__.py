"""waferrt.serving: requests in, tokens out -- continuous batching over any decode step, the in-process
LocalDecoder, and the same requests on the numpy reference.

Contract: pure (no Ray): the Ray-backed decode (waferrt.llm.WaferLLM) plugs its step into the same loop.
"""

from .batching import continuous_batching
from .local import LocalDecoder
from .reference import generate_reference
from .requests import Completion, GenRequest, GenStats, OnToken, finish_reason, request_rng

__all__ = ["Completion", "GenRequest", "GenStats", "LocalDecoder", "OnToken", "continuous_batching",
           "finish_reason", "generate_reference", "request_rng"]
