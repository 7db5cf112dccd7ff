"""Every Net's ``flash`` (STAR's sorted-updating FlashAttention over kept keys) returns kernels.sparse_attention's
Partial; the decode's Nets record its P.V as it runs, the kernel's (the prefill's sparse attention: P.V is
MeshGEMM's) its statistics alone, merged over a row by ``row_statistics``: pinned by hand (issue 31)."""

from __future__ import annotations

import numpy as np

from waferrt.core.cost import Cost
from waferrt.core.ledger import Ledger
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY, WSE2
from waferrt.decode.net import FastNet, HopNet, KernelNet
from waferrt.fabric.comm import Collectives, LineComm, Span
from waferrt.fabric.kernel import Context
from waferrt.kernels.sparse_attention import flash, row_statistics

RNG = np.random.default_rng(3)
REGION = Region(0, 0, 3, 2)  # 3 columns, 2 rows: an x-line of 3 cores, 2 such lines


def _flops(run) -> tuple[int, object]:
    ledger = Ledger(TINY)
    with ledger.op("attend"):
        part = run(ledger)
    return ledger.by_op["attend"].flops, part


def test_fast_and_hop_by_hop_record_every_cores_pv_over_the_keys_it_holds():
    """2 rows, 6 kept keys joined, the fullest core holding 2 of them, D = 4 values split over the x-line's 2
    lines (2 a core): 2 flops x 2 rows x 2 keys x 2 values = 16. Hop by hop the same 6 keys as 3 cores x 2."""
    s, kept, vs = RNG.normal(size=(2, 6)).astype(np.float32), np.ones((2, 6), bool), RNG.normal(size=(2, 6, 4))
    fast, part = _flops(lambda ledger: FastNet(Collectives()).flash(
        LineComm("x", Span.of(REGION), ledger, fast=True), s, kept, vs, 2))
    assert fast == 16 and np.array_equal(part.acc, flash(s, kept, vs).acc)
    hop, _ = _flops(lambda ledger: HopNet(Collectives(fast=False)).flash(
        LineComm("x", Span.of(REGION), ledger, fast=False), s.reshape(2, 3, 2), kept.reshape(2, 3, 2),
        vs.reshape(2, 3, 2, 4)))
    assert hop == 16


def test_the_kernels_net_merges_its_cores_statistics_and_records_the_softmax_of_the_kept_keys():
    """KernelNet on a 2x2 square, every core a block of 3 queries x 5 kept scores: flash gives each core's
    statistics (the P.V is MeshGEMM's: nothing recorded), row_statistics merges the 2 cores of each row into
    the row's max and sum (the allreduce's messages, no flops of its own here), and the softmax's element-wise
    work over 2 kept keys a core records 6 flops x 3 queries x 2 = 36."""
    s = RNG.normal(size=(2, 2, 3, 5)).astype(np.float32)
    ledger = Ledger(TINY)
    net = KernelNet(Context(Span.of(Region(0, 0, 2, 2)), ledger, {}))
    with ledger.op("attend"):
        part = net.flash(None, s, s > -9)
    assert ledger.by_op["attend"] == Cost() and np.array_equal(part.total, flash(s, s > -9).total)
    with ledger.op("merge"):
        top, total, _ = row_statistics(net, None, part)
    np.testing.assert_array_equal(top[:, 0], top[:, 1])  # every core of a row holds the row's max
    np.testing.assert_array_equal(top[:, 0], s.max(axis=(1, 3), keepdims=True)[:, 0])
    np.testing.assert_allclose(total[:, 0, :, 0], np.exp(s - top).sum(axis=(1, 3))[:, :], rtol=1e-6)
    assert ledger.by_op["merge"].messages > 0
    with ledger.op("softmax"):
        net.elementwise(None, "softmax", s, 2)
    assert ledger.by_op["softmax"].flops == 36


def test_the_prediction_records_every_cores_partial_products_at_the_prediction_rate():
    """On the y-lines of the 3x2 region (2 cores a line, 3 lines): 2 query rows of D = 4 (2 a core) against 5
    positions a core: 2 flops x 2 rows x 2 x 5 = 40, at PREDICT_DTYPE's rate: on WSE2 float16's 8 flops a
    cycle, 5 cycles (float32's 2 a cycle would give 20). Hop by hop the same as (items, 2
    cores, 1 row, 2) against (items, 2 cores, 2, 3 lines x 5 positions)."""
    a, b = RNG.normal(size=(2, 1, 4)), RNG.normal(size=(2, 4, 15))
    for net, x, y in [(FastNet(Collectives()), a, b[..., :5]),
                      (HopNet(Collectives(fast=False)), a.reshape(2, 1, 2, 2).transpose(0, 2, 1, 3),
                       b.reshape(2, 2, 2, 15))]:
        ledger = Ledger(WSE2)
        with ledger.op("predict"):
            out = net.predict(LineComm("y", Span.of(REGION), ledger, fast=net.fast), x, y, 5 if net.fast else 0)
        assert (ledger.by_op["predict"].flops, ledger.by_op["predict"].cycles) == (40, 5.0)
        assert np.array_equal(out, np.matmul(x, y))
