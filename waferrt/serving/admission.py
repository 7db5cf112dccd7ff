"""Request admission for continuous batching: requests enter the pipeline as others finish.

Contract: pure and deterministic. :class:`Admission` has ``max_requests`` KV slots (one per request in
flight) of ``capacity_tokens`` positions each (``Admission.for_placement(p)`` takes both from a
Placement). ``submit(req)`` queues a request, or returns a :class:`Refusal` with the reason when it can
never run (its prompt plus its max new tokens exceed a slot, or its id is already in use).
``admit()`` moves waiting requests into free slots in submission order and returns them; ``finish(rid)``
frees a running request's slot (or withdraws a waiting one). First come, first served over equal
slots: every queued request is admitted after at most the requests ahead of it, so none starves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from waferrt.scheduler.types import Placement


@dataclass(frozen=True)
class Request:
    rid: Hashable
    prompt_len: int
    max_new_tokens: int
    stop_ids: frozenset[int] = frozenset()  # generation ends early at any of these tokens

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.max_new_tokens < 1:
            raise ValueError(f"request {self.rid!r} needs prompt_len >= 1 and max_new_tokens >= 1, "
                             f"got {self.prompt_len} and {self.max_new_tokens}")
        object.__setattr__(self, "stop_ids", frozenset(self.stop_ids))

    @property
    def tokens(self) -> int:
        """KV positions the request may fill: its prompt and every token it may generate."""
        return self.prompt_len + self.max_new_tokens


@dataclass(frozen=True)
class Refusal:
    rid: Hashable
    reason: str


class Admission:
    def __init__(self, capacity_tokens: int, max_requests: int):
        if capacity_tokens < 1 or max_requests < 1:
            raise ValueError(f"admission needs capacity_tokens >= 1 and max_requests >= 1, got "
                             f"{capacity_tokens} and {max_requests}")
        self.capacity_tokens, self.max_requests = capacity_tokens, max_requests
        self._waiting: deque[Request] = deque()
        self._running: dict[Hashable, Request] = {}

    @classmethod
    def for_placement(cls, p: Placement) -> Admission:
        return cls(p.kv_tokens, p.kv.requests)

    @property
    def waiting(self) -> tuple[Request, ...]:
        return tuple(self._waiting)

    @property
    def running(self) -> tuple[Request, ...]:
        return tuple(self._running.values())

    def submit(self, req: Request) -> Refusal | None:
        """Queue `req`; a Refusal (nothing queued) when it can never be served."""
        cap = self.capacity_tokens
        if req.prompt_len >= cap:  # not even one new token fits after the prompt
            return Refusal(req.rid, (
                f"request {req.rid!r} has a prompt of {req.prompt_len} tokens but a request slot holds {cap} KV "
                f"positions for the prompt and the new tokens together: shorten the prompt to at most {cap - 1} "
                "tokens or plan with a larger KV reserve (--kv-tokens)"))
        if req.tokens > cap:
            return Refusal(req.rid, (
                f"request {req.rid!r} needs {req.tokens} KV positions (prompt {req.prompt_len} + up to "
                f"{req.max_new_tokens} new tokens) but a request slot holds {cap}; lower max_new_tokens to "
                f"{cap - req.prompt_len}, shorten the prompt or plan with a larger KV reserve (--kv-tokens)"))
        if req.rid in self._running or any(w.rid == req.rid for w in self._waiting):
            return Refusal(req.rid, f"request id {req.rid!r} is already waiting or running; use a new id")
        self._waiting.append(req)
        return None

    def admit(self) -> list[Request]:
        """Move waiting requests, oldest first, into the free slots; return the ones admitted."""
        out = []
        while self._waiting and len(self._running) < self.max_requests:
            req = self._waiting.popleft()
            self._running[req.rid] = req
            out.append(req)
        return out

    def finish(self, rid: Hashable) -> None:
        """Free the slot of a running request (or withdraw a waiting one)."""
        if rid in self._running:
            del self._running[rid]
            return
        for req in self._waiting:
            if req.rid == rid:
                self._waiting.remove(req)
                return
        raise KeyError(f"request {rid!r} is neither running nor waiting (finished twice, or never "
                       "submitted?)")
