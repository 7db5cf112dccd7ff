"""The requests at the head of the pipeline: admission, the micro-batches that enter, sampling, finishing.

Contract: a :class:`HeadEngine` runs on the tile that hosts the embedding and the head (they share the
tied table), with no host in the loop. ``submit`` queues a request (a :class:`Submission`: its number i,
the request, the sampler); requests enter free K/V slots first come, first served
(``waferrt.serving.admission``; one that the K/V capacity cannot hold is refused at once with the
reason). Each slot belongs to a *lane* (slot mod ``lanes``); a lane has at most one micro-batch in
flight. ``form()`` returns the micro-batches that can enter now: for every idle lane, the next token of
each of its decoding requests and the next chunk of each new prompt (at most ``max_items`` items).
``returned(mb, logits)`` samples the next token of every request whose logits came back (request i with
``numpy.random.default_rng([seed, i])``, as the reference does), frees the slots of finished requests,
and returns the :class:`TokenEvent` s -- so a request's next token enters as soon as its previous one
left the head. A micro-batch's rows are ``(slot, token, pos, want_logits, request number)``. Pure: no Ray,
no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from waferrt.decode.prefill import PREFILL_MAX_TOKENS
from waferrt.decode.rows import item_row
from waferrt.model.sampling import Sampler
from waferrt.serving.admission import Admission, Request

from .requests import GenRequest, request_rng


@dataclass(frozen=True)
class Submission:
    index: int  # the request's number: its RNG is default_rng([sampler.seed, index])
    request: GenRequest
    sampler: Sampler
    keep_logits: bool = False  # send every token's logits to the host too (for checking; 200 KB a token)
    made: int = 0  # tokens it had generated before (a request resumed after a fault): its RNG skips their draws
    rng_index: int | None = None  # its RNG is default_rng([sampler.seed, rng_index]) instead (a server's request
    # samples as the same request decoded alone: rng_index 0)


@dataclass(frozen=True, eq=False)
class TokenEvent:
    index: int  # the request's number
    token: int  # -1 when the request ends without a token (refused, cancelled)
    finish: str  # "" while it goes on; "stop", "length", "cancelled" or "refused: <reason>"
    logits: np.ndarray | None = None  # what the token was sampled from, when the request keeps them

    def __eq__(self, other) -> bool:
        return (self.index, self.token, self.finish) == (other.index, other.token, other.finish)


@dataclass
class _Live:
    sub: Submission
    slot: int
    rng: np.random.Generator
    sent: int = 0  # prompt tokens sent so far
    made: int = 0  # tokens generated so far
    next: int | None = None  # the sampled token to feed next
    cancelled: bool = False

    @property
    def pos(self) -> int:
        """Position of the next token to enter."""
        return self.sent + max(self.made - 1, 0)


class HeadEngine:
    def __init__(self, kv_tokens: int, slots: int, lanes: int = 2, max_items: int = 32, whole_prompts: int = 0):
        """`whole_prompts`: a prompt enters in chunks of that many tokens, each one micro-batch's (to be
        prefilled; 0: in what room the micro-batches have, as decode tokens)."""
        self.admission = Admission(kv_tokens, slots)
        self.lanes, self.max_items, self.whole_prompts = max(1, min(lanes, slots)), max_items, whole_prompts
        self.free = list(range(slots))
        self.live: dict[int, _Live] = {}  # request number -> its state
        self.busy: dict[int, int] = {}  # lane -> its micro-batch in flight
        self.items: dict[int, list[int | None]] = {}  # mb -> per item, the request whose logits it gives
        self._subs: dict[int, Submission] = {}
        self._mb = 0

    @classmethod
    def of(cls, setup, lanes: int) -> HeadEngine:
        """The engine of a decode's DecodeSetup: with ``setup.prefill``, a prompt enters in chunks of
        PREFILL_MAX_TOKENS (a shorter prompt whole), each one micro-batch's."""
        return cls(setup.kv_tokens, setup.slots, lanes, whole_prompts=PREFILL_MAX_TOKENS if setup.prefill else 0)

    def load(self) -> float:
        """The largest micro-batch in flight in ordinary micro-batches (max_items items), at least 1: how much
        longer than usual the pipeline may take to answer (a whole prompt being prefilled)."""
        return max([1.0] + [len(self.items[mb]) / self.max_items for mb in self.busy.values()])

    @property
    def idle(self) -> bool:
        """Nothing in flight, nothing running, nothing waiting."""
        return not self.live and not self.admission.waiting and not self.busy

    def submit(self, sub: Submission) -> list[TokenEvent]:
        r = sub.request
        refusal = self.admission.submit(Request(sub.index, len(r.prompt_ids), r.max_new_tokens,
                                                frozenset(r.stop_ids)))
        if refusal:
            return [TokenEvent(sub.index, -1, f"refused: {refusal.reason}")]
        self._subs[sub.index] = sub
        return []

    def cancel(self, index: int) -> list[TokenEvent]:
        """Stop request `index`: at once if none of its tokens is in flight, else when they come back."""
        lv = self.live.get(index)
        if lv is None:
            if index in self._subs:  # still waiting for a slot
                self.admission.finish(index)
                del self._subs[index]
                return [TokenEvent(index, -1, "cancelled")]
            return []
        lv.cancelled = True
        return [] if self._in_flight(lv) else self._end(lv, -1, "cancelled")

    # -- entering ----------------------------------------------------------------------------------------
    def form(self) -> list[tuple[int, np.ndarray]]:
        """The micro-batches that enter now, as (number, meta rows: decode.rows.Col)."""
        for req in self.admission.admit():
            sub = self._subs.pop(req.rid)
            rng = request_rng(sub.sampler, sub.index if sub.rng_index is None else sub.rng_index)
            sub.sampler.skip(rng, sub.made)
            self.live[req.rid] = _Live(sub, self.free.pop(0), rng)
        out = []
        for lane in range(self.lanes):
            if lane in self.busy:
                continue
            rows, owners = self._lane_items(lane)
            if rows:
                self._mb += 1
                self.busy[lane], self.items[self._mb] = self._mb, owners
                out.append((self._mb, np.array(rows, np.int64)))
        return out

    def _lane_items(self, lane: int) -> tuple[list, list]:
        rows, owners = [], []
        for index, lv in self.live.items():
            if lv.slot % self.lanes != lane or lv.cancelled:
                continue
            prompt = lv.sub.request.prompt_ids
            if lv.next is not None:  # its next token
                rows.append(item_row(lv.slot, lv.next, lv.pos, True, index))
                owners.append(index)
                lv.next = None
            elif lv.sent < len(prompt) and (self.whole_prompts or len(rows) < self.max_items):
                # the next chunk of its prompt: up to whole_prompts tokens at once (to be prefilled) or what
                # the micro-batch has room for
                take = min(len(prompt) - lv.sent, self.whole_prompts or self.max_items - len(rows))
                for j in range(lv.sent, lv.sent + take):
                    last = j == len(prompt) - 1
                    rows.append(item_row(lv.slot, prompt[j], j, last, index))
                    owners.append(index if last else None)
                lv.sent += take
        return rows, owners

    def _in_flight(self, lv: _Live) -> bool:
        return any(lv.sub.index in self.items[mb] for mb in self.busy.values())

    # -- leaving -----------------------------------------------------------------------------------------
    def returned(self, mb: int, logits: dict[int, np.ndarray]) -> list[TokenEvent]:
        """Micro-batch `mb` left the head with these logits (by item): sample, finish, free its lane."""
        lane = next(lane for lane, m in self.busy.items() if m == mb)
        del self.busy[lane]
        events = []
        for i, index in enumerate(self.items.pop(mb)):
            lv = self.live.get(index) if index is not None else None
            if lv is None:
                continue
            if lv.cancelled:
                events += self._end(lv, -1, "cancelled")
                continue
            token = lv.sub.sampler.sample(logits[i], lv.rng)
            lv.made += 1
            req = lv.sub.request
            finish = "stop" if token in req.stop_ids else "length" if lv.made >= req.max_new_tokens else ""
            kept = logits[i] if lv.sub.keep_logits else None
            if finish:
                events += self._end(lv, token, finish, kept)
            else:
                lv.next = token
                events.append(TokenEvent(index, token, "", kept))
        return events

    def _end(self, lv: _Live, token: int, finish: str, logits: np.ndarray | None = None) -> list[TokenEvent]:
        index = lv.sub.index
        del self.live[index]
        self.admission.finish(index)
        self.free.append(lv.slot)
        return [TokenEvent(index, token, finish, logits)]
