"""Interleaved weighted round robin (IWRR) over the out-arcs of one flow-graph vertex.

Helix (ASPLOS'25, section 5) gives every vertex an IWRR over its out-arcs weighted by the arc flows
of the max-flow solution, so that requests split across next hops in the proportions the planner
found. We use the *smooth* WRR of nginx: every pick adds each allowed choice's weight to its credit,
takes the choice with the largest credit and charges it the sum of the allowed weights. Over any
window the split matches the weights exactly up to one pick per choice, and consecutive picks of one
choice are spread out (interleaved) instead of bunched.

Masking: a pick may be restricted to a subset of choices (nodes whose KV cache is too full). Masked
choices neither gain nor lose credit, so the survivors share the traffic in their own proportions and
the masked ones resume exactly where they left off. Pure: no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


class IWRR:
    """Smooth weighted round robin over named choices with positive weights.

    Ties are broken by the order of ``weights`` (insertion order), so decisions are deterministic.
    """

    __slots__ = ("_keys", "_weights", "_credit", "_index")

    def __init__(self, weights: Mapping[str, float]) -> None:
        keys = [k for k, w in weights.items() if w > 0]
        if not keys:
            raise ValueError("IWRR needs at least one choice with a positive weight")
        self._keys: tuple[str, ...] = tuple(keys)
        self._weights: tuple[float, ...] = tuple(float(weights[k]) for k in keys)
        self._credit: list[float] = [0.0] * len(keys)
        self._index = {k: i for i, k in enumerate(keys)}

    @property
    def choices(self) -> tuple[str, ...]:
        return self._keys

    def weight(self, choice: str) -> float:
        i = self._index.get(choice)
        return 0.0 if i is None else self._weights[i]

    def pick(self, allowed: Container[str] | None = None) -> str | None:
        """Next choice among ``allowed`` (all when None); None when no choice is allowed."""
        keys = self._keys
        mask = (1 << len(keys)) - 1 if allowed is None else \
            sum(1 << i for i, k in enumerate(keys) if k in allowed)
        # A picker per call (not kept: an IWRR holds plain data, so copies stay independent).
        return self.picker([1 << i for i in range(len(keys))], keys)(mask)

    def picker(self, key_bits: Sequence[int], values: Sequence[T]) -> Callable[[int], T | None]:
        """:meth:`pick` for the decision path: ``pick(allowed)`` allows choice ``i`` when
        ``allowed & key_bits[i]`` and returns ``values[i]`` for the choice it makes (None when
        none is allowed). Picks through any picker of one IWRR share its credits."""
        credit, weights = self._credit, self._weights
        entries = tuple(zip(range(len(weights)), key_bits, weights))
        values = tuple(values)
        # Usually every choice is allowed: then no bit tests, and the total is known. (Summed in
        # choice order from 0.0, as the general loop does, so the credits come out the same.)
        every = sum(key_bits) if all(key_bits) else -1
        every_total = 0.0
        for weight in weights:
            every_total += weight
        first_weight, rest = weights[0], tuple(enumerate(weights))[1:]

        def pick(allowed: int) -> T | None:
            if allowed & every == every:
                best = 0
                top = credit[0] = credit[0] + first_weight
                for i, weight in rest:
                    c = credit[i] = credit[i] + weight
                    if c > top:
                        best, top = i, c
                credit[best] = top - every_total
                return values[best]
            best = -1
            total = top = 0.0
            for i, bit, weight in entries:
                if allowed & bit:
                    c = credit[i] = credit[i] + weight
                    total += weight
                    if best < 0 or c > top:
                        best, top = i, c
            if best < 0:
                return None
            credit[best] = top - total
            return values[best]
        return pick
