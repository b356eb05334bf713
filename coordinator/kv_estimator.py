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

The decision path asks "does this request fit?" of many nodes per decision, while one decision
changes only the few nodes of one pipeline. So the estimator keeps a log of the nodes it changed
(:attr:`KVEstimator.version`, :meth:`KVEstimator.changed_since`), and a :class:`FitMask` re-tests
only those nodes between two decisions for requests of the same size.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

_LOG_LIMIT = 4096
"""Change-log entries kept; a reader further behind than this re-tests every node."""


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
        self._log: list[str] = []   # nodes whose estimate changed, oldest first (repeats allowed)
        self._log_base = 0          # version of self._log[0]: entries dropped so far

    @property
    def version(self) -> int:
        """Number of per-node changes so far (reserve, release, observe); only grows."""
        return self._log_base + len(self._log)

    def changed_since(self, version: int) -> list[str] | None:
        """Nodes whose estimate may have changed after :attr:`version` was ``version`` (in order,
        with repeats), or None when the log no longer reaches back that far: assume every node."""
        start = version - self._log_base
        return self._log[start:] if start >= 0 else None

    def _trim_log(self) -> None:
        if len(self._log) > _LOG_LIMIT:
            self._log_base += len(self._log)
            self._log.clear()

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
        function call per node (:class:`FitMask` is the decision path's form)."""
        reserved, observed, limit = self._reserved, self._observed, self._limit

        def fits(node: str) -> bool:
            r, o = reserved[node], observed[node]
            return (o if o > r else r) + tokens * layers[node] <= limit[node]   # = fits()
        return fits

    def reserve(self, request_id: Hashable, amounts: Iterable[tuple[str, float]]) -> None:
        """Record ``request_id``'s reservation: (node, token-layers) pairs. Replaces an earlier one."""
        self.release(request_id)
        amounts = tuple(amounts)
        reserved, log = self._reserved, self._log
        for node, token_layers in amounts:
            reserved[node] += token_layers
            log.append(node)
        self._by_request[request_id] = amounts

    def release(self, request_id: Hashable) -> None:
        """Forget ``request_id``'s reservation (finished, cancelled). Unknown ids are ignored."""
        self._trim_log()
        reserved, log = self._reserved, self._log
        for node, token_layers in self._by_request.pop(request_id, ()):
            left = reserved[node] - token_layers
            # Float sums drift; an empty node must read exactly zero.
            reserved[node] = left if left > 1e-6 else 0.0
            log.append(node)

    def observe(self, node: str, used_token_layers: float) -> None:
        """A worker's real usage report; the estimate never reads below it until the next report."""
        self._trim_log()
        self._observed[node] = float(used_token_layers)
        self._log.append(node)

    def num_reserved(self) -> int:
        return len(self._by_request)


class FitMask:
    """The nodes where a request of ``tokens`` fits, as a bitmask (bit ``i``: ``nodes[i]``).

    Exactly :meth:`KVEstimator.fits` for ``tokens * layers[node]`` on every node (the same float
    expression), but kept in step with the estimator through its change log: between two calls for
    the same token count only the nodes changed in between are re-tested. A different token count,
    or a log that was trimmed past this mask's version, re-tests every node.
    """

    __slots__ = ("_kv", "_nodes", "_index", "_layers", "_tokens", "_version", "_mask")

    def __init__(self, kv: KVEstimator, nodes: Sequence[str], layers: Mapping[str, int]) -> None:
        self._kv = kv
        self._nodes = tuple(nodes)
        self._index = {n: i for i, n in enumerate(self._nodes)}
        self._layers = tuple(layers[n] for n in self._nodes)
        self._tokens: float | None = None
        self._version = -1
        self._mask = 0

    def allowed(self, tokens: float) -> int:
        """Bitmask of the nodes where reserving ``tokens * layers[node]`` keeps them at or below
        their high-water mark."""
        kv = self._kv
        changed = kv.changed_since(self._version) if tokens == self._tokens \
            and type(tokens) is type(self._tokens) else None
        if changed is None:
            self._tokens = tokens
            self._mask = self._test(range(len(self._nodes)), 0)
        elif changed:
            index = self._index
            self._mask = self._test({index[n] for n in changed if n in index}, self._mask)
        self._version = kv.version
        return self._mask

    def _test(self, indices: Iterable[int], mask: int) -> int:
        reserved, observed, limit = self._kv._reserved, self._kv._observed, self._kv._limit
        nodes, layers, tokens = self._nodes, self._layers, self._tokens
        for i in indices:
            node = nodes[i]
            r, o = reserved[node], observed[node]
            if (o if o > r else r) + tokens * layers[i] <= limit[node]:   # = fits()
                mask |= 1 << i
            else:
                mask &= ~(1 << i)
        return mask
