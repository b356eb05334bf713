"""What a plan delivers to users: throughput at saturation and latencies at 75 % of it, analytically.

The cost model's T(k) is what a node delivers when every request its KV holds is in every step
(:mod:`helix.costmodel`). Inside a pipeline of S stages that is not so; this module predicts from
the plan's pipelines (:func:`helix.pipelines.enumerate_pipelines`) what the simulator and the live
system measure. The derivation (operating points per node, round trips per pipeline, Little's law)
is in :mod:`helix.costmodel`'s docstring, section *Inside a pipeline*; this module computes it:

1. start with one decode per step everywhere;
2. step times of every node at its batch (:meth:`CostModel.stage_step_parts`: a plain step and
   one carrying a prompt piece, chunked by the step budget), the wait behind the step in
   progress, the convoy of the pipeline's own prompts (:func:`convoy_delay_s`: a decode wave
   behind a prompt waits at every stage it crosses) and the wait behind the messages a link is
   sending (links are FIFO queues, M/G/1: :meth:`_Model.link_waits`); round trip R and
   first-token time F of every pipeline (a prompt's pieces after the first paced by its slowest
   stage or link); a request's stay ``T = F + (o - 1) R``;
3. requests in flight per pipeline by progressive filling: every max-flow pipeline grows in
   proportion to its share of requests times its stay (the scheduler sends it that share of the
   arrivals), until a node's KV (high-water mark) or its compute (T(k)) is full; the pipelines
   through that node stop growing, the others go on. Then the paths over the placement's other
   usable hops (share 0) grow into what is
   left: the coordinator's scheduler falls back to them when the flow paths' nodes are full, and
   the baselines' schedulers use every usable hop (:func:`scheduler_fallback` plays its rule in
   bulk to find them and how many requests each takes);
4. per node the decode batch = decode tokens/s through it / steps per s (each pipeline's decodes
   travel in :data:`DECODE_WAVES` waves, or fewer when it holds fewer requests, one step per wave
   per round trip, more where the waves carry more tokens than the step budget holds (the step
   policy cuts them), but never more steps than back to back); back to 2 until the batches and
   the rates settle (:class:`_Mixer`: both damped, Anderson-accelerated, and why that converges
   where damping the batches alone cycled; at most 84 evaluations measured, :data:`MAX_ITERATIONS`
   a safeguard).

Offline: saturation (the KV fills). Online: requests at ``load`` x the predicted request rate,
Poisson; the max-flow pipelines take theirs first, the fallback paths the rest
(:func:`online_rates`); TTFT and time per output token
p50 are the medians over requests of F (its prompt part scaled by the request's prompt length,
:data:`PROMPT_CV`) and of R.

Pure and fast (milliseconds to a second for 40 nodes): no simulation, numbers only.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from helix.costmodel import CostModel
from helix.pipelines import PlanPipeline, enumerate_pipelines, hop_usable
from helix.plan import COORDINATOR, Plan, Prediction
from helix.serving import (
    CHECKED_STEP_BUDGETS,
    DEFAULT_STEP_TOKENS,
    UNCHUNKED_STEP_TOKENS,
)
from helix.slices import LayerSlice, as_placement
from helix.spec import ClusterSpec

log = logging.getLogger("helix.prediction")

#: A pipeline's decodes travel around it in about this many waves (see helix.costmodel: measured
#: in the simulator on single24, 2.1-2.5 on 10- and 12-stage T4 chains; an approximation).
DECODE_WAVES = 2.0

#: Fraction of the predicted saturated request rate at which latencies are predicted.
ONLINE_LOAD = 0.75

#: Evaluations of the fixed-point map at most: a safeguard (every plan measured converges within
#: 84: the shipped clusters and generated ones of 60-1,000 nodes, every heuristic placement
#: and routing; :class:`_Mixer`). ``_Model.iterations`` records how many each solve took.
MAX_ITERATIONS = 200


class NoFixedPoint(ArithmeticError):
    """The fixed point was not reached within :data:`MAX_ITERATIONS` (``predict(...,
    strict=True)``): the answer would be whichever state the last evaluation hit. Seen on chains
    whose traffic crosses a slow region link through one or two node pairs, loaded near its cap,
    which the simulator shows collapsing (BENCHMARKS.md, *Plan vs simulator*)."""

#: The fixed point is reached when no node's decode batch moves by more than this (relative)
#: and no path's request rate by more than this times the largest path's rate.
TOLERANCE = 1e-3

#: Spread of prompt lengths (coefficient of variation) for latency percentiles: the spec gives
#: means only, so prompts are taken as lognormal with the Azure conversation trace's CV (0.58,
#: filtered to <= 2048 tokens). A request's TTFT grows with its prompt, so the median over
#: requests sits well above the TTFT of a mean prompt when fast pipelines take most requests.
PROMPT_CV = 0.58

def unchecked_budget_note(chunk_tokens: int) -> str | None:
    """One line for a plan whose step budget lies outside :data:`CHECKED_STEP_BUDGETS` (None
    inside them)."""
    if chunk_tokens in CHECKED_STEP_BUDGETS:
        return None
    at = "with chunking off" if chunk_tokens == 0 else f"at a step budget of {chunk_tokens:,}"
    return (f"{at} this prediction is unchecked: it holds within 15 % of `helix simulate` at "
            f"{' and '.join(map(str, CHECKED_STEP_BUDGETS))} tokens, and has erred by up to 41 % "
            f"at 1,024-2,048 and with chunking off (BENCHMARKS.md); check the plan with "
            f"`helix simulate` or plan at the default ({DEFAULT_STEP_TOKENS})")


@dataclass(frozen=True)
class PipelineState:
    """One pipeline at the model's fixed point (offline)."""

    pipeline: PlanPipeline
    requests_in_flight: float
    requests_per_s: float
    round_trip_s: float
    """Decode round trip R: one token through every stage, the links and the coordinator."""
    first_token_s: float
    """F: the prompt through every stage (plus the links), until the first token is back."""


@dataclass(frozen=True)
class Incidence:
    """A sparse matrix as its nonzero entries (each (row, col) once): a path meets a few of a
    large cluster's nodes, and the dense paths x nodes arrays (thousands x 1,000 at 1,000 nodes,
    multiplied up to 2N+1 times per filling) took minutes. Products by bincount, no scipy."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    shape: tuple[int, int]

    @staticmethod
    def of(entries: set[tuple[int, int]], shape: tuple[int, int]) -> "Incidence":
        """Ones at ``entries``, in sorted order (so sums come out the same every run)."""
        ordered = sorted(entries)
        return Incidence(np.array([i for i, _ in ordered], dtype=np.intp),
                         np.array([j for _, j in ordered], dtype=np.intp),
                         np.ones(len(ordered)), shape)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        return np.bincount(self.rows, weights=self.vals * np.asarray(x, float)[self.cols],
                           minlength=self.shape[0])

    @property
    def T(self) -> "Incidence":
        return Incidence(self.cols, self.rows, self.vals, (self.shape[1], self.shape[0]))

    def scale_columns(self, v: np.ndarray) -> "Incidence":
        """The matrix times ``v`` column-wise (``dense * v`` with ``v`` broadcast along rows)."""
        return Incidence(self.rows, self.cols, self.vals * v[self.cols], self.shape)

    def columns_in(self, row_mask: np.ndarray) -> np.ndarray:
        """Columns with a positive entry in some row of ``row_mask``."""
        out = np.zeros(self.shape[1], dtype=bool)
        out[self.cols[row_mask[self.rows] & (self.vals > 0)]] = True
        return out

    def row_max(self, v: np.ndarray) -> np.ndarray:
        """Per row, max(0, max of entry x v[col]): ``np.max(dense * v, axis=1)`` for ``v >= 0``."""
        out = np.zeros(self.shape[0])
        np.maximum.at(out, self.rows, self.vals * v[self.cols])
        return out


class _Model:
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
            for (a, b), layer in zip(zip(hops, hops[1:]), into):
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

    def solve(self, in_flight_of) -> tuple[np.ndarray, ...]:
        """Iterate to the fixed point; ``in_flight_of(stay_s)`` gives requests per pipeline.

        Per stage a token rides a plain step, or one carrying another pipeline's prompt piece,
        and first waits out the step in progress; its own pipeline's prompts hold it up as a
        convoy (:func:`convoy_delay_s`). Derivation: :mod:`helix.costmodel`, *Inside a pipeline*."""
        o, p, A = self.o, self.p, self.incidence
        batch = np.ones(len(self.nodes))
        steps = np.zeros(len(self.nodes))
        rate = np.zeros(len(self.paths))
        budget = self.cost.serving.chunk_tokens   # a step's tokens; 0: whole prompts
        # A step never holds more decodes than its token budget: with chunking off the step
        # policy holds them to the unchunked one (a whole prompt may exceed it, so no more steps
        # are counted for prompts then).
        max_batch = min(self.cost.serving.max_batch_seqs, budget or UNCHUNKED_STEP_TOKENS)
        mixer = _Mixer(max_batch)
        for _ in range(MAX_ITERATIONS):
            base, full, share, pieces = self.step_times(batch)
            step = base + share * (full - base)
            # Per (path, node) entry: the fraction of the node's prompts that are not the path's
            # own (those ride with the path's decodes as a convoy instead).
            through = A.T @ rate
            others = 1.0 - np.divide(rate[A.rows], through[A.cols], out=np.zeros(len(A.rows)),
                                     where=through[A.cols] > 0)
            plain_wait = steps * (1 - share) * base ** 2 / 2   # another wave's step in progress
            piece_wait = steps * share * full ** 2 / 2          # a prompt piece's step
            visit = self.per_path(base + plain_wait) + self.per_path(
                share * (full - base) + piece_wait, others)
            waits = self.link_waits(rate, float(batch.mean()))
            links = self.link_latency + waits
            lag = self.per_path(full - base)                    # a prompt piece's longer steps
            stages_paced = A.row_max((pieces - 1) * full)       # the later pieces, by the stages
            excess = lag + stages_paced
            R = visit + links + self.link_s_per_token * batch.min() + convoy_delay_s(excess, rate)
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
            new_rate = N / stay                           # requests/s per pipeline
            decode_rate = A.T @ (new_rate * o)            # decode tokens/s per node
            # Steps/s: one per wave of each pipeline through the node, or more where the waves
            # carry more tokens (decodes and prompt pieces) than the step budget holds: the step
            # policy cuts such a wave into several steps. Never more than back to back (then each
            # step takes what arrived during the previous one).
            waves = A.T @ (np.minimum(DECODE_WAVES, N) / R)
            if budget > 0:
                waves = np.maximum(waves, A.T @ (new_rate * (o + p)) / budget)
            steps = np.minimum(waves, 1.0 / step)
            new = np.clip(np.divide(decode_rate, steps, out=np.ones_like(steps), where=steps > 0),
                          1.0, max_batch)
            # The next state mixes (batch, rate) as a whole (_Mixer: why, and why it converges).
            done, batch, rate = mixer.next(batch, rate, new, new_rate)
            steps = np.divide(A.T @ (rate * o), batch)
            if done:
                break
        else:
            if self.strict:
                raise NoFixedPoint(f"no fixed point within {MAX_ITERATIONS} evaluations")
            log.warning("prediction: no fixed point within %d evaluations (the last state is "
                        "used)", MAX_ITERATIONS)
        self.iterations.append(mixer.iterations)
        return N, rate, R, F, F0, batch, steps * step

    def fill(self, stay: np.ndarray) -> np.ndarray:
        """Requests in flight per pipeline at saturation (progressive filling, see the module):
        the max-flow paths first, in proportion to their shares; then, where their nodes are
        full, the fallback paths (share 0), in proportion to the requests the scheduler's rule
        sends each (:func:`scheduler_fallback`)."""
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


class _Mixer:
    """The next state of :meth:`_Model.solve`'s fixed point: (decode batch per node, request
    rate per path) -> the map's answer at it, mixed (damped Anderson acceleration).

    *Why the state is (batch, rate), both mixed.* The map reads the previous rates (the links'
    queueing waits, the other pipelines' prompts at shared nodes, the steps per s). With only the
    batches damped and the rates taken as they came, large clusters (the scale benchmark's
    300-1,000 nodes) ran into a period-2 cycle: a rate overshoot loads a 100 Mb/s link to its
    0.95 cap, its M/G/1 wait jumps ~15x (8.4 s against 0.6 on a path of a 300-node plan), the
    stays lengthen, the rates collapse, the link empties, the rates overshoot again. A third of
    the nodes swung between two batches until the 60 allowed iterations ran out, and the
    prediction was whichever phase the last one hit (17,422 tokens/s at 60 iterations, 38,001 at
    61; the fixed point is 27,442). The cycle is a large swing, not a property of the fixed
    point: there no link is past 0.8 and the waits move gently with the rates. Moving the whole
    state half way to the map's answer (``x + MIXING (g(x) - x)``, a Krasnoselskii-Mann step)
    keeps the rates from jumping to the far side, so the links never reach their cap: on every
    plan measured (the shipped clusters, the scale benchmark's routings at 300 and 1,000 nodes)
    the damped iteration converges, and it has the same fixed points as the map (the old code's
    answers where it converged are unchanged to 0.05 %, the tolerance).

    *Why per coordinate.* Some fixed points do sit on a steep slope: on a 1,000-node plan a
    fallback path crosses a link loaded near 0.9 at the fixed point, and a node's batch moving by
    8 % moves that path's stay 3x (2,048 s against 592). A step of ``a x residual`` along a map
    of slope g' < 0 has slope ``1 - a (1 - g')``, inside (-1, 1) only for ``a < 2 / (1 - g')``;
    at 0.5 such a node cycled between two batches (slope -3 exactly, the cycle's signature).
    So a coordinate whose residual changes sign twice running has its mixing halved (down to
    :data:`MIXING_MIN`, enough for slopes down to -127) and one that does not regains it slowly.

    *Why Anderson on top.* A node that steps back to back near its compute limit has batch D =
    decode rate x step(D), a self-loop of slope just under 1 (0.99 measured), along which the
    damped iteration creeps (129 evaluations on one 300-node plan). Anderson mixing (the next
    state is the affine combination of the last :data:`ANDERSON_DEPTH` states whose residuals
    cancel best, by least squares) takes the secant along such directions (at most 84
    evaluations measured). It converges locally wherever the damped map is a local contraction,
    at least as fast to first order (Toth and Kelley, SIAM J. Numer. Anal. 53(2), 2015). It
    extrapolates only near a fixed point (residual below :data:`ANDERSON_FROM`) and by at most
    :data:`ANDERSON_REACH` per coordinate, because the map can have more than one: a congested
    one with batches at ``max_batch_seqs``, where the step budget leaves prompts a token per
    step (the 2-stage test at budget 256, online: TPOT 65 s against 0.12), which an unbounded
    step reached in one jump (batch 4 -> 224). The one wanted is the one reached filling from
    empty (the iteration starts at one decode per node, no requests). Online (rates given) the
    map is isotone in the batches (a bigger batch lengthens steps and round trips, so fewer
    steps per s carry the same decodes), and damped steps from below rise monotonically to its
    least fixed point (each stays below it: ``x <= x*`` gives ``g(x) <= g(x*) = x*``). This is
    an argument and a measurement, not a proof of global convergence: progressive filling makes
    the map only piecewise smooth (which node fills first can switch), so a step that leaves the
    residual more than :data:`RESTART_GROWTH` times the best so far drops the history (the next
    step is a plain damped one), and :data:`MAX_ITERATIONS` stays as a safeguard that
    ``_Model.iterations`` and a warning make visible.

    Coordinates: log batch (batches span 1 to ``max_batch_seqs``) and rate over the first
    answer's largest rate, so that one tolerance (:data:`TOLERANCE`) and one least-squares
    problem weigh them alike. Pure numpy in a fixed order: deterministic."""

    def __init__(self, max_batch: float):
        self.top = math.log(max_batch)
        self.scale: float | None = None
        self.iterations = 0
        self.best = math.inf
        self.history: list[tuple[np.ndarray, np.ndarray]] = []   # (state, residual)
        self.mixing: np.ndarray | None = None   # per coordinate; halved where it swings

    def next(self, batch: np.ndarray, rate: np.ndarray, new_batch: np.ndarray,
             new_rate: np.ndarray) -> tuple[bool, np.ndarray, np.ndarray]:
        """(converged, next batch, next rate) after the map took (batch, rate) to (new_batch,
        new_rate); converged: the answer itself is returned."""
        self.iterations += 1
        if self.scale is None:
            self.scale = max(float(new_rate.max()), 1e-12)
        nb = len(batch)
        x = np.concatenate([np.log(batch), rate / self.scale])
        f = np.concatenate([np.log(new_batch), new_rate / self.scale]) - x
        size = float(np.max(np.abs(f))) if len(f) else 0.0
        if size < TOLERANCE:
            return True, new_batch, new_rate
        if size > RESTART_GROWTH * self.best:
            self.history.clear()
        self.best = min(self.best, size)
        if self.mixing is None:
            self.mixing = np.full(len(f), MIXING)
        elif len(self.history) >= 2:   # swung twice running: a cycle, not one overshoot
            swung = (f * self.history[-1][1] < 0) & (self.history[-1][1] * self.history[-2][1] < 0)
            self.mixing = np.where(swung, np.maximum(self.mixing / 2, MIXING_MIN),
                                   np.minimum(self.mixing * MIXING_REGAIN, MIXING))
        a = self.mixing
        step = x + a * f
        if self.history and size < ANDERSON_FROM:
            dx = np.stack([x - x0 for x0, _ in self.history], axis=1)
            df = np.stack([f - f0 for _, f0 in self.history], axis=1)
            gamma = np.linalg.lstsq(df, f, rcond=None)[0]
            jump = (dx + a[:, None] * df) @ gamma
            reach = float(np.max(np.abs(jump)))
            if reach > ANDERSON_REACH:
                jump *= ANDERSON_REACH / reach
            step = step - jump
        self.history = [*self.history[-(ANDERSON_DEPTH - 1):], (x, f)] if ANDERSON_DEPTH else []
        log_batch = np.clip(step[:nb], 0.0, self.top)
        return False, np.exp(log_batch), np.maximum(step[nb:], 0.0) * self.scale


#: Damping of :class:`_Mixer` (the share of the map's answer in a plain step).
MIXING = 0.5
#: A coordinate whose residual changes sign has its mixing halved, down to this; otherwise it
#: grows back by MIXING_REGAIN per step, up to MIXING.
MIXING_MIN = 1 / 64
MIXING_REGAIN = 1.1
#: States :class:`_Mixer` combines (Anderson depth).
ANDERSON_DEPTH = 5
#: A residual this many times the best so far drops :class:`_Mixer`'s history.
RESTART_GROWTH = 4.0
#: :class:`_Mixer` extrapolates only once the residual is below this (near a fixed point, where
#: the secants mean something) ...
ANDERSON_FROM = 0.1
#: ... and by at most this much in any coordinate (log batch: x1.35; rate: 0.3 of the largest).
ANDERSON_REACH = 0.3


#: Rounds of :func:`scheduler_fallback` (each routes a bulk of requests along one path).
FALLBACK_ROUNDS = 400


def scheduler_fallback(plan: Plan, flow_paths: tuple[PlanPipeline, ...],
                       kv_requests: dict[str, float], rounds: int = FALLBACK_ROUNDS
                       ) -> tuple[tuple[PlanPipeline, float], ...]:
    """The paths the coordinator's scheduler falls back to once the flow paths' nodes are full,
    each with the requests it takes, most first (those in ``flow_paths`` left out).

    The rule played in bulk (:class:`coordinator.schedulers.HelixScheduler`): the flow paths
    fill first, in proportion to their shares, until a node's KV (``kv_requests``, requests of
    the node's whole slice) is full; then each request walks from the coordinator over the usable
    hops whose node has room and reaches the sink through nodes with room, taking a max-flow arc
    where one is open and otherwise the node least used (its KV's used fraction). Each round
    sends a fifth of what the path it finds can still take (at least one request) along it,
    until no path has room. Enumerating every usable path instead (thousands on hetero42) in a
    fixed order missed the one the scheduler actually fills (658 of 867 requests in flight)."""
    ranges = as_placement(plan.placements, skip_empty=True)
    L, partial = plan.num_layers, plan.partial_inference
    names = sorted(ranges)
    members, rep, next_ranges = _range_classes(ranges, L, partial)
    rep_of = {COORDINATOR: COORDINATOR, **{n: rep[ranges[n]] for n in names}}
    by_range = {v: [w for w in names if ranges[w] in rs] for v, rs in next_ranges.items()}
    ends = {v: hop_usable(ranges, L, partial, v, COORDINATOR) for v in names}
    flow = {(a.src, a.dst): a.flow_tokens_per_s for a in plan.arc_flows if a.flow_tokens_per_s > 0}
    cap = {n: kv_requests.get(n, 0.0) for n in names}
    used = dict.fromkeys(names, 0.0)
    # The flow paths, by share, until their nodes fill (progressive filling).
    live = [q for q in flow_paths if all(cap[n] > 0 for n in q.nodes)]
    while live:
        load: dict[str, float] = {}
        for q in live:
            for n in q.nodes:
                load[n] = load.get(n, 0.0) + q.share
        step = min((cap[n] - used[n]) / x for n, x in load.items())
        for n, x in load.items():
            used[n] += step * x
        full = {n for n in load if used[n] >= cap[n] * (1 - 1e-9)}
        live = [q for q in live if not full.intersection(q.nodes)]
    known = {q.nodes for q in flow_paths}
    taken: dict[tuple[str, ...], list] = {}
    # Successors first: every usable hop moves to a higher layer end.
    range_order = sorted(members, key=lambda r: (-r[1], r))
    # The rounds on arrays indexed like ``names`` (1,000 nodes x 400 rounds): KV room, which
    # nodes can still reach the sink, and each vertex's successors as index arrays.
    index = {n: i for i, n in enumerate(names)}
    capacity = np.array([cap[n] for n in names])
    in_use = np.array([used[n] for n in names])
    in_range = {r: np.array([index[n] for n in ns], dtype=np.intp) for r, ns in members.items()}
    next_of = {v: np.array([index[w] for w in ws], dtype=np.intp) for v, ws in by_range.items()}
    open_of: dict[str, np.ndarray] = {}   # per vertex: which successors a max-flow arc reaches
    for _ in range(rounds):
        room = capacity - in_use
        finish = np.zeros(len(names), dtype=bool)
        reached: dict[tuple[int, int], bool] = {}   # some node of the range can finish
        for r in range_order:
            head = rep[r]
            if ends[head] or any(reached[x] for x in next_ranges[head]):
                finish[in_range[r]] = room[in_range[r]] >= 1.0
            reached[r] = bool(finish[in_range[r]].any())
        v, at, stages, path = COORDINATOR, 0, [], []
        while v == COORDINATOR or not ends[v]:
            nxt = next_of[rep_of[v]]
            ok = finish[nxt]
            if not ok.any():
                break
            if v not in open_of:
                open_of[v] = np.array([(v, names[j]) in flow for j in nxt], dtype=bool)
            pool = nxt[ok & open_of[v]] if (ok & open_of[v]).any() else nxt[ok]
            j = int(pool[np.argmin(in_use[pool] / capacity[pool])])   # least used, first on ties
            w = names[j]
            stages.append(LayerSlice(w, at, ranges[w][1]))
            path.append(j)
            v, at = w, ranges[w][1]
        if not stages or not ends[v]:
            break
        nodes = tuple(st.node for st in stages)
        amount = max(1.0, 0.2 * float(room[path].min()))
        in_use[path] += amount
        if nodes not in known:
            entry = taken.setdefault(nodes, [PlanPipeline(tuple(stages), 0.0), 0.0])
            entry[1] += amount
    return tuple(sorted(((q, n) for q, n in taken.values()), key=lambda e: (-e[1], e[0].nodes)))


def _range_classes(ranges: dict[str, tuple[int, int]], num_layers: int, partial: bool):
    """Nodes grouped by layer range: (range -> its nodes in name order, range -> its first node,
    vertex -> the ranges a hop from it may enter), for the coordinator and each range's first
    node. Whether a hop is usable depends on the two ranges only, so :func:`hop_usable` is asked
    once per pair of distinct ranges (a few dozen), not per pair of nodes (10^6 at 1,000)."""
    members: dict[tuple[int, int], list[str]] = {}
    for n in sorted(ranges):
        members.setdefault(ranges[n], []).append(n)
    rep = {r: ns[0] for r, ns in members.items()}
    next_ranges = {v: {r for r, w in rep.items() if hop_usable(ranges, num_layers, partial, v, w)}
                   for v in (COORDINATOR, *rep.values())}
    return members, rep, next_ranges


def convoy_delay_s(excess_s: np.ndarray, prompts_per_s: np.ndarray) -> np.ndarray:
    """Mean delay per round trip that a pipeline's own prompts cause its decodes (a convoy).

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


def _ttft_median(fixed_s: np.ndarray, mean_prompt_s: np.ndarray, weights: np.ndarray
                 ) -> float | None:
    """Median TTFT over requests: on pipeline i a prompt of p tokens takes
    ``fixed_s[i] + mean_prompt_s[i] x p / mean p``, p lognormal with CV :data:`PROMPT_CV`."""
    if weights.sum() <= 0:
        return None
    sigma = math.sqrt(math.log(1.0 + PROMPT_CV ** 2))
    w = weights / weights.sum()

    def below(x: float) -> float:   # fraction of requests with TTFT <= x
        ratio = np.maximum((x - fixed_s) / np.maximum(mean_prompt_s, 1e-12), 1e-300)
        z = (np.log(ratio) + sigma ** 2 / 2) / (sigma * math.sqrt(2))   # ln(p / mean p) = ln ratio
        return float(np.sum(w * 0.5 * (1 + np.vectorize(math.erf)(z)) * (x > fixed_s)))
    lo, hi = float(fixed_s.min()), float((fixed_s + 20 * mean_prompt_s).max())
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if below(mid) < 0.5 else (lo, mid)
    return 0.5 * (lo + hi)


def _median(values: np.ndarray, weights: np.ndarray) -> float | None:
    if weights.sum() <= 0:
        return None
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][np.searchsorted(cum, 0.5)])


def online_rates(saturated: np.ndarray, primary: np.ndarray, load: float) -> np.ndarray:
    """Requests/s per pipeline when ``load`` x the saturated total arrives: the max-flow paths
    take theirs first (up to their saturated rates, in proportion), the fallback paths the rest
    in proportion to theirs: the scheduler goes there only when the flow paths' nodes are full."""
    want = load * float(saturated.sum())
    on_primary = float(saturated[primary].sum())
    out = np.where(primary, saturated * min(1.0, want / on_primary) if on_primary > 0 else 0.0, 0.0)
    rest, on_fallback = max(0.0, want - float(out.sum())), float(saturated[~primary].sum())
    if on_fallback > 0:
        out = out + np.where(primary, 0.0, saturated * rest / on_fallback)
    return out


def predict(spec: ClusterSpec, plan: Plan, cost: CostModel | None = None,
            load: float = ONLINE_LOAD, latencies: bool = True, strict: bool = False
            ) -> tuple[Prediction, tuple[PipelineState, ...]]:
    """The plan's predicted offline throughput and online latencies at ``load``, and the state of
    every pipeline at saturation. ``cost`` (default: the spec's) says which model the plan places.
    ``latencies=False``: throughput only (TTFT and TPOT None, no online solve), to rank plans.
    ``strict``: raise :class:`NoFixedPoint` where the fixed point is not reached (otherwise a
    warning, and the last state is used)."""
    cost = cost or CostModel.for_cluster(spec)
    m = _Model(spec, plan, cost, strict)
    if not m.paths:
        return Prediction(0.0, 0.0, 0.0, 0, 0.0, load, None, None), ()
    N, rate, R, F, _, batch, _ = m.solve(m.fill)
    states = tuple(PipelineState(q, float(n), float(r), float(rt), float(f))
                   for q, n, r, rt, f in zip(m.paths, N, rate, R, F))
    if not latencies:
        total = float(rate.sum())
        return Prediction(total * (m.p + m.o), total * m.o, total, int(np.count_nonzero(N > 1e-9)),
                          float(N.sum()), load, None, None), states
    target = online_rates(rate, m.share > 0, load)
    n_on, rate_on, R_on, F_on, F0_on, _, _ = m.solve(lambda stay: target * stay)
    total = float(rate.sum())
    return Prediction(
        prompt_decode_tokens_per_s=total * (m.p + m.o), decode_tokens_per_s=total * m.o,
        requests_per_s=total, pipelines=int(np.count_nonzero(N > 1e-9)), requests_in_flight=float(N.sum()),
        online_load=load, ttft_p50_s=_ttft_median(F0_on, F_on - F0_on, rate_on),
        tpot_p50_s=_median(R_on, rate_on)), states
