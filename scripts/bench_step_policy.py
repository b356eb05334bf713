"""Host time of one worker step: the full-scan step policy against the incremental one, in one run.

A pipeline stage (``self_feeding=False``) holds ``N`` requests resident, all past their prompts. Each
step the next input of ``--ready`` of them arrives (``feed``, round robin over the residents), the
policy schedules them and the step completes. The timed work per step is ``feed`` + ``schedule`` +
``complete``, the same calls the simulator and the worker engine make. Baseline: the frozen full-scan
copy kept as the oracle in ``tests/worker/test_step_policy_reference.py``.

Both policies run the same steps in alternating rounds (so load drift hits both); a table row is the
best round of each, in microseconds per step. Plans are checked identical before timing.

    python scripts/bench_step_policy.py                      # N = 100, 700, 2000: a few seconds
    python scripts/bench_step_policy.py --sizes 700 --steps 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.worker.test_step_policy_reference import ReferenceStepPolicy  # noqa: E402
from worker.kv_blocks import KVBlockManager, blocks_for_tokens  # noqa: E402
from worker.step_policy import PolicyConfig, StepPolicy  # noqa: E402

PROMPT_TOKENS = 32
BLOCK_SIZE_TOKENS = 16


def resident_stage(policy_cls, num_requests: int, max_new_tokens: int):
    """A stage policy holding ``num_requests`` requests with their prompts computed, none ready."""
    config = PolicyConfig(max_num_batched_tokens=512, self_feeding=False)
    per_request = blocks_for_tokens(PROMPT_TOKENS + max_new_tokens, BLOCK_SIZE_TOKENS)
    policy = policy_cls(config, KVBlockManager(num_requests * per_request, BLOCK_SIZE_TOKENS))
    for rid in range(num_requests):
        policy.add(rid, PROMPT_TOKENS, max_new_tokens)
    while not (plan := policy.schedule()).is_empty:
        policy.complete(plan)
    assert not policy.waiting_ids and len(policy.running_ids) == num_requests
    return policy


def run_steps(policy, first_step: int, num_steps: int, num_ready: int) -> float:
    """Seconds for ``num_steps`` steps of feed + schedule + complete."""
    n = len(policy.running_ids)
    feeds = [[(s * num_ready + j) % n for j in range(num_ready)]
             for s in range(first_step, first_step + num_steps)]
    feed, schedule, complete = policy.feed, policy.schedule, policy.complete
    t0 = time.perf_counter()
    for ids in feeds:
        for rid in ids:
            feed(rid)
        complete(schedule())
    return time.perf_counter() - t0


def check_same_plans(old, new, num_ready: int, num_steps: int = 20) -> None:
    n = len(old.running_ids)
    for s in range(num_steps):
        for policy in (old, new):
            for j in range(num_ready):
                policy.feed((s * num_ready + j) % n)
        plan_old, plan_new = old.schedule(), new.schedule()
        assert plan_old == plan_new and len(plan_new.decode_ids) == num_ready, (plan_old, plan_new)
        old.complete(plan_old)
        new.complete(plan_new)


def bench(num_requests: int, num_ready: int, num_steps: int, num_rounds: int) -> tuple[float, float]:
    """Best-round microseconds per step (old, new)."""
    check_steps = 20
    tokens_per_request = (check_steps + num_steps * num_rounds) * num_ready // num_requests + 2
    old = resident_stage(ReferenceStepPolicy, num_requests, tokens_per_request)
    new = resident_stage(StepPolicy, num_requests, tokens_per_request)
    check_same_plans(old, new, num_ready, check_steps)
    best = {"old": float("inf"), "new": float("inf")}
    for r in range(num_rounds):
        first = check_steps + r * num_steps
        for name, policy in (("old", old), ("new", new)):
            best[name] = min(best[name], run_steps(policy, first, num_steps, num_ready))
    return best["old"] / num_steps * 1e6, best["new"] / num_steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 700, 2000],
                    help="resident requests per case")
    ap.add_argument("--ready", type=int, default=8, help="requests whose input arrives each step")
    ap.add_argument("--steps", type=int, default=2000, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per policy (best one reported)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    load_before = os.getloadavg()
    print(f"# step policy host time: python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{args.ready} ready per step, best of {args.rounds} x {args.steps} steps")
    print(f"{'N resident':>10} {'old us/step':>12} {'new us/step':>12} {'old/new':>8}")
    for n in args.sizes:
        old_us, new_us = bench(n, args.ready, args.steps, args.rounds)
        print(f"{n:>10} {old_us:>12.1f} {new_us:>12.1f} {old_us / new_us:>7.1f}x", flush=True)
    load_after = os.getloadavg()
    print(f"# load average (1/5/15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in load_after)}; {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
