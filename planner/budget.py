"""The step token budget (``serving.chunk_tokens``) chosen by the prediction (``chunk_tokens: auto``).

A smaller budget cuts prompts into more, shorter steps: fewer decodes wait behind a long prompt
step at every stage they cross (the convoy of :mod:`planner.prediction`), but a prompt takes more
steps. Which wins depends on the placement's pipelines, so the planner predicts the placement it
chose (routing and all) at each budget the prediction is checked at
(:data:`helix.core.serving.CHECKED_STEP_BUDGETS`) that holds a decode with its share of prompt tokens
(:func:`helix.core.spec.step_budget_floor`) and keeps the one with the most decode tokens/s (ties: the
larger budget). Deterministic (until a deadline passes: then the budgets predicted so far, at
least one); the placement itself is not searched again.
"""

from __future__ import annotations

import dataclasses
import time

from helix.core.costmodel import CostModel
from helix.core.models import ModelSpec
from helix.core.plan import Plan, Prediction
from helix.core.serving import CHECKED_STEP_BUDGETS
from helix.core.spec import ClusterSpec, step_budget_floor
from planner.deadline import Deadline
from planner.predicted import predict_plan


def at_budget(spec: ClusterSpec, chunk_tokens: int) -> ClusterSpec:
    """``spec`` with the step budget ``chunk_tokens`` (set, not chosen)."""
    serving = spec.serving.model_copy(update={"chunk_tokens": chunk_tokens,
                                              "choose_chunk_tokens": None})
    return spec.model_copy(update={"serving": serving})


def predictions(spec: ClusterSpec, plan: Plan, model: ModelSpec | None = None,
                candidates: tuple[int, ...] = CHECKED_STEP_BUDGETS,
                deadline: Deadline | None = None) -> dict[int, Prediction]:
    """The plan's prediction at each budget of ``candidates``: the first, and the others while
    ``deadline`` leaves the time the longest one took."""
    out: dict[int, Prediction] = {}
    longest_s = 0.0
    for chunk in candidates:
        if out and deadline is not None and not deadline.allows(longest_s):
            break
        started_s = time.perf_counter()
        at = at_budget(spec, chunk)
        out[chunk] = predict_plan(at, plan, CostModel.for_cluster(at, model))[0]
        longest_s = max(longest_s, time.perf_counter() - started_s)
    return out


def choose(spec: ClusterSpec, plan: Plan, model: ModelSpec | None = None,
           candidates: tuple[int, ...] = CHECKED_STEP_BUDGETS,
           deadline: Deadline | None = None) -> tuple[int, dict[int, Prediction]]:
    """(the budget with the most predicted decode tokens/s, ties to the larger one; every
    budget's prediction: those predicted before ``deadline``)."""
    by_budget = predictions(spec, plan, model, candidates, deadline)
    best = max(by_budget, key=lambda c: (round(by_budget[c].decode_tokens_per_s, 6), c))
    return best, by_budget


def apply(spec: ClusterSpec, plan: Plan, model: ModelSpec | None = None,
          deadline: Deadline | None = None) -> Plan:
    """``plan`` with the chosen budget in its serving section and its prediction at that budget,
    the predicted decode tokens/s of every budget in ``extras['chunk_tokens_predicted']`` (those
    predicted before ``deadline``: at least one); the plan as it is when the spec sets its
    budget."""
    if not spec.serving.choose_chunk_tokens:
        return plan
    floor = step_budget_floor(spec.workload.mean_prompt_tokens, spec.workload.mean_output_tokens)
    fitting = tuple(c for c in CHECKED_STEP_BUDGETS if c >= floor)
    best, by_budget = choose(spec, plan, model, fitting or (spec.serving.chunk_tokens,), deadline)
    serving = None if plan.serving is None else \
        plan.serving.model_copy(update={"chunk_tokens": best})
    return dataclasses.replace(plan, serving=serving, prediction=by_budget[best], extras={
        **plan.extras, "chunk_tokens_chosen": best,
        "chunk_tokens_predicted": {str(c): round(p.decode_tokens_per_s, 1)
                                   for c, p in by_budget.items()}})
