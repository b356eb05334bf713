"""The coordinator's estimate of every node's KV-cache use, for masking nodes before they overflow.

The unit is the *token-layer*: one position of one request cached in one layer. A node holding ``k``
layers with room for ``n`` positions in each has ``n * k`` token-layers; a request that runs ``j`` of
those layers for ``p`` prompt and ``o`` output tokens will use ``(p + o) * j`` of them at its longest.

The coordinator does not know ``o`` in advance, so it reserves an *expected* output length (the
workload mean, or ``max_tokens`` when smaller; live, the running mean of :class:`OutputLengthMean`).
A node is masked for a request when its estimate plus that request's reservation would pass
``high_water`` times its capacity (Helix section 5: "nodes whose KV cache would pass a high-water
mark are masked out"). The estimate is an estimate: the worker still tracks its real blocks and
preempts on overflow. The live coordinator corrects the estimate with the workers' reported usage
(:meth:`KVEstimator.observe`). Pure bookkeeping, no clock.

The decision path asks "does this request fit?" of many nodes per decision, while one decision
changes only the few nodes of one pipeline. So the estimator logs the nodes whose estimate grew and
those whose estimate shrank, and a :class:`FitMask` re-tests between two decisions (for requests of
the same size) only the nodes that may have crossed the high-water mark: grown ones that fitted,
shrunk ones that did not.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

from helix.core.serving import ServingSpec
from helix.core.spec import WorkloadSpec

_LOG_LIMIT = 4096
"""Change-log entries kept; a reader further behind than this re-tests every node."""


class KVEstimator:
    """Per-node reserved token-layers against a high-water mark of each node's capacity."""

    def __init__(self, capacity_token_layers: Mapping[str, float],
                 high_water: float = ServingSpec().kv_high_water) -> None:
        if not 0.0 < high_water <= 1.0:
            raise ValueError(f"high_water must be in (0, 1], got {high_water}")
        self.high_water = high_water
        self._limit = {n: high_water * float(c) for n, c in capacity_token_layers.items()}
        self._capacity = {n: float(c) for n, c in capacity_token_layers.items()}
        self._reserved: dict[str, float] = {n: 0.0 for n in capacity_token_layers}
        self._observed: dict[str, float] = {n: 0.0 for n in capacity_token_layers}
        self._by_request: dict[Hashable, tuple[tuple[str, float], ...]] = {}
        # Change logs for FitMask, append-only until trimmed together (a new epoch).
        self._grown: list[str] = []    # nodes whose estimate grew (or may have)
        self._shrunk: list[str] = []   # nodes whose estimate shrank (or may have)
        self._log_epoch = 0

    def _trim_logs(self) -> None:
        self._log_epoch += 1
        self._grown.clear()
        self._shrunk.clear()

    def capacity(self, node: str) -> float:
        return self._capacity[node]

    def used(self, node: str) -> float:
        """Estimated token-layers in use: the larger of the reservations and the last observation."""
        return max(self._reserved[node], self._observed[node])

    def usage_fraction(self, node: str) -> float:
        cap = self._capacity[node]
        return self.used(node) / cap if cap > 0 else 1.0

    def least_used(self, nodes: Iterable[str]) -> str:
        """The node of ``nodes`` with the lowest :meth:`usage_fraction`, the first one on ties."""
        reserved, observed, capacity = self._reserved, self._observed, self._capacity
        best, best_fraction = None, 0.0
        for node in nodes:
            r, o, cap = reserved[node], observed[node], capacity[node]
            fraction = (o if o > r else r) / cap if cap > 0 else 1.0   # = usage_fraction()
            if best is None or fraction < best_fraction:
                best, best_fraction = node, fraction
        if best is None:
            raise ValueError("least_used() of no nodes")
        return best

    def fits(self, node: str, token_layers: float) -> bool:
        """Whether reserving ``token_layers`` more keeps ``node`` at or below its high-water mark."""
        return self.used(node) + token_layers <= self._limit[node]

    def reserve(self, request_id: Hashable, amounts: Iterable[tuple[str, float]]) -> None:
        """Record ``request_id``'s reservation: (node, token-layers) pairs. Replaces an earlier one."""
        if request_id in self._by_request:
            self.release(request_id)
        amounts = tuple(amounts)
        reserved, grown, shrunk = self._reserved, self._grown, self._shrunk
        if len(grown) > _LOG_LIMIT:
            self._trim_logs()
        for node, token_layers in amounts:
            before = reserved[node]
            after = reserved[node] = before + token_layers
            (shrunk if after < before else grown).append(node)
        self._by_request[request_id] = amounts

    def release(self, request_id: Hashable) -> None:
        """Forget ``request_id``'s reservation (finished, cancelled). Unknown ids are ignored."""
        reserved, grown, shrunk = self._reserved, self._grown, self._shrunk
        if len(shrunk) > _LOG_LIMIT:
            self._trim_logs()
        for node, token_layers in self._by_request.pop(request_id, ()):
            before = reserved[node]
            left = before - token_layers
            # Float sums drift; an empty node must read exactly zero.
            after = reserved[node] = left if left > 1e-6 else 0.0
            (grown if after > before else shrunk).append(node)

    def observe(self, node: str, used_token_layers: float) -> None:
        """A worker's real usage report; the estimate never reads below it until the next report."""
        if len(self._grown) > _LOG_LIMIT or len(self._shrunk) > _LOG_LIMIT:
            self._trim_logs()
        self._observed[node] = float(used_token_layers)
        self._grown.append(node)
        self._shrunk.append(node)

    def num_reserved(self) -> int:
        return len(self._by_request)

    def resize(self, capacity_token_layers: Mapping[str, float]) -> None:
        """New capacities for the nodes named (a re-planned node's new slice; a node that joins
        starts empty); reservations in flight stay as they are, other nodes keep theirs."""
        for node, cap in capacity_token_layers.items():
            self._capacity[node] = float(cap)
            self._limit[node] = self.high_water * float(cap)
            self._reserved.setdefault(node, 0.0)
            self._observed.setdefault(node, 0.0)
            self._grown.append(node)    # either way: a FitMask re-tests it
            self._shrunk.append(node)


class FitMask:
    """The nodes where a request of ``tokens`` fits, as a bitmask (bit ``i``: ``nodes[i]``).

    Exactly :meth:`KVEstimator.fits` for ``tokens * layers[node]`` on every node (the same float
    expression), kept in step with the estimator through its change logs. ``fits`` is monotone in
    both the node's ``used`` and the request size (float rounding keeps order), so from one call to
    the next only the nodes that may have crossed the mark are re-tested: for the same size, grown
    nodes that fitted and shrunk ones that did not; for a smaller request, grown nodes that fitted
    and every node that did not; for a larger one, every node that fitted and shrunk ones that did
    not. Logs trimmed since the last call re-test every node.
    """

    __slots__ = ("_kv", "_nodes", "_node_bit_layers", "_every", "_tokens", "_epoch", "_seen",
                 "_mask")

    def __init__(self, kv: KVEstimator, nodes: Sequence[str], layers: Mapping[str, int]) -> None:
        self._kv = kv
        self._nodes = tuple(nodes)
        self._node_bit_layers = {n: (1 << i, layers[n]) for i, n in enumerate(self._nodes)}
        self._every = (1 << len(self._nodes)) - 1
        self._tokens: float | None = None
        self._epoch = -1
        self._seen = (0, 0)   # lengths of the grown and shrunk logs already applied
        self._mask = 0

    def allowed(self, tokens: float) -> int:
        """Bitmask of the nodes where reserving ``tokens * layers[node]`` keeps them at or below
        their high-water mark."""
        kv = self._kv
        grown, shrunk = kv._grown, kv._shrunk
        seen, last = (len(grown), len(shrunk)), self._tokens
        # int and float sizes mix freely: tokens * layers is the exact product rounded either way.
        if last is None or kv._log_epoch != self._epoch:
            self._epoch = kv._log_epoch
            grown, shrunk, mask = (), self._nodes, 0
        elif tokens == last:
            if seen == self._seen:
                return self._mask
            grown, shrunk, mask = grown[self._seen[0]:], shrunk[self._seen[1]:], self._mask
        elif tokens < last:
            grown, shrunk, mask = grown[self._seen[0]:], self._nodes, self._mask
        elif tokens > last:
            grown, shrunk, mask = self._nodes, shrunk[self._seen[1]:], self._mask
        else:   # not ordered (NaN)
            grown, shrunk, mask = (), self._nodes, 0
        self._tokens, self._seen = tokens, seen
        self._mask = mask = self._update(mask, grown, shrunk)
        return mask

    def _update(self, mask: int, grown: Iterable[str], shrunk: Iterable[str]) -> int:
        """``mask`` after re-testing the ``grown`` nodes it allows and the ``shrunk`` ones it
        does not (every node once, whatever the order: each test reads the current estimate)."""
        reserved, observed, limit = self._kv._reserved, self._kv._observed, self._kv._limit
        bit_layers, tokens = self._node_bit_layers, self._tokens
        for node in grown if mask else ():
            bl = bit_layers.get(node)
            if bl is not None and mask & bl[0]:
                r, o = reserved[node], observed[node]
                if not (o if o > r else r) + tokens * bl[1] <= limit[node]:   # = fits()
                    mask ^= bl[0]
        if mask == self._every:   # e.g. ample KV: nothing can open up
            return mask
        for node in shrunk:
            bl = bit_layers.get(node)
            if bl is not None and not mask & bl[0]:
                r, o = reserved[node], observed[node]
                if (o if o > r else r) + tokens * bl[1] <= limit[node]:   # = fits()
                    mask |= bl[0]
        return mask


class OutputLengthMean:
    """The output length the live coordinator reserves KV for: a running mean of the lengths
    served, seeded with ``seed_tokens`` (the workload's mean output) until requests finish.

    A request without ``max_tokens`` may run to the end of the context; reserving that much would
    let one request hold the KV of dozens and admission would collapse. So a request reserves
    ``min(max_tokens, mean)`` (section 5's "expected output length"), and one that outgrows its
    reservation is the workers' business: their paged KV takes blocks as it grows and preempts and
    recomputes the newest request when a pool runs short, and the stats poll corrects the
    estimate with the real block counts. The mean is cumulative over the first ``window`` lengths
    and exponentially weighted (1 / ``window``) after, so it follows a changing mix. Pure."""

    def __init__(self, seed_tokens: float = WorkloadSpec().mean_output_tokens, window: int = 256) -> None:
        if not seed_tokens > 0 or window < 1:
            raise ValueError(f"seed_tokens must be > 0 and window >= 1, got {seed_tokens}, {window}")
        self.mean = float(seed_tokens)
        self.window = window
        self.count = 1   # the seed counts as one observation

    def observe(self, output_tokens: int) -> None:
        """A request finished (stop or length) after ``output_tokens`` tokens."""
        self.count += 1
        self.mean += (output_tokens - self.mean) / min(self.count, self.window)

    def reservation(self, max_tokens: int) -> int:
        """Output tokens to reserve for a request allowed ``max_tokens`` (at least 1)."""
        return max(1, min(max_tokens, math.ceil(self.mean)))
