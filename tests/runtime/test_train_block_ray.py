"""A Llama block's backward (waferrt.training.block) through the real path -- Ray tile actors, pyzmq links, the
DSM -- on an 8x8 mesh of two tiles: dx and the weight gradients equal the Ray-free run's, and so does what it
books, op by op."""

from __future__ import annotations

import numpy as np

from waferrt.core.mesh import MeshSpec
from waferrt.core.spec import TINY
from waferrt.model import synthetic_llama, tiny_config
from waferrt.runtime import Wafer
from waferrt.training.block import block_backward, block_forward


def test_the_block_backward_on_tile_actors_is_the_local_ones(ray_session):
    config = tiny_config()
    layer = synthetic_llama(config, seed=1).layers[1]
    rng = np.random.default_rng(2)
    x, dy = (rng.standard_normal((6, config.dim)).astype(np.float32) for _ in range(2))
    _, saved = block_forward(config, layer, x)
    runs = {}
    for backend in ("ray", "local"):
        with Wafer(spec=TINY, mesh=MeshSpec(8, 8, 4, 8), backend=backend) as wafer:
            runs[backend] = (*block_backward(wafer, config, layer, saved, dy), wafer.cost().by_op)
    (dx, grads, cost), (dx_l, grads_l, cost_l) = runs["ray"], runs["local"]
    np.testing.assert_allclose(dx, dx_l, rtol=1e-6, atol=1e-6)
    for name, g in grads.items():
        np.testing.assert_allclose(g, grads_l[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert cost == cost_l
