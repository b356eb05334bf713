"""A simulated worker: the real step policy, timed by the cost model.

The worker holds one :class:`worker.step_policy.StepPolicy` over a :class:`worker.kv_blocks.KVBlockManager`
sized from the cost model's KV capacity for its slice — the very objects the live worker runs — and
only adds a clock: a step's duration is the sum over its layers of the cost model's one-layer time for
the requests present at that layer. A request entering mid-slice (overlapping ranges, Helix's partial
inference) joins the batch at its entry layer, so the early layers of the step run without it.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.kv_blocks import KVBlockManager
from worker.step_policy import PolicyConfig, StepPlan, StepPolicy

#: ``layer_time(prompt_tokens, decode_seqs, decode_context, prompt_context) -> seconds`` of ONE layer.
LayerTime = Callable[[float, float, float, float], float]

#: ``adapter_time(rows of each task group) -> seconds`` the task terms add to a step over the slice.
AdapterTime = Callable[[list[int]], float]


class SimWorker:
    """One node's slice ``[start, end)``; ``requests`` maps request id -> ``[SimRequest, stage index,
    next stage's worker (None: this is the last stage), positions forwarded downstream so far, the
    request's epoch]`` (a stage recomputing after a preemption forwards nothing it already sent)."""

    __slots__ = ("name", "start", "end", "policy", "layer_time", "step_overhead", "requests", "entry",
                 "busy", "start_pending", "maybe_ready", "busy_s", "num_steps", "num_preemptions",
                 "_num_partial", "peak_used_blocks", "down", "epoch", "detected_epoch", "routed",
                 "first_routed_s", "last_routed_s", "adapter_time", "busy_until_s", "inbox")

    def __init__(self, name: str, start: int, end: int, kv_capacity_tokens: int,
                 layer_time: LayerTime, policy_config: PolicyConfig,
                 block_size_tokens: int = 16, step_overhead: LayerTime | None = None,
                 adapter_time: AdapterTime | None = None) -> None:
        """``step_overhead``: seconds a step costs apart from its layers (same arguments as
        ``layer_time``, charged once per step); None = nothing. ``adapter_time``: seconds the
        fine-tuned tasks' terms add to a step over the whole slice, given each task group's rows
        (:meth:`helix.core.costmodel.CostModel.adapter_step_s`); None = nothing."""
        self.name = name
        self.start = start
        self.end = end
        num_blocks = max(1, kv_capacity_tokens // block_size_tokens)
        self.policy = StepPolicy(policy_config, KVBlockManager(num_blocks, block_size_tokens))
        self.layer_time = layer_time
        self.step_overhead = step_overhead
        self.requests: dict[int, list] = {}
        self.entry: dict[int, int] = {}
        """First layer each request runs here (> start when it enters mid-slice)."""
        self.busy = False
        self.busy_until_s = 0.0
        """When the step in progress ends (while ``busy``)."""
        self.inbox: list[tuple[float, int, list]] = []
        """Messages that reached the worker during its step, ``(arrival time, event sequence
        number, items)``: the simulator feeds them to the policy when the step ends (see
        ``Simulator.on_inputs_at_worker``)."""
        self.start_pending = False
        self.maybe_ready = True
        """False when the last schedule() left nothing that could run without new inputs."""
        self.busy_s = 0.0
        self.num_steps = 0
        self.num_preemptions = 0
        self._num_partial = 0
        self.peak_used_blocks = 0
        self.down = False
        """Dead (or cut off): it neither steps nor receives until it comes back."""
        self.epoch = 0
        """Bumped when the worker goes down: a step it had started never finishes."""
        self.detected_epoch = 0
        """The last outage whose requests were moved (the coordinator noticed it)."""
        self.routed = 0
        """Requests the coordinator gave a pipeline through this worker (a moved one again)."""
        self.first_routed_s: float | None = None
        self.last_routed_s: float | None = None
        self.adapter_time = adapter_time

    def go_down(self) -> None:
        """The process is gone: every request and all KV with it; a step in progress never ends."""
        self.down = True
        self.epoch += 1
        self.busy = self.start_pending = False
        self.inbox = []
        blocks = self.policy.blocks
        self.policy = StepPolicy(self.policy.config, KVBlockManager(blocks.num_blocks,
                                                                    blocks.block_size_tokens))
        self.requests.clear()
        self.entry.clear()
        self._num_partial = 0
        self.maybe_ready = True

    @property
    def kv_capacity_tokens(self) -> int:
        return self.policy.blocks.capacity_tokens

    def admit(self, request, stage_index: int, entry_layer: int, num_available: int) -> None:
        """First input of ``request`` arrived: queue it in the policy."""
        rid = request.request_id
        workers = request.workers
        nxt = workers[stage_index + 1] if stage_index + 1 < len(workers) else None
        self.requests[rid] = [request, stage_index, nxt, 0, request.epoch]
        self.entry[rid] = entry_layer
        if entry_layer != self.start:
            self._num_partial += 1
        # A request moved off a dead node prefills what it already streamed: only the rest is output.
        self.policy.add(rid, request.prompt_tokens, request.output_tokens - request.received,
                        num_available_tokens=num_available)

    def drop(self, request_id: int) -> None:
        """The request finished: free its KV and forget it."""
        if self.requests.pop(request_id, None) is None:
            return
        if self.entry.pop(request_id) != self.start:
            self._num_partial -= 1
        self.policy.finish(request_id)

    def step_time_s(self, plan: StepPlan) -> float:
        """Duration of ``plan`` over this slice (requests join at their entry layer), plus its
        fine-tuned tasks' terms (charged over the whole slice, also for a request that enters
        mid-slice)."""
        t = self._base_time_s(plan)
        if self.adapter_time is None:
            return t
        rows: dict[str, int] = {}
        requests = self.requests
        for rid in plan.decode_ids:
            task = requests[rid][0].task
            if task is not None:
                rows[task] = rows.get(task, 0) + 1
        for c in plan.prefill_chunks:
            task = requests[c.request_id][0].task
            if task is not None:
                rows[task] = rows.get(task, 0) + c.num_tokens
        return t + self.adapter_time(list(rows.values())) if rows else t

    def _base_time_s(self, plan: StepPlan) -> float:
        if self._num_partial == 0:
            d = len(plan.decode_ids)
            p = 0
            p_ctx = 0.0
            for c in plan.prefill_chunks:
                p += c.num_tokens
                p_ctx += c.num_tokens * (c.start + c.end) * 0.5
            d_ctx = sum(plan.decode_positions) / d if d else 0.0
            p_ctx = p_ctx / p if p else 0.0
            t = (self.end - self.start) * self.layer_time(p, d, d_ctx, p_ctx)
            return t if self.step_overhead is None else t + self.step_overhead(p, d, d_ctx, p_ctx)
        return self._segmented_time_s(plan)

    def _segmented_time_s(self, plan: StepPlan) -> float:
        # Per entry layer: (prompt tokens, prompt context sum, decodes, decode context sum).
        groups: dict[int, list[float]] = {}
        for rid, pos in zip(plan.decode_ids, plan.decode_positions):
            g = groups.setdefault(self.entry[rid], [0, 0.0, 0, 0.0])
            g[2] += 1
            g[3] += pos
        for c in plan.prefill_chunks:
            g = groups.setdefault(self.entry[c.request_id], [0, 0.0, 0, 0.0])
            g[0] += c.num_tokens
            g[1] += c.num_tokens * (c.start + c.end) * 0.5
        total = 0.0
        acc = [0, 0.0, 0, 0.0]
        entries = sorted(groups)
        for i, layer in enumerate(entries):
            acc = [a + b for a, b in zip(acc, groups[layer])]
            upto = entries[i + 1] if i + 1 < len(entries) else self.end
            p, p_ctx, d, d_ctx = acc
            total += (upto - layer) * self.layer_time(p, d, d_ctx / d if d else 0.0,
                                                      p_ctx / p if p else 0.0)
        if self.step_overhead is not None:   # acc holds the whole step now
            p, p_ctx, d, d_ctx = acc
            total += self.step_overhead(p, d, d_ctx / d if d else 0.0, p_ctx / p if p else 0.0)
        return total
