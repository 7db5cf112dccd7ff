"""Hand-computed pins for the owners of cost facts (issue 31): each number below is worked out by hand in
its comment, so that breaking the owner fails here even where both sides of every tie call it.

- ``core.cost.alltoall_cost``: a phase counted link by link (``decode.linkload.LinkLoad``) and a line's
  all-to-all (``line_alltoall_cost``), on TINY (alpha 1, beta 8, 4 bytes per link per cycle).
"""

from __future__ import annotations

from waferrt.core.cost import Phase, alltoall_cost, line_alltoall_cost
from waferrt.core.mesh import Region
from waferrt.core.spec import TINY
from waferrt.decode.linkload import LinkLoad


def test_a_phase_counted_link_by_link_by_hand():
    """Two messages at once on a 5x2 region: 40 bytes 3 hops east along row 0, 8 bytes 1 hop south down
    column 4. Longest route 3 hops, busiest link 40 bytes: 3*1 + 8 + 40/4 = 21 cycles; 3*40 + 8 link bytes."""
    load = LinkLoad(Region(0, 0, 5, 2))
    load.along_row(0, 1, 4, 40)
    load.along_column(4, 0, 1, 8)
    c = alltoall_cost(TINY, load)
    assert (c.hops, c.stages, c.messages, c.link_bytes) == (3, 1, 2, 128)
    assert c.cycles == 21.0
    assert alltoall_cost(TINY, LinkLoad(Region(0, 0, 5, 2))).cycles == 0  # nothing sent: free


def test_a_line_alltoall_by_hand():
    """A mesh line of 3, 30 bytes per core: chunks of 10; the middle links carry 2 chunks (1x2 cross each),
    the longest route 2 hops: 2*1 + 8 + 20/4 = 15 cycles; 6 messages; hops summed 8 (1+2+1 each way) x 10."""
    c = line_alltoall_cost(TINY, 3, 30)
    assert (c.hops, c.messages, c.link_bytes, c.cycles) == (2, 6, 80, 15.0)
    assert alltoall_cost(TINY, Phase(hops=2, messages=6, link_bytes=80, busiest=20)) == c
