"""The engine at the head of the pipeline, without a pipeline: lanes, chunked prompts, a request's next token
entering as soon as its previous one left, refusals, cancellation and slot reuse (greedy sampling on
logits made up here)."""

from __future__ import annotations

import numpy as np

from waferrt.model import Sampler
from waferrt.serving import GenRequest, HeadEngine, Submission, TokenEvent


def _logits(meta: np.ndarray, pick) -> dict[int, np.ndarray]:
    """Logits for every item that wants them: greedy picks `pick(slot, pos)`."""
    out = {}
    for i, (slot, _, pos, want, _) in enumerate(meta.tolist()):
        if want:
            out[i] = np.zeros(50, np.float32)
            out[i][pick(slot, pos)] = 1.0
    return out


def _submit(engine: HeadEngine, prompts, max_new=3, stop=()) -> None:
    for i, p in enumerate(prompts):
        assert engine.submit(Submission(i, GenRequest(tuple(p), max_new, tuple(stop)), Sampler())) == []


def test_lanes_and_the_next_token_entering_as_soon_as_the_previous_left():
    engine = HeadEngine(kv_tokens=16, slots=4, lanes=2)
    _submit(engine, [[1, 2], [3], [4, 5, 6], [7]])
    batches = engine.form()
    assert [mb for mb, _ in batches] == [1, 2]  # one micro-batch per lane
    (mb1, m1), (mb2, m2) = batches
    assert set(m1[:, 0]) == {0, 2} and set(m2[:, 0]) == {1, 3}  # lane = slot mod 2
    assert m1.tolist() == [[0, 1, 0, 0, 0], [0, 2, 1, 1, 0], [2, 4, 0, 0, 2], [2, 5, 1, 0, 2], [2, 6, 2, 1, 2]]
    assert engine.form() == []  # both lanes are busy
    events = engine.returned(mb1, _logits(m1, lambda slot, pos: 10 + slot))
    assert events == [TokenEvent(0, 10, ""), TokenEvent(2, 12, "")]
    (mb3, m3), = engine.form()  # lane 0 goes again at once, lane 1 is still out
    assert mb3 == 3 and m3.tolist() == [[0, 10, 2, 1, 0], [2, 12, 3, 1, 2]]


def test_a_long_prompt_goes_in_chunks_and_only_its_last_token_wants_logits():
    engine = HeadEngine(kv_tokens=64, slots=2, lanes=1, max_items=4)
    _submit(engine, [list(range(1, 11))])
    metas = []
    while not engine.idle:
        (mb, meta), = engine.form()
        metas.append(meta)
        engine.returned(mb, _logits(meta, lambda slot, pos: 40))
    assert [len(m) for m in metas[:3]] == [4, 4, 2] and [m[:, 3].sum() for m in metas[:3]] == [0, 0, 1]
    assert metas[2][-1].tolist() == [0, 10, 9, 1, 0] and metas[3].tolist() == [[0, 40, 10, 1, 0]]
    assert len(metas) == 5  # 3 prompt chunks, then tokens 2 and 3 of max_new=3


def test_refusal_cancellation_and_a_freed_slot_taken_by_the_next_request():
    engine = HeadEngine(kv_tokens=8, slots=1, lanes=1)
    refused = engine.submit(Submission(0, GenRequest((1,) * 5, 4), Sampler()))
    assert refused[0].token == -1 and refused[0].finish.startswith("refused") and "KV positions" in refused[0].finish
    engine.submit(Submission(1, GenRequest((1, 2), 2, (33,)), Sampler()))
    engine.submit(Submission(2, GenRequest((3,), 2), Sampler()))
    engine.submit(Submission(3, GenRequest((4,), 2), Sampler()))
    assert engine.cancel(3) == [TokenEvent(3, -1, "cancelled")]  # still waiting: gone at once
    (mb, meta), = engine.form()
    assert meta[:, 0].tolist() == [0, 0] and meta[:, 4].tolist() == [1, 1]  # request 1 in the only slot
    assert engine.returned(mb, _logits(meta, lambda s, p: 33)) == [TokenEvent(1, 33, "stop")]
    (mb, meta), = engine.form()
    assert meta.tolist() == [[0, 3, 0, 1, 2]]  # request 2 reuses slot 0 from position 0 (its cache starts afresh)
    assert engine.cancel(2) == []  # in flight: cancelled when it comes back
    assert engine.returned(mb, _logits(meta, lambda s, p: 9)) == [TokenEvent(2, -1, "cancelled")]
    assert engine.idle
