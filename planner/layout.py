"""An existing placement read from a file and checked against a problem (``helix plan --from``).

Two formats: the reference planner's ``*_sol.ini`` layouts (``[Solution] compute_node_<i + offset>
=[layers]``), whose node i is the problem's i-th node (``helix convert`` keeps the INI's order), and
this project's ``plan.yaml`` (node names). Every mismatch with the cluster is a
:class:`HelixUserError` of one line.
"""

from __future__ import annotations

from pathlib import Path

from helix.core.errors import HelixUserError, SpecError
from helix.core.slices import as_placement
from helix.core.units import format_size
from planner.flowgraph import Placement
from planner.search.baselines import fits
from planner.problem import PlacementProblem


def load_placement(path: str | Path, problem: PlacementProblem) -> Placement:
    """The placement stored in ``path`` (a reference ``.ini`` layout or a plan YAML), checked."""
    from helix.core.helix_ini import read_layout
    from helix.core.plan import Plan

    p = Path(path)
    try:
        if p.suffix.lower() == ".ini":
            by_index = read_layout(p)
            placement = {_node_at(problem, i, p): r for i, r in sorted(by_index.items())}
        else:
            plan = Plan.load(p)
            if plan.num_layers != problem.num_layers:
                raise HelixUserError(f"{p}: the plan is for {plan.num_layers} layers, the cluster's "
                                     f"model {problem.model} has {problem.num_layers}")
            placement = as_placement(plan.placements, skip_empty=True)
    except SpecError as exc:
        raise HelixUserError(str(exc)) from None
    check_placement_fits(problem, placement, str(p))
    return placement


def load_running(path: str | Path, problem: PlacementProblem) -> tuple[Placement, tuple[str, ...]]:
    """The placement a cluster runs (``path``: a plan.yaml or a reference layout) on the cluster
    as it is now: when the plan was made for another version of the cluster spec (its spec hash
    differs), its nodes that the cluster no longer has (they left) are dropped and returned, not
    refused; otherwise (the same spec: a typo) and for everything else it is checked as
    :func:`load_placement` does."""
    from helix.core.plan import Plan

    p = Path(path)
    if p.suffix.lower() == ".ini":
        return load_placement(p, problem), ()
    try:
        plan = Plan.load(p)
    except SpecError as exc:
        raise HelixUserError(str(exc)) from None
    names = {n.name for n in problem.nodes}
    changed = plan.spec_hash is not None and plan.spec_hash != problem.spec_hash
    gone = tuple(sorted(x.node for x in plan.placements
                        if changed and x.node not in names and x.end > x.start))
    if plan.num_layers != problem.num_layers:
        raise HelixUserError(f"{p}: the plan is for {plan.num_layers} layers, the cluster's "
                             f"model {problem.model} has {problem.num_layers}")
    placement = as_placement((x for x in plan.placements if x.node not in gone), skip_empty=True)
    check_placement_fits(problem, placement, str(p))
    return placement, gone


def _node_at(problem: PlacementProblem, index: int, path: Path) -> str:
    if not 0 <= index < len(problem.nodes):
        raise HelixUserError(f"{path}: node index {index} is outside the cluster's "
                             f"{len(problem.nodes)} nodes (0..{len(problem.nodes) - 1}; is the "
                             f"[Settings] offset right?)")
    return problem.nodes[index].name


def check_placement_fits(problem: PlacementProblem, placement: Placement, source: str) -> None:
    """Raise :class:`HelixUserError` naming the first node the placement cannot use as given."""
    names = [n.name for n in problem.nodes]
    L = problem.num_layers
    for name, (start, end) in placement.items():
        if name not in names:
            raise HelixUserError(f"{source}: unknown node {name!r}; the cluster has "
                                 f"{', '.join(names[:4])}{' ...' if len(names) > 4 else ''}")
        if not 0 <= start < end <= L:
            raise HelixUserError(f"{source}: {name} holds layers [{start}, {end}), outside the "
                                 f"model's [0, {L})")
        node = problem.node(name)
        if not fits(node, start, end, L):
            most = min(len(node.throughput_tokens_per_s), node.max_layers_for(start == 0, end == L))
            why = (f"it holds at most {most} layers there" if most < end - start else
                   f"it serves no tokens with {end - start} layers (T(k) = 0)")
            mem = f" ({format_size(node.memory_bytes)} usable)" if node.memory_bytes else ""
            raise HelixUserError(f"{source}: {name} ({node.gpu}{mem}) cannot hold {end - start} "
                                 f"layers [{start}, {end}): {why}")
