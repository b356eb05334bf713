"""helix.core.slices: a node's layers, and the one way between slices and a placement mapping."""

from __future__ import annotations

from helix.core.plan import Plan
from helix.core.slices import LayerSlice, as_placement, as_slices

# A plan file as Helix writes it (the placements' fields, their order and the file's text are the
# schema: a plan written before stays loadable and is written again the same).
PLAN_FILE = """\
model: tiny
num_layers: 8
placements:
- node: b
  start: 4
  end: 8
- node: a
  start: 0
  end: 4
- node: c
  start: 0
  end: 0
arc_flows:
- src: coordinator
  dst: a
  flow_tokens_per_s: 2.0
- src: a
  dst: b
  flow_tokens_per_s: 2.0
- src: b
  dst: coordinator
  flow_tokens_per_s: 2.0
max_flow_tokens_per_s: 2.0
upper_bound_tokens_per_s: null
method: milp
solver: null
solve_seconds: 0.0
partial_inference: true
spec_hash: null
serving: null
prediction: null
extras: {}
schema_version: 1
gap: null
"""


def test_a_slice_is_half_open():
    s = LayerSlice("a", 2, 6)
    assert s.num_layers == 4
    assert LayerSlice("a", 3, 3).num_layers == 0


def test_placement_and_slices_convert_both_ways():
    slices = (LayerSlice("b", 4, 8), LayerSlice("a", 0, 4), LayerSlice("c", 0, 0))
    assert as_placement(slices) == {"b": (4, 8), "a": (0, 4), "c": (0, 0)}
    assert list(as_placement(slices)) == ["b", "a", "c"]   # the slices' order
    assert as_placement(slices, skip_empty=True) == {"b": (4, 8), "a": (0, 4)}
    assert as_slices(as_placement(slices)) == slices
    # By layers: start, then end, then the node's name.
    placement = {"z": (0, 4), "b": (4, 8), "a": (4, 8), "y": (0, 2)}
    assert [s.node for s in as_slices(placement, by_layers=True)] == ["y", "z", "a", "b"]


def test_a_plan_file_loads_and_is_written_the_same(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN_FILE)
    plan = Plan.load(path)
    assert plan.placements == (LayerSlice("b", 4, 8), LayerSlice("a", 0, 4), LayerSlice("c", 0, 0))
    assert plan.placement_of("a") == LayerSlice("a", 0, 4)
    assert plan.to_yaml() == PLAN_FILE
