"""``predict(spec, plan) -> Prediction``: the plan's throughput at saturation and its latencies
at :data:`ONLINE_LOAD` of it (the steps: :mod:`planner.prediction`).

Offline: saturation (the KV fills). Online: requests at ``load`` x the predicted request rate,
Poisson; the max-flow pipelines take theirs first, the fallback paths the rest
(:func:`online_rates`); TTFT and time per output token p50 are the medians over requests of F
(its prompt part scaled by the request's prompt length,
:data:`~planner.prediction.model.PROMPT_CV`) and of R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helix.core.costmodel import CostModel
from helix.core.pipelines import PlanPipeline
from helix.core.plan import Plan, Prediction
from helix.core.spec import ClusterSpec
from planner.prediction.model import PROMPT_CV, Model

#: Fraction of the predicted saturated request rate at which latencies are predicted.
ONLINE_LOAD = 0.75


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


def ttft_median(fixed_s: np.ndarray, mean_prompt_s: np.ndarray, weights: np.ndarray
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


def median(values: np.ndarray, weights: np.ndarray) -> float | None:
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
    ``strict``: raise :class:`~planner.prediction.fixed_point.NoFixedPoint` where the fixed point
    is not reached (otherwise a warning, and the last state is used)."""
    cost = cost or CostModel.for_cluster(spec)
    m = Model(spec, plan, cost, strict)
    if not m.paths:
        return Prediction(0.0, 0.0, 0.0, 0, 0.0, load, None, None), ()
    N, rate, R, F, *_ = m.solve(m.fill)
    states = tuple(PipelineState(q, float(n), float(r), float(rt), float(f))
                   for q, n, r, rt, f in zip(m.paths, N, rate, R, F))
    if not latencies:
        total = float(rate.sum())
        return Prediction(total * (m.p + m.o), total * m.o, total, int(np.count_nonzero(N > 1e-9)),
                          float(N.sum()), load, None, None), states
    target = online_rates(rate, m.share > 0, load)
    _, rate_on, R_on, F_on, F0_on, _, _ = m.solve(lambda stay: target * stay)
    total = float(rate.sum())
    return Prediction(
        prompt_decode_tokens_per_s=total * (m.p + m.o), decode_tokens_per_s=total * m.o,
        requests_per_s=total, pipelines=int(np.count_nonzero(N > 1e-9)), requests_in_flight=float(N.sum()),
        online_load=load, ttft_p50_s=ttft_median(F0_on, F_on - F0_on, rate_on),
        tpot_p50_s=median(R_on, rate_on)), states
