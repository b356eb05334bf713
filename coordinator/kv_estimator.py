"""The coordinator's estimate of every node's KV-cache use, for masking nodes before they overflow.

The unit is the *token-layer*: one position of one request cached in one layer. A node holding ``k``
layers with room for ``n`` positions in each has ``n * k`` token-layers; a request that runs ``j`` of
those layers for ``p`` prompt and ``o`` output tokens will use ``(p + o) * j`` of them at its longest.

The coordinator does not know ``o`` in advance, so it reserves an *expected* output length (the
workload mean, or ``max_tokens`` when smaller). A node is masked for a request when its estimate plus
that request's reservation would pass ``high_water`` times its capacity (Helix section 5: "nodes
whose KV cache would pass a high-water mark are masked out"). The estimate is an estimate: the worker
still tracks its real blocks and preempts on overflow. The live coordinator corrects the estimate
with the workers' reported usage (:meth:`KVEstimator.observe`). Pure bookkeeping, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping


class KVEstimator:
    """Per-node reserved token-layers against a high-water mark of each node's capacity."""

    def __init__(self, capacity_token_layers: Mapping[str, float], high_water: float = 0.9) -> None:
        if not 0.0 < high_water <= 1.0:
            raise ValueError(f"high_water must be in (0, 1], got {high_water}")
        self.high_water = high_water
        self._limit = {n: high_water * float(c) for n, c in capacity_token_layers.items()}
        self._capacity = {n: float(c) for n, c in capacity_token_layers.items()}
        self._reserved: dict[str, float] = {n: 0.0 for n in capacity_token_layers}
        self._observed: dict[str, float] = {n: 0.0 for n in capacity_token_layers}
        self._by_request: dict[Hashable, tuple[tuple[str, float], ...]] = {}

    def capacity(self, node: str) -> float:
        return self._capacity[node]

    def used(self, node: str) -> float:
        """Estimated token-layers in use: the larger of the reservations and the last observation."""
        return max(self._reserved[node], self._observed[node])

    def usage_fraction(self, node: str) -> float:
        cap = self._capacity[node]
        return self.used(node) / cap if cap > 0 else 1.0

    def fits(self, node: str, token_layers: float) -> bool:
        """Whether reserving ``token_layers`` more keeps ``node`` at or below its high-water mark."""
        return self.used(node) + token_layers <= self._limit[node]

    def fits_request(self, tokens: float, layers: Mapping[str, int]) -> Callable[[str], bool]:
        """``node -> fits(node, tokens * layers[node])`` for one scheduling decision, as one
        function call per node (the decision path asks it for every node its walk looks at)."""
        reserved, observed, limit = self._reserved, self._observed, self._limit

        def fits(node: str) -> bool:
            r, o = reserved[node], observed[node]
            return (o if o > r else r) + tokens * layers[node] <= limit[node]   # = fits()
        return fits

    def reserve(self, request_id: Hashable, amounts: Iterable[tuple[str, float]]) -> None:
        """Record ``request_id``'s reservation: (node, token-layers) pairs. Replaces an earlier one."""
        self.release(request_id)
        amounts = tuple(amounts)
        for node, token_layers in amounts:
            self._reserved[node] += token_layers
        self._by_request[request_id] = amounts

    def release(self, request_id: Hashable) -> None:
        """Forget ``request_id``'s reservation (finished, cancelled). Unknown ids are ignored."""
        for node, token_layers in self._by_request.pop(request_id, ()):
            left = self._reserved[node] - token_layers
            # Float sums drift; an empty node must read exactly zero.
            self._reserved[node] = left if left > 1e-6 else 0.0

    def observe(self, node: str, used_token_layers: float) -> None:
        """A worker's real usage report; the estimate never reads below it until the next report."""
        self._observed[node] = float(used_token_layers)

    def num_reserved(self) -> int:
        return len(self._by_request)
