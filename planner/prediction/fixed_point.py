"""The prediction's fixed point: iterate :meth:`Model.evaluate
<planner.prediction.model.Model.evaluate>` from one decode per node and no requests until the
decode batches and the request rates settle, each step mixed by :class:`Mixer` (damped, Anderson-
accelerated; its docstring argues why that converges where damping the batches alone cycled).

Pure numpy in a fixed order: deterministic.
"""

from __future__ import annotations

import logging
import math

import numpy as np

log = logging.getLogger("helix.planner.prediction")

#: Evaluations of the fixed-point map at most: a safeguard (every plan measured converges within
#: 84: the shipped clusters and generated ones of 60-1,000 nodes, every heuristic placement
#: and routing; :class:`Mixer`). ``Model.iterations`` records how many each solve took.
MAX_ITERATIONS = 200


class NoFixedPoint(ArithmeticError):
    """The fixed point was not reached within :data:`MAX_ITERATIONS` (``predict(...,
    strict=True)``): the answer would be whichever state the last evaluation hit. Seen on chains
    whose traffic crosses a slow region link through one or two node pairs, loaded near its cap,
    which the simulator shows collapsing (BENCHMARKS.md, *Plan vs simulator*)."""

#: The fixed point is reached when no node's decode batch moves by more than this (relative)
#: and no path's request rate by more than this times the largest path's rate.
TOLERANCE = 1e-3


class Mixer:
    """The next state of :func:`iterate`'s fixed point: (decode batch per node, request
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
    ``Model.iterations`` and a warning make visible.

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


#: Damping of :class:`Mixer` (the share of the map's answer in a plain step).
MIXING = 0.5
#: A coordinate whose residual changes sign has its mixing halved, down to this; otherwise it
#: grows back by MIXING_REGAIN per step, up to MIXING.
MIXING_MIN = 1 / 64
MIXING_REGAIN = 1.1
#: States :class:`Mixer` combines (Anderson depth).
ANDERSON_DEPTH = 5
#: A residual this many times the best so far drops :class:`Mixer`'s history.
RESTART_GROWTH = 4.0
#: :class:`Mixer` extrapolates only once the residual is below this (near a fixed point, where
#: the secants mean something) ...
ANDERSON_FROM = 0.1
#: ... and by at most this much in any coordinate (log batch: x1.35; rate: 0.3 of the largest).
ANDERSON_REACH = 0.3


def iterate(model, in_flight_of) -> tuple[np.ndarray, ...]:
    """``model``'s fixed point (a :class:`~planner.prediction.model.Model`; ``in_flight_of(stay_s)``
    gives requests per pipeline): (N, rate, R, F, F0 per path; batch, busy fraction per node).
    Where :data:`MAX_ITERATIONS` pass first: :class:`NoFixedPoint` when the model is strict,
    otherwise a warning and the last state. The evaluations it took go to ``model.iterations``."""
    batch = np.ones(len(model.nodes))
    steps = np.zeros(len(model.nodes))
    rate = np.zeros(len(model.paths))
    mixer = Mixer(model.max_batch)
    for _ in range(MAX_ITERATIONS):
        answer = model.evaluate(batch, steps, rate, in_flight_of)
        # The next state mixes (batch, rate) as a whole (Mixer: why, and why it converges).
        done, batch, rate = mixer.next(batch, rate, answer.batch, answer.rate)
        steps = model.steps_per_s(batch, rate)
        if done:
            break
    else:
        if model.strict:
            raise NoFixedPoint(f"no fixed point within {MAX_ITERATIONS} evaluations")
        log.warning("prediction: no fixed point within %d evaluations (the last state is "
                    "used)", MAX_ITERATIONS)
    model.iterations.append(mixer.iterations)
    return (answer.requests_in_flight, rate, answer.round_trip_s, answer.first_token_s,
            answer.first_token_fixed_s, batch, steps * answer.step_s)
