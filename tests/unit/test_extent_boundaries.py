"""A size in cores travels as a core.mesh.Extent (issue 31): a plain (width, height) pair -- a preset's tuple, a
saved spec's JSON list, a command line's WxH, ``Wafer(mesh=(4, 2))`` as the docs write it -- converts once
where it comes in, and is reached by name after."""

from __future__ import annotations

import json

import pytest

import waferrt
from waferrt.cli.common import parse_wxh
from waferrt.core.mesh import Extent, MeshSpec
from waferrt.core.spec import WSE2, HardwareSpec


def test_a_specs_full_mesh_is_an_extent_from_a_preset_and_from_json():
    assert type(WSE2.full_mesh) is Extent and WSE2.full_mesh.width == 750 and WSE2.full_mesh.height == 994
    back = HardwareSpec.from_dict(json.loads(json.dumps(WSE2.as_dict())))  # the JSON list (750, 994) came back
    assert back == WSE2 and hash(back) == hash(WSE2) and type(back.full_mesh) is Extent
    assert WSE2.replace(full_mesh=(3, 2)).cores == 6


def test_the_command_lines_wxh_and_the_wafers_pairs_become_extents():
    assert type(parse_wxh("16x8")) is Extent and parse_wxh("16x8").height == 8
    wafer = waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=Extent(2, 2), backend="local")  # not opened: no tiles
    assert wafer.mesh == MeshSpec(4, 2, 2, 2)
    with pytest.raises(TypeError, match=r"tile is a \(width, height\) pair of core counts, e.g. \(8, 8\); got "
                                        r"\(2, 2.5\) \(Extent.height must be a whole number"):
        waferrt.Wafer(spec="tiny", mesh=(4, 2), tile=(2, 2.5), backend="local")
    with pytest.raises(TypeError, match=r"mesh is a \(width, height\) pair of core counts, e.g. \(8, 8\); got 4"):
        waferrt.Wafer(spec="tiny", mesh=4, backend="local")


def test_a_mesh_of_whole_tiles_is_grid_times_tile():
    """3 tiles across and 2 down of 4x5 cores: 12x10 cores (worked by hand), healthy."""
    assert MeshSpec.tiled(Extent(3, 2), Extent(4, 5)) == MeshSpec(12, 10, 4, 5)
    assert MeshSpec.tiled(Extent(3, 2), Extent(4, 5)).tile == Extent(4, 5)
