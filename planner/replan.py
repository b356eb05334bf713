"""Re-planning a cluster that changed: is a new placement worth the layers it moves?

A running cluster has a placement; nodes join or leave, or the workload's mix moves the node
capacities. :func:`decide` weighs the placement the planner proposes against the one running:

- *current*: the running placement, less the nodes that are gone, on the cluster as it is now:
  its max flow and what users get from it (:func:`planner.predicted.predict_best_routing`). It is
  0 when some layer lost every node that held it: then any placement that serves is adopted.
- *moves*: every node whose range changes loads the layers it did not hold (bytes = layers x the
  model's layer bytes, plus the embedding / LM head when it newly holds the first / last layer)
  over its link from the coordinator (where the weights come from), in ``bytes / bandwidth``
  seconds. A node whose memory holds its old and its new layers side by side (the union within
  its most layers, :class:`~planner.problem.NodeCapacity`) loads beside the slice it serves and
  loses nothing; otherwise it stops serving while it loads, and every running pipeline through
  it (:func:`helix.core.pipelines.enumerate_pipelines`) loses its share of the requests until its
  longest such load is done (the *cost*, in tokens).
- *switch*: routing switches when the slowest load is done; until then the current placement
  serves. *gain* = (proposed - current) tokens/s x (horizon - switch seconds).
- *adopt* when the gain, less the cost, exceeds ``hysteresis`` x current x horizon: a proposal
  must beat the running placement by that margin after paying for its moves, so two nearly equal
  placements never alternate (each sees the other inside the margin).

Pure: no clock, no randomness beyond the planner's seeded search.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from helix.core.pipelines import enumerate_pipelines
from helix.core.plan import COORDINATOR, Plan
from helix.core.slices import as_placement
from helix.core.spec import ClusterSpec
from planner.flowgraph import Placement
from planner.problem import PlacementProblem

#: Seconds over which a re-plan must pay for itself.
HORIZON_S = 600.0

#: A proposal must beat the running placement by this fraction (after the moves' cost).
HYSTERESIS = 0.05


@dataclass(frozen=True)
class Move:
    """One node's change of range (None: it holds no layers)."""

    node: str
    old: tuple[int, int] | None
    new: tuple[int, int] | None
    load_bytes: float
    load_s: float
    beside: bool
    """It loads beside the slice it serves (memory holds both); else it stops serving meanwhile."""


@dataclass(frozen=True)
class Decision:
    adopt: bool
    reason: str
    current_tokens_per_s: float
    """What the running placement serves on today's cluster (predicted prompt + decode)."""
    proposed_tokens_per_s: float
    moves: tuple[Move, ...]
    switch_s: float
    gain_tokens: float
    cost_tokens: float
    horizon_s: float
    hysteresis: float
    dropped_nodes: tuple[str, ...]
    """Nodes of the running placement that the cluster no longer has."""

    def to_dict(self) -> dict:
        return asdict(self)


def _throughput(plan: Plan) -> float:
    pr = plan.prediction
    return plan.max_flow_tokens_per_s if pr is None else pr.prompt_decode_tokens_per_s


def moves(spec: ClusterSpec, problem: PlacementProblem, current: Placement,
          proposed: Placement) -> tuple[Move, ...]:
    """The moves from ``current`` to ``proposed`` (module docstring), in node order."""
    from helix.core.costmodel import CostModel
    cost = CostModel.for_cluster(spec)
    model, b = cost.model, cost.dtype_bytes
    L = problem.num_layers
    out = []
    for node in problem.nodes:
        old, new = current.get(node.name), proposed.get(node.name)
        old = old if old and old[1] > old[0] else None
        new = new if new and new[1] > new[0] else None
        if old == new:
            continue
        held = set(range(*old)) if old else set()
        wanted = set(range(*new)) if new else set()
        load = len(wanted - held) * model.layer_bytes(b)
        if new and new[0] == 0 and not (old and old[0] == 0):
            load += model.embedding_bytes(b)
        if new and new[1] == L and not (old and old[1] == L):
            load += model.lm_head_bytes(b)
        link = spec.link(COORDINATOR, node.name)
        seconds = load / link.bandwidth_bytes_per_s if link and load else 0.0
        union = held | wanted
        first, last = 0 in union, (L - 1) in union
        room = node.max_layers_first_last if first and last else node.max_layers_first if first \
            else node.max_layers_last if last else node.max_layers
        beside = old is None or new is None or (bool(union) and max(union) - min(union) + 1 <= room)
        out.append(Move(node.name, old, new, load, seconds, beside))
    return tuple(out)


def decide(spec: ClusterSpec, problem: PlacementProblem, current_plan: Plan, proposed_plan: Plan,
           *, horizon_s: float = HORIZON_S, hysteresis: float = HYSTERESIS,
           dropped_nodes: tuple[str, ...] = ()) -> Decision:
    """Adopt ``proposed_plan`` instead of ``current_plan`` (both on ``problem``, today's cluster)?"""
    if horizon_s <= 0:
        raise ValueError(f"horizon_s must be > 0, got {horizon_s}")
    if hysteresis < 0:
        raise ValueError(f"hysteresis must be >= 0, got {hysteresis}")
    cur = as_placement(current_plan.placements, skip_empty=True)
    new = as_placement(proposed_plan.placements, skip_empty=True)
    now, then = _throughput(current_plan), _throughput(proposed_plan)
    ms = moves(spec, problem, cur, new)
    switch = max((m.load_s for m in ms), default=0.0)
    # A running pipeline stops while any of its nodes that cannot load beside loads: its share of
    # the requests, for its longest such load (once per pipeline, not once per node on it).
    stop_s = {m.node: m.load_s for m in ms if not m.beside}
    lost_s = sum(p.share * max((stop_s.get(n, 0.0) for n in p.nodes), default=0.0)
                 for p in enumerate_pipelines(current_plan)) if stop_s else 0.0
    cost = now * lost_s
    gain = (then - now) * max(0.0, horizon_s - switch)
    margin = hysteresis * now * horizon_s
    if not ms:
        adopt, reason = False, "the proposal is the running placement"
    elif now <= 0 < then:
        adopt, reason = True, "the running placement no longer serves every layer"
    elif gain - cost > margin:
        adopt, reason = True, (f"gain {gain:,.0f} tokens over {horizon_s:.0f} s pays for the moves "
                               f"({cost:,.0f}) and the {hysteresis:.0%} margin ({margin:,.0f})")
    else:
        adopt, reason = False, (f"gain {gain:,.0f} tokens over {horizon_s:.0f} s does not pay for "
                                f"the moves ({cost:,.0f}) and the {hysteresis:.0%} margin "
                                f"({margin:,.0f}): keep the running placement")
    return Decision(adopt, reason, now, then, ms, switch, gain, cost, horizon_s, hysteresis,
                    tuple(dropped_nodes))
