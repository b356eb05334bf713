"""The prediction's queueing model of one plan: its pipelines and nodes as arrays, and the map
whose fixed point (:mod:`planner.prediction.fixed_point`) is the plan's operating point.

Per stage a token rides a plain step, or one carrying another pipeline's prompt piece, and first
waits out the step in progress; its own pipeline's prompts hold it up as a convoy
(:func:`convoy_delay_s`), and so do other pipelines' prompts along the nodes it shares with them
(:meth:`Model.convoys_s`); links are FIFO queues (:meth:`Model.link_waits`). Requests in flight
per pipeline come from progressive filling (:meth:`Model.fill`). Derivation:
:mod:`helix.core.costmodel`, *Inside a pipeline*; the steps in order: :mod:`planner.prediction`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from helix.core.costmodel import CostModel
from helix.core.pipelines import enumerate_pipelines
from helix.core.plan import COORDINATOR, Plan
from helix.core.serving import UNCHUNKED_STEP_TOKENS
from helix.core.spec import ClusterSpec
from planner.prediction import fixed_point
from planner.prediction.fallback import scheduler_fallback
from planner.prediction.incidence import Incidence

#: A pipeline's decodes travel around it in about this many waves (see helix.core.costmodel: measured
#: in the simulator on single24, 2.1-2.5 on 10- and 12-stage T4 chains; an approximation).
DECODE_WAVES = 2.0

#: Spread of prompt lengths (coefficient of variation) for latency percentiles: the spec gives
#: means only, so prompts are taken as lognormal with the Azure conversation trace's CV (0.58,
#: filtered to <= 2048 tokens). A request's TTFT grows with its prompt, so the median over
#: requests sits well above the TTFT of a mean prompt when fast pipelines take most requests.
PROMPT_CV = 0.58


@dataclass(frozen=True)
class Evaluation:
    """The map's answer at one state (:meth:`Model.evaluate`), per path or per node."""

    requests_in_flight: np.ndarray
    """N per path, from ``in_flight_of(stay)``."""
    rate: np.ndarray
    """Requests/s per path: N / stay."""
    round_trip_s: np.ndarray
    """R per path: one decode token around the pipeline."""
    first_token_s: np.ndarray
    """F per path: the prompt through the pipeline until the first token is back."""
    first_token_fixed_s: np.ndarray
    """F0 per path: F less the part that grows with the prompt's length."""
    batch: np.ndarray
    """Decode batch per node: decode tokens/s through it / steps per s."""
    step_s: np.ndarray
    """Mean step per node (plain and prompt-carrying steps mixed)."""


class Model:
    """The arrays of one plan: pipelines x nodes incidence, per-node figures, per-path links."""

    def __init__(self, spec: ClusterSpec, plan: Plan, cost: CostModel, strict: bool = False):
        self.cost = cost
        self.strict = strict
        w = cost.workload
        self.p, self.o = w.mean_prompt_tokens, w.mean_output_tokens
        flow_paths = enumerate_pipelines(plan)
        placed = {q.node: q for q in plan.placements if q.num_layers > 0}
        L = plan.num_layers
        kv = {n: cost.resident_requests(spec.node(n), q.num_layers, q.start == 0, q.end == L)
              for n, q in placed.items()}
        # Where the scheduler goes when the flow paths' nodes are full (share 0): it falls back
        # to any usable hop, so these fill what the flow paths leave.
        fallback = scheduler_fallback(plan, flow_paths, kv) if flow_paths else ()
        self.paths = flow_paths + tuple(q for q, _ in fallback)
        self.fallback_weight = np.array([0.0] * len(flow_paths) + [n for _, n in fallback])
        used = sorted({s.node for q in self.paths for s in q.stages})
        self.nodes = used
        self.spec_nodes = [spec.node(n) for n in used]
        self.layers = np.array([placed[n].num_layers for n in used], float)
        self.kv_requests = np.array([kv[n] for n in used])
        self.compute_tokens_per_s = np.array(
            [cost.throughput_tokens_per_s(spec.node(n), placed[n].num_layers) for n in used], float)
        index = {n: i for i, n in enumerate(used)}
        self.incidence = Incidence.of(
            {(i, index[s.node]) for i, q in enumerate(self.paths) for s in q.stages},
            (len(self.paths), len(used)))
        self._node_pairs = _node_pairs(self.incidence)
        self.max_prompt = float(cost.model.max_position_embeddings)
        self.share = np.array([q.share for q in self.paths])
        hidden = cost.model.activation_bytes_per_token(cost.dtype_bytes)
        token = 2 if cost.model.vocab_size <= 2 ** 16 else 4
        # Per path: link latencies, and seconds per token carried over all its hops; per link
        # (a FIFO, as in the simulator): seconds per token, and which paths use it.
        self.link_latency = np.zeros(len(self.paths))
        self.link_s_per_token = np.zeros(len(self.paths))
        links: dict[tuple[str, str], int] = {}
        params: dict = {}
        uses: list[tuple[int, int]] = []
        per_token_s: list[float] = []
        # Per link, its boundary: the links from one region to another into the same layer (a
        # stage boundary; :meth:`link_waits` splits the boundary's prompts among them).
        boundaries: dict[tuple[str, str, int], int] = {}
        boundary: list[int] = []
        for i, q in enumerate(self.paths):
            hops = [COORDINATOR, *q.nodes, COORDINATOR]
            into = [s.start for s in q.stages] + [L]
            for (a, b), layer in zip(itertools.pairwise(hops), into):
                per_token = token if COORDINATOR in (a, b) else hidden
                if (a, b) not in links:   # each hop's link looked up once (paths share hops)
                    links[(a, b)] = len(per_token_s)
                    params[(a, b)] = spec.link(a, b)
                    per_token_s.append(per_token / params[(a, b)].bandwidth_bytes_per_s)
                    key = (spec.region_of(a), spec.region_of(b), layer)
                    boundary.append(boundaries.setdefault(key, len(boundaries)))
                link = params[(a, b)]
                uses.append((i, links[(a, b)]))
                self.link_latency[i] += link.latency_s
                self.link_s_per_token[i] += per_token / link.bandwidth_bytes_per_s
        self.link_incidence = Incidence.of(set(uses), (len(self.paths), len(per_token_s)))
        self.link_token_s = np.array(per_token_s)
        self.slowest_link_s_per_token = self.link_incidence.row_max(self.link_token_s)
        self.link_boundary = np.array(boundary, dtype=np.intp)
        self.iterations: list[int] = []   # map evaluations per solve (offline, online)
        budget = cost.serving.chunk_tokens   # a step's tokens; 0: whole prompts
        # A step never holds more decodes than its token budget: with chunking off the step
        # policy holds them to the unchunked one (a whole prompt may exceed it, so no more steps
        # are counted for prompts then).
        self.max_batch = min(cost.serving.max_batch_seqs, budget or UNCHUNKED_STEP_TOKENS)

    def link_waits(self, rate: np.ndarray, batch: float) -> np.ndarray:
        """Per path: the time its messages wait on busy links. A link sends one message at a
        time; per request it carries the prompt once (p tokens) and o - 1 decode messages of
        about ``batch`` tokens; a message arriving at a random time waits the residual of the one
        being sent, u x E[s^2] / (2 E[s]) — prompts dominate on slow links.

        Pollaczek-Khinchine (M/G/1) takes the prompts to reach a link as a Poisson stream. They
        do not: the scheduler deals the requests crossing a stage boundary to its node pairs in
        (weighted) round robin, so a link that carries 1/k of its boundary's prompts gets every
        k-th of them, and every k-th event of a Poisson stream comes at Erlang-k intervals
        (squared CV c_a^2 = 1/k). The wait of a GI/G/1 queue is the M/G/1 wait scaled by
        (c_a^2 + c_s^2) / (1 + c_s^2) (Allen-Cunneen; Kingman's heavy-traffic form), c_s^2 the
        prompts' (:data:`PROMPT_CV`). Measured in the simulator on geo24 (600 s offline at a
        256-token budget, decode messages' mean wait at the slow boundaries of three-region
        chains; BENCHMARKS.md, *Plan vs simulator*): 0.26 / 0.05 s on a 4-pair /
        8-pair boundary, which M/G/1 put at 0.46 / 0.15 s and this at 0.20 / 0.05 s; over 25
        geo24 placements (5 more saturate a link and collapse; no model here caps a link) the
        decode prediction's error went from -21..-4 % to -13..+11 %."""
        p, o = self.p, self.o
        requests = self.link_incidence.T @ rate                      # requests/s per link
        busy = np.minimum(0.95, requests * (p + o) * self.link_token_s)
        s_prompt, s_decode = p * self.link_token_s, batch * self.link_token_s
        weight_prompt = p / (p + o)    # share of the link's busy time spent on prompts
        residual = weight_prompt * s_prompt / 2 + (1 - weight_prompt) * s_decode / 2
        crossing = np.bincount(self.link_boundary, weights=requests)[self.link_boundary]
        arrivals_cv2 = np.divide(requests, crossing, out=np.ones_like(requests),
                                 where=crossing > 0)                   # 1 / k
        service_cv2 = PROMPT_CV ** 2
        scale = (arrivals_cv2 + service_cv2) / (1.0 + service_cv2)
        # Pollaczek-Khinchine: a FIFO at utilization u makes a message wait u E[s^2] / (2 E[s] (1 - u)).
        return self.link_incidence @ (scale * busy * residual / (1.0 - busy))

    def step_times(self, batch: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per node at its decode batch: (plain step, step carrying a prompt piece, share of steps
        that carry one, prompt pieces per prompt) (:meth:`CostModel.stage_step_parts`; chunked
        prefill: a piece is the step's token budget less its decodes, so a prompt of p tokens
        takes p / piece steps: fractional, the last piece is a short one)."""
        cost, p = self.cost, self.p
        parts = np.array([cost.stage_step_parts(n, int(k), d)
                          for n, k, d in zip(self.spec_nodes, self.layers, batch)])
        piece = np.array([cost.prompt_piece_tokens(d) for d in batch])
        return parts[:, 0], parts[:, 1], parts[:, 2], p / piece

    def per_path(self, node_values: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
        """Per path, the sum over its stages of ``node_values`` (times ``own[entry]`` per
        (path, node) entry when given)."""
        A = self.incidence
        w = node_values[A.cols] if own is None else node_values[A.cols] * own
        return np.bincount(A.rows, weights=w, minlength=A.shape[0])

    def evaluate(self, batch: np.ndarray, steps: np.ndarray, rate: np.ndarray,
                 in_flight_of) -> Evaluation:
        """The map at (decode ``batch`` and ``steps`` per s per node, request ``rate`` per path);
        ``in_flight_of(stay_s)`` gives requests per pipeline (:meth:`fill` at saturation).

        Per stage a token rides a plain step, or one carrying another pipeline's prompt piece,
        and first waits out the step in progress; its own pipeline's prompts hold it up as a
        convoy (:func:`convoy_delay_s`). Derivation: :mod:`helix.core.costmodel`, *Inside a pipeline*."""
        o, p, A = self.o, self.p, self.incidence
        budget = self.cost.serving.chunk_tokens   # a step's tokens; 0: whole prompts
        base, full, share, pieces = self.step_times(batch)
        step = base + share * (full - base)
        # Per (path, node) entry: the fraction of the node's prompts that are not the path's
        # own (those ride with the path's decodes as a convoy instead).
        through = A.T @ rate
        others = 1.0 - np.divide(rate[A.rows], through[A.cols], out=np.zeros(len(A.rows)),
                                 where=through[A.cols] > 0)
        plain_wait = steps * (1 - share) * base ** 2 / 2   # another wave's step in progress
        piece_wait = steps * share * full ** 2 / 2          # a prompt piece's step
        # A prompt's step at a node is longer than the step a decode of path i rides there on
        # average (a plain one, or one carrying another pipeline's piece: ``others`` of the
        # node's pieces) by (1 - others x share) x (full - base): that excess, per (path, node)
        # entry, makes the convoys (convoys_s). A decode's wait for another pipeline's piece
        # step in progress splits in two: the excess's residual, the head of the convoy (for
        # one node, steps x share x excess^2 / 2), and the rest.
        excess = (1.0 - others * share[A.cols]) * (full - base)[A.cols]
        piece_wait_plain = (steps * share * full ** 2)[A.cols] / 2 \
            - steps[A.cols] * share[A.cols] * excess ** 2 / 2
        waits = self.link_waits(rate, float(batch.mean()))
        links = self.link_latency + waits
        lag = self.per_path(full - base)                    # a prompt piece's longer steps
        stages_paced = A.row_max((pieces - 1) * full)       # the later pieces, by the stages
        room = self.cost.prompt_room_tokens(float(batch.mean()))
        fixed = links + self.link_s_per_token * batch.min() \
            + self.convoys_s(excess, stages_paced, rate, room)

        def round_trip(ride: np.ndarray) -> np.ndarray:   # R with decodes riding ``ride`` decodes a step
            r_base, r_full, r_share, _ = self.step_times(ride)
            others_pieces = ((r_share * (r_full - r_base))[A.cols] + piece_wait_plain) * others
            return self.per_path(r_base + plain_wait) + np.bincount(
                A.rows, weights=others_pieces, minlength=A.shape[0]) + fixed
        R = round_trip(batch)
        # The prompt: its pieces' steps at every stage (the first waits out the step in
        # progress), and over every link, the first piece's bytes; the pieces after the
        # first are paced by the slowest stage or link (a link forwards a piece while the
        # stage before it runs the next: on a 100 Mb/s link a 256-token piece takes 0.33 s,
        # longer than any step, so there the link paces the prompt).
        split = A.row_max(pieces)                       # pieces per prompt on the path
        piece_s = self.slowest_link_s_per_token * p / split
        paced = np.maximum(stages_paced, (split - 1) * piece_s)
        F0 = self.per_path(base + plain_wait + piece_wait) + links
        F = F0 + lag + paced + self.link_s_per_token * p / split
        stay = F + (o - 1.0) * R
        N = in_flight_of(stay)
        # A decode rides the step of its wave, not the node's mean step: where the step budget
        # cuts more steps than waves (prompt pieces between them), the mean batch counts steps
        # that hold few of the decodes, and a token sees the size-biased one.
        ride = self.wave_decodes(N, rate, batch)
        if np.any(ride > batch):
            R = round_trip(ride)
            stay = F + (o - 1.0) * R
            N = in_flight_of(stay)
        new_rate = N / stay                           # requests/s per pipeline
        decode_rate = A.T @ (new_rate * o)            # decode tokens/s per node
        # Steps/s: one per wave of each pipeline through the node, or more where the waves
        # carry more tokens (decodes and prompt pieces) than the step budget holds: the step
        # policy cuts such a wave into several steps. Never more than back to back (then each
        # step takes what arrived during the previous one).
        waves = A.T @ (np.minimum(DECODE_WAVES, N) / R)
        if budget > 0:
            waves = np.maximum(waves, A.T @ (new_rate * (o + p)) / budget)
        new_steps = np.minimum(waves, 1.0 / step)
        new = np.clip(np.divide(decode_rate, new_steps, out=np.ones_like(new_steps),
                                where=new_steps > 0), 1.0, self.max_batch)
        return Evaluation(N, new_rate, R, F, F0, new, step)

    def convoys_s(self, excess_s: np.ndarray, paced_s: np.ndarray, rate: np.ndarray,
                  room_tokens: float) -> np.ndarray:
        """Per path: the delay per round trip that prompts cause its decodes as convoys, its own
        pipeline's and the other pipelines' along the nodes they share.

        ``excess_s``, per entry (i, v) of the incidence: how much longer a prompt's step at node v
        is than the step a decode of path i rides there on average. A wave of i that reaches a
        node shared with pipeline j while j's prompt step runs there waits it out, and then
        reaches the next node they share while the prompt's step runs there too (the prompt left
        just as the wave's own short step began): it follows the prompt over ``Delta_ij``, the excess summed over the nodes both use (the own pipeline:
        all its nodes, and the pieces after the first paced by its slowest stage, ``paced_s``).
        One stream of prompts at lambda gives :func:`convoy_delay_s`. Many streams at once: a
        wave is held by the latest prompt of each, and the delays do not add where the convoys
        overlap; the streams are replaced by one with the same first two moments of lambda x
        Delta (``S1 = sum_j lambda_j E[Delta_ij]``, ``S2 = sum_j lambda_j E[Delta_ij^2]``:
        rate ``S1^2 / S2``, excess ``S2 / S1``), exact for one stream and ``S2 / 2`` (the sum of
        the streams' own ``lambda Delta^2 / 2``) while they are rare. A prompt's excess grows with
        its first piece, ``min(L, room)`` tokens, and its pacing with its pieces after the first:
        the moments are taken over the prompts' lengths (:func:`prompt_piece_moments`).

        ``sum_j lambda_j Delta_ij^2`` is a quadratic form: over the node pairs (v, w) of path i,
        ``excess_v excess_w Lambda_vw`` with ``Lambda_vw`` the prompts/s through both v and w
        (paths x their stages squared terms, not pairs of paths).

        Measured on single24 (one plan, 400 s offline, its steady state): at a 2,048-token budget
        a decode waits 52-81 ms at an L4 or T4 stage, twice the residual of a step in progress
        at a random instant (31-36 ms), and the waits grow along the A100 chain every pipeline
        shares (4 ms at its first stage, 14 at its fourth); at 512 they stay at or below it."""
        first, second, pair, path = self._node_pairs
        A = self.incidence
        both = np.bincount(pair, weights=rate[path])          # Lambda per node pair
        quad = np.bincount(path, weights=excess_s[first] * excess_s[second] * both[pair],
                           minlength=len(self.paths))
        through = A.T @ rate
        lag = np.bincount(A.rows, weights=excess_s, minlength=A.shape[0])
        others = np.bincount(A.rows, weights=excess_s * through[A.cols], minlength=A.shape[0])
        f1, f2, g1, g2, fg = prompt_piece_moments(self.p, room_tokens, self.max_prompt)
        s1 = f1 * np.maximum(others - rate * lag, 0.0)
        s2 = f2 * np.maximum(quad - rate * lag ** 2, 0.0)
        s1 = s1 + rate * (lag * f1 + paced_s * g1)
        s2 = s2 + rate * (lag ** 2 * f2 + 2 * lag * paced_s * fg + paced_s ** 2 * g2)
        excess = np.divide(s2, s1, out=np.zeros_like(s1), where=s1 > 0)
        return convoy_delay_s(excess, np.divide(s1 ** 2, s2, out=np.zeros_like(s1), where=s2 > 0))

    def wave_decodes(self, N: np.ndarray, rate: np.ndarray, batch: np.ndarray) -> np.ndarray:
        """Per node, the decodes in the step a decode token rides: its pipeline's wave, ``N /
        min(W, N)`` (:data:`DECODE_WAVES`), averaged over the pipelines through the node by their
        decode rates (``rate``); at least the mean ``batch`` (a token's step holds at least the
        mean: it is size-biased) and at most :attr:`max_batch`."""
        A = self.incidence
        wave = N / np.maximum(np.minimum(DECODE_WAVES, N), 1.0)
        weight = A.T @ rate
        ride = np.divide(A.T @ (rate * wave), weight, out=batch.copy(), where=weight > 0)
        return np.clip(ride, batch, self.max_batch)

    def steps_per_s(self, batch: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """Steps per s per node that carry the decodes of ``rate`` in batches of ``batch``."""
        return np.divide(self.incidence.T @ (rate * self.o), batch)

    def solve(self, in_flight_of) -> tuple[np.ndarray, ...]:
        """Iterate to the fixed point (:func:`planner.prediction.fixed_point.iterate`):
        (N, rate, R, F, F0 per path; batch, busy fraction per node)."""
        return fixed_point.iterate(self, in_flight_of)

    def fill(self, stay: np.ndarray) -> np.ndarray:
        """Requests in flight per pipeline at saturation (progressive filling, see the module):
        the max-flow paths first, in proportion to their shares; then, where their nodes are
        full, the fallback paths (share 0), in proportion to the requests the scheduler's rule
        sends each (:func:`~planner.prediction.fallback.scheduler_fallback`)."""
        A, n = self.incidence, len(self.paths)
        caps = [(A.T, self.kv_requests)]
        tokens = A.T.scale_columns((self.p + self.o) / stay)   # tokens/s per node per request
        caps.append((tokens, self.compute_tokens_per_s))
        N = np.zeros(n)
        primary = self.share > 0
        N = self._grow(N, np.where(primary, self.share * stay, 0.0), caps)
        if (~primary).any():
            N = self._grow(N, np.where(primary, 0.0, self.fallback_weight), caps)
        return N

    def _grow(self, N: np.ndarray, grow: np.ndarray, caps) -> np.ndarray:
        """Raise ``N`` along ``grow`` until every growing path meets a full node. Event by event:
        each round the first node to fill stops the paths through it, and what every node uses
        rises by the round's length x its rise (both caps in one array, not recomputed)."""
        coefs = [c for c, _ in caps]
        cap = np.stack([c for _, c in caps])                          # [caps, nodes]
        limit = cap * (1 - 1e-9)
        used = np.stack([c @ N for c in coefs])
        full = (used >= limit).any(axis=0)
        live = (grow > 0) & ~coefs[0].columns_in(full)   # paths through full nodes do not start
        for _ in range(2 * len(self.nodes) + 1):
            if not live.any():
                break
            rise = np.stack([c @ np.where(live, grow, 0.0) for c in coefs])
            ok = rise > 0
            if not ok.any():
                break
            step = float(np.min(np.maximum(cap[ok] - used[ok], 0) / rise[ok]))
            N = N + np.where(live, grow * step, 0.0)
            used = used + step * rise
            now = (used >= limit).any(axis=0)
            if (now & ~full).any():
                live &= ~coefs[0].columns_in(now & ~full)
            full = now
        return N



def _node_pairs(incidence: Incidence) -> tuple[np.ndarray, ...]:
    """Every ordered pair of nodes (v, w) of each path, v = w included, as arrays (the entries
    of ``incidence`` of (path, v) and of (path, w), the index of (v, w) among the distinct node
    pairs, the path): what :meth:`Model.convoys_s` sums over. Paths x their stages squared."""
    rows, cols = incidence.rows, incidence.cols   # sorted by path (Incidence.of)
    counts = np.bincount(rows, minlength=incidence.shape[0])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    path = np.repeat(np.arange(len(counts)), counts ** 2)
    # Within path i's block of counts_i^2 entries, entry k pairs stage k // c with stage k % c.
    offset = np.arange(len(path)) - np.repeat(np.cumsum(counts ** 2) - counts ** 2, counts ** 2)
    c = counts[path]
    first = starts[path] + offset // np.maximum(c, 1)
    second = starts[path] + offset % np.maximum(c, 1)
    _, pair = np.unique(cols[first] * incidence.shape[1] + cols[second], return_inverse=True)
    return first, second, pair.ravel(), path


#: Points of the quadrature over prompt lengths (:func:`prompt_piece_moments`): equal-probability
#: quantiles of the standard normal.
LENGTH_POINTS = 128
_NORMAL_QUANTILES = np.array([NormalDist().inv_cdf((k + 0.5) / LENGTH_POINTS)
                              for k in range(LENGTH_POINTS)])


def prompt_piece_moments(mean_prompt: float, room_tokens: float, max_prompt: float
                         ) -> tuple[float, ...]:
    """Moments of a prompt's first piece and of its later pieces over the prompts' lengths, each
    relative to the mean prompt's: ``(E[f], E[f^2], E[g], E[g^2], E[f g])`` with ``f =
    min(L, room) / min(p, room)`` and ``g = max(L / room - 1, 0) / (p / room - 1)`` (0 where the
    mean prompt is one piece). L is lognormal with mean p and CV :data:`PROMPT_CV`, at most
    ``max_prompt`` (the context), by quadrature at :data:`LENGTH_POINTS` equal-probability
    points. With no step budget (``room`` infinite) and no cap, ``E[f^2] = 1 + CV^2``."""
    sigma = math.sqrt(math.log(1.0 + PROMPT_CV ** 2))
    x = np.exp(sigma * _NORMAL_QUANTILES - sigma ** 2 / 2)
    lengths = np.minimum(mean_prompt * x / x.mean(), max_prompt)
    f = np.minimum(lengths, room_tokens) / min(mean_prompt, room_tokens)
    later = mean_prompt / room_tokens - 1.0
    g = np.maximum(lengths / room_tokens - 1.0, 0.0) / later if later > 1e-9 else np.zeros_like(f)
    return (float(f.mean()), float((f * f).mean()), float(g.mean()), float((g * g).mean()),
            float((f * g).mean()))


def convoy_delay_s(excess_s: np.ndarray, prompts_per_s: np.ndarray) -> np.ndarray:
    """Mean delay per round trip that one stream of prompts causes the decodes behind them (a
    convoy): a pipeline's own, or the streams of :meth:`Model.convoys_s` taken as one.

    A prompt crosses the stages in long steps: it exits the pipeline ``excess_s`` (Delta) later
    than a decode wave entering with it would. A wave that enters a age ``a`` after it catches up
    and then follows it stage by stage, so it exits ``max(0, Delta - a)`` late (at each stage the
    wave waits for the step in progress, which the prompt keeps long at every stage it crosses).
    Only the latest prompt matters (the earlier ones are further ahead). With prompts arriving
    Poisson at ``lambda``, a ~ Exp(lambda): E[max(0, Delta - a)] = Delta - (1 - e^(-lambda Delta))
    / lambda (lambda Delta^2 / 2 when prompts are rare; Delta - 1 / lambda when they overlap)."""
    lam, delta = np.asarray(prompts_per_s, float), np.asarray(excess_s, float)
    x = lam * delta
    # Delta - (1 - e^-x) / lambda = Delta (1 - (1 - e^-x) / x); -expm1 keeps small x exact.
    ratio = np.divide(-np.expm1(-x), x, out=np.ones_like(x), where=x > 1e-12)
    return delta * (1.0 - ratio)

