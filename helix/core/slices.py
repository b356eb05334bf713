"""A node's layers: :class:`LayerSlice`, the one type for "node ``node`` holds (or runs) layers
``[start, end)``", and its conversions to and from a :data:`Placement` mapping.

A plan's placements, a pipeline's stages and a worker's slice are all layer slices. The planner's
algorithms look ranges up by node, so they work on a :data:`Placement` (node -> ``(start, end)``);
:func:`as_placement` and :func:`as_slices` are the only ways between the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Placement = Mapping[str, tuple[int, int]]
"""Node name -> the layers ``(start, end)`` it holds, half-open, 0-based; a node absent from the
mapping holds nothing."""


@dataclass(frozen=True)
class LayerSlice:
    """Layers ``[start, end)`` held (or run) by ``node``; half-open, 0-based."""

    node: str
    start: int
    end: int

    @property
    def num_layers(self) -> int:
        return self.end - self.start


def as_placement(slices: Iterable[LayerSlice], *,
                 skip_empty: bool = False) -> dict[str, tuple[int, int]]:
    """Node -> ``(start, end)`` of ``slices`` in their order; ``skip_empty``: without the slices
    that hold no layer (``start == end``)."""
    return {s.node: (s.start, s.end) for s in slices if not skip_empty or s.end > s.start}


def as_slices(placement: Placement, *, by_layers: bool = False) -> tuple[LayerSlice, ...]:
    """The slices of ``placement``, in its order, or with ``by_layers`` sorted by ``(start, end,
    node)`` (the order a plan file lists them in)."""
    items = placement.items()
    if by_layers:
        items = sorted(items, key=lambda t: (t[1], t[0]))
    return tuple(LayerSlice(n, s, e) for n, (s, e) in items)
