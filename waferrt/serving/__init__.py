"""waferrt.serving: requests in, tokens out -- the engine at the head of the pipeline (admission, lanes,
sampling), the decode loop every tile runs, the host's side (``serve``), the in-process LocalDecoder, and
the same requests on the numpy reference.

Contract: pure (no Ray): the tile actors run the same loop (waferrt.actors), and the Ray-backed decode
(waferrt.llm.WaferLLM) is one more ``serve`` Decode.
"""

from .engine import HeadEngine, Submission, TokenEvent
from .host import serve
from .local import LocalDecoder
from .reference import generate_batched, generate_reference
from .requests import (
                       Batch,
                       Completion,
                       GenRequest,
                       GenStats,
                       OnToken,
                       finish_reason,
                       logit_positions,
                       most_items,
                       request_rng,
)

__all__ = ["Batch", "Completion", "GenRequest", "GenStats", "HeadEngine", "LocalDecoder", "OnToken", "Submission",
           "TokenEvent", "finish_reason", "generate_batched", "generate_reference", "logit_positions",
           "most_items", "request_rng", "serve"]
