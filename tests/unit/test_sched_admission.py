"""Request admission: refuses what the KV capacity cannot hold (saying why), first come first served."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import spec_by_name
from waferrt.model.config import SMOLLM2_135M
from waferrt.scheduler import KVReserve, plan
from waferrt.serving.admission import Admission, Request


def test_refuses_what_a_slot_cannot_hold_and_says_why():
    adm = Admission(capacity_tokens=100, max_requests=2)
    refusal = adm.submit(Request("long", prompt_len=60, max_new_tokens=41))
    assert refusal is not None and refusal.rid == "long"
    assert "needs 101 KV positions" in refusal.reason and "holds 100" in refusal.reason
    assert "max_new_tokens to 40" in refusal.reason
    assert adm.waiting == () and adm.submit(Request("fits", 60, 40)) is None


def test_fifo_into_free_slots_and_finish_frees_one():
    adm = Admission(64, 2)
    for i in range(4):
        assert adm.submit(Request(i, 8, 8, stop_ids={2})) is None
    assert [r.rid for r in adm.admit()] == [0, 1]
    assert adm.admit() == [] and [r.rid for r in adm.waiting] == [2, 3]
    adm.finish(1)
    assert [r.rid for r in adm.admit()] == [2]
    assert {r.rid for r in adm.running} == {0, 2}
    assert adm.running[0].stop_ids == frozenset({2})


def test_duplicates_unknown_ids_and_bad_requests_are_refused():
    adm = Admission(64, 1)
    adm.submit(Request("a", 4, 4))
    assert "already waiting or running" in adm.submit(Request("a", 4, 4)).reason
    adm.finish("a")  # withdraws a waiting request
    with pytest.raises(KeyError, match="neither running nor waiting"):
        adm.finish("a")
    with pytest.raises(ValueError, match="max_new_tokens >= 1"):
        Request("b", 4, 0)
    with pytest.raises(ValueError, match="capacity_tokens >= 1"):
        Admission(0, 1)


def test_for_placement_uses_its_kv_capacity():
    p = plan(SMOLLM2_135M, spec_by_name("wse2"), MeshSpec(174, 128, 87, 64), kv=KVReserve(512, 8))
    adm = Admission.for_placement(p)
    assert (adm.capacity_tokens, adm.max_requests) == (p.kv_tokens, 8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=30),
       st.integers(1, 4), st.lists(st.integers(0, 3), max_size=60))
def test_nobody_starves(sizes, slots, finishing):
    adm = Admission(48, slots)
    accepted = [i for i, (p, n) in enumerate(sizes) if adm.submit(Request(i, p, n)) is None]
    assert accepted == [i for i, (p, n) in enumerate(sizes) if p + n <= 48]
    order = []
    picks = iter(finishing)
    while adm.waiting or adm.running:
        order += [r.rid for r in adm.admit()]
        assert len(adm.running) <= slots
        running = adm.running
        adm.finish(running[next(picks, 0) % len(running)].rid)  # any running request may finish next
    assert order == accepted  # everyone admitted, in submission order
