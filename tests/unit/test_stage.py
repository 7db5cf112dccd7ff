"""The decode's stages as named values (decode.stage): a chain worked out by hand, the words the kinds are
written as, and the errors that teach how to make a Stage."""

from __future__ import annotations

import pytest

from waferrt.core.mesh import Region
from waferrt.decode.stage import Entry, Stage, StageKind, chain, entries
from waferrt.decode.streaming import StreamBlock, stream_order

E, A, B = Region(0, 0, 4, 1), Region(0, 1, 2, 2), Region(2, 1, 2, 2)


def test_a_chain_by_hand():
    """Two layers stacked on A, one on B, the head back on the embedding's band: five stages, in order, each
    entered from the one before (between the stacked layers from their own region: nothing moves)."""
    stages = chain(E, [A, A, B], E)
    assert stages == (Stage(StageKind.EMBED, E), Stage(StageKind.LAYER, A, 0), Stage(StageKind.LAYER, A, 1),
                      Stage(StageKind.LAYER, B, 2), Stage(StageKind.HEAD, E))
    assert [st.name for st in stages] == ["embed", "layer 0", "layer 1", "layer 2", "head"]
    assert [st.what for st in stages] == ["the embedding/head", "layer 0", "layer 1", "layer 2", "the embedding/head"]
    assert entries(stages) == [Entry(StageKind.EMBED, None, E), Entry(StageKind.LAYER, E, A),
                               Entry(StageKind.LAYER, A, A), Entry(StageKind.LAYER, A, B), Entry(StageKind.HEAD, B, E)]


def test_the_kinds_are_written_as_the_words_files_and_traces_carry():
    assert [k.value for k in StageKind] == ["embed", "layer", "head"]
    assert StageKind("layer") is StageKind.LAYER


@pytest.mark.parametrize("args,says", [
    ((StageKind.LAYER, A), "a layer stage with no layer index: write Stage(StageKind.LAYER, region, i)"),
    ((StageKind.HEAD, E, 3), "a head stage with layer 3"),
    (("layer", A, 0), "a stage's kind is a StageKind (StageKind.LAYER, ...), not 'layer'"),
])
def test_a_stage_says_how_to_write_it(args, says):
    with pytest.raises((ValueError, TypeError), match=r"^" + says.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        Stage(*args)


def test_the_blocks_stream_in_the_decodes_order():
    assert stream_order(2, 3) == [StreamBlock(StageKind.LAYER, 0), StreamBlock(StageKind.LAYER, 1),
                                  StreamBlock(StageKind.HEAD, 0), StreamBlock(StageKind.HEAD, 1),
                                  StreamBlock(StageKind.HEAD, 2)]
    with pytest.raises(ValueError, match="the embedding streams by rows"):
        StreamBlock(StageKind.EMBED, 0)
