"""The built-in PyTorch engine: one slice of a LLaMA model, driven one iteration at a time.

``SliceEngine.step(inputs)`` takes what arrived (token ids on the first stage, hidden states on later
ones), lets the :class:`~worker.step_policy.StepPolicy` pick the iteration's work, runs the slice over
one ``[num_tokens, hidden]`` matrix and returns hidden states for the next stage or, on the last stage,
sampled tokens. An engine that holds the whole model (first and last stage at once) feeds its sampled
tokens back to itself, so ``generate`` is just a loop over ``step``.

Preemption is local: the engine keeps every input it received for a request, so a preempted request is
recomputed here from those inputs; outputs are emitted only for positions never emitted before, so the
other stages never notice.

A failure tied to one request fails only that request: an input the engine refuses (token ids outside
the vocabulary, stop token ids or a logprobs count it cannot serve, more KV than the pool holds, an
input out of order) drops the request, and a step whose model run raises drops the requests of that
step; the others keep running. Dropped requests are reported by :meth:`SliceEngine.take_failures`
(the worker tells the coordinator, which answers the client with an error and frees the request's KV
on every stage).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch

from helix.core.errors import USER_FAILURE, HelixUserError
from helix.core.gguf import checkpoint_folder
from helix.net.io_types import NewRequest, StageInput, StageOutput
from helix.net.sampling import SampledToken
from worker.adapter_cache import NoRoom
from worker.adapter_registry import AdapterRegistry
from worker.adapter_stack import StackCache
from worker.adapters import SliceAdapter, order_by_task, task_rows
from worker.attention import resolve_backend
from worker.decode_graphs import DecodeGraphs
from worker.engine_config import EngineConfig, check_pool_fits, torch_dtype
from worker.guided import Guide, GuideCompiler
from worker.kv_blocks import KVBlockManager
from worker.kv_cache import PagedKVCache, kv_bytes_per_block, num_blocks_for_budget
from worker.model import SliceModel, SliceWeights
from worker.sampling import Sampler, SamplingState
from worker.step_batch import AttentionKind, RowSpan, build_step_batch, plan_rows
from worker.step_policy import PolicyConfig, StepPlan, StepPolicy
from worker.weights import load_slice

log = logging.getLogger("helix.engine")


@dataclass(frozen=True)
class RequestFailure:
    """A request the engine dropped (its state and KV are gone from this engine)."""

    request_id: Hashable
    message: str
    """For people: what was wrong with the request, or what failed in its step."""


@dataclass
class _Request:
    new: NewRequest
    enter_offset: int
    tokens: list[int] = field(default_factory=list)               # first stage inputs
    hidden: list[torch.Tensor] = field(default_factory=list)      # later stage inputs, in order
    hidden_starts: list[int] = field(default_factory=list)        # position of each one's first row
    num_inputs: int = 0
    next_emit: int = 0      # first position whose output was not emitted yet
    sampling: SamplingState | None = None
    adapter: SliceAdapter | None = None   # its task's terms on this slice (None = the base model)
    prompt_lps: list[SampledToken] | None = None   # last stage, when asked: prompt tokens 1.. scored


class SliceEngine:
    """Runs model layers ``[start, end)`` for many requests (implements ``helix.net.io_types.Engine``)."""

    def __init__(self, weights: SliceWeights, config: EngineConfig = EngineConfig()) -> None:
        self.config = config
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = torch_dtype(config.dtype)
        self.weights = weights
        spec = weights.spec
        n_layers = weights.end - weights.start
        num_blocks = config.num_kv_blocks or num_blocks_for_budget(
            config.kv_budget_bytes, n_layers, config.block_size_tokens, spec.num_kv_heads,
            spec.head_dim, self.dtype)
        if self.device.type == "cuda":
            pool = num_blocks * kv_bytes_per_block(n_layers, config.block_size_tokens,
                                                   spec.num_kv_heads, spec.head_dim, self.dtype)
            check_pool_fits(pool, torch.cuda.mem_get_info(self.device)[0], num_blocks, str(self.device))
        self.blocks = KVBlockManager(num_blocks, config.block_size_tokens)
        self.policy = StepPolicy(PolicyConfig(config.max_num_seqs, config.max_num_batched_tokens,
                                              config.chunked_prefill, self_feeding=False), self.blocks)
        backend = resolve_backend(config.attention, self.device, self.dtype)
        graphs = _graph_mode(config.decode_graphs, backend, self.device)
        # With decode graphs the cache holds one more block, never handed out: the padding rows'.
        kv = PagedKVCache(n_layers, num_blocks + (graphs != "off"), config.block_size_tokens,
                          spec.num_kv_heads, spec.head_dim, self.dtype, self.device)
        self.attention = AttentionKind(backend, spec.num_heads // spec.num_kv_heads)
        self.model = SliceModel(weights, kv, self.device, self.dtype, config.pack_cpu_weights, backend)
        self.graphs: DecodeGraphs | None = None
        """The decode step's graphs (None: every step runs eagerly)."""
        if graphs != "off":
            positions = min(spec.max_position_embeddings, self.blocks.capacity_tokens)
            self.graphs = DecodeGraphs(self.model, config.max_num_seqs, positions,
                                       scratch_block=num_blocks, capture=graphs == "on")
            self.graphs.capture_all()   # up front: no step pays a capture
        self.sampler = Sampler(config.eos_token_ids, self.device, config.seed)
        self._reqs: dict[Hashable, _Request] = {}
        self._failures: list[RequestFailure] = []
        self.last_plan: StepPlan | None = None
        self.num_failed_steps = 0
        """Steps whose model run raised (their requests were dropped)."""
        self.guides: GuideCompiler | None = None
        """Compiles structured-output automata (set by :meth:`from_checkpoint`: it needs the
        checkpoint's tokenizer); None = guided requests are refused."""
        self._held: list[StageInput] = []          # inputs of requests whose automaton compiles
        self.adapters = AdapterRegistry(weights, cache_bytes=config.adapter_cache_bytes)
        """The fine-tuned tasks this slice holds (:mod:`worker.adapters`)."""
        self._task_held: list[StageInput] = []     # inputs of requests waiting for cache room
        self._pinned: dict[Hashable, SliceAdapter] = {}   # tasks acquired for requests admitted next
        self._stacks = StackCache()   # LoRA tasks of one shape batched in one product per projection
        self._compiling: dict[Hashable, Future] = {}

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, start: int, end: int,
                        config: EngineConfig = EngineConfig()) -> "SliceEngine":
        """Load layers ``[start, end)`` of a HF checkpoint folder or a GGUF file (only those
        tensors)."""
        ckpt_dir = checkpoint_folder(ckpt_dir)
        device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        weights, _ = load_slice(ckpt_dir, start, end, torch_dtype(config.dtype), device)
        engine = cls(weights, config)
        if weights.is_last:
            engine.guides = GuideCompiler(ckpt_dir, config.eos_token_ids, weights.spec.vocab_size,
                                          engine.device)
        return engine

    # --- Engine interface ------------------------------------------------------------------------
    def step(self, inputs: Sequence[StageInput] = ()) -> list[StageOutput]:
        """Accept ``inputs``, run one iteration, return its outputs. Inputs refused and requests of a
        step that raised are dropped and reported by :meth:`take_failures`, never raised."""
        failed: set[Hashable] = set()
        inputs = self._hold_for_tasks(self._hold_for_guides(inputs))
        for item in inputs:
            if item.request_id in failed:
                continue   # a later piece of a request refused earlier in this batch
            try:
                self._accept(item)
            except Exception as exc:   # refused: drop this request only
                failed.add(item.request_id)
                self._fail([item.request_id], _describe(exc))
        plan = self.policy.schedule()
        self.last_plan = plan
        if plan.is_empty:
            return []
        try:
            return self._run(plan)
        except Exception as exc:   # the model run or the sampler: drop this step's requests only
            log.exception("engine [%d, %d): step failed", self.weights.start, self.weights.end)
            self.num_failed_steps += 1
            ids = [*plan.decode_ids, *(c.request_id for c in plan.prefill_chunks)]
            self._fail(ids, f"the step failed on layers [{self.weights.start}, {self.weights.end}): "
                            f"{_describe(exc)}")
            return []

    def take_failures(self) -> list[RequestFailure]:
        """Requests dropped since the last call (each once)."""
        failures, self._failures = self._failures, []
        return failures

    def _fail(self, request_ids: Sequence[Hashable], message: str) -> None:
        self.release(request_ids)
        self._failures.extend(RequestFailure(rid, message) for rid in dict.fromkeys(request_ids))

    def _run(self, plan: StepPlan) -> list[StageOutput]:
        spans = plan_rows(plan)
        reqs = self._reqs
        has_tasks = any(reqs[s.request_id].adapter is not None for s in spans)
        if has_tasks:
            spans = order_by_task(spans, len(plan.decode_ids), self._task_of)
        x = self._inputs(spans)
        graphed = (self.graphs is not None and not plan.prefill_chunks and not has_tasks
                   and self.graphs.fits(len(spans), max(plan.decode_positions))
                   and not any(reqs[s.request_id].enter_offset for s in spans))
        if self.weights.is_last:
            # Only each request's last row of the step is sampled (and only if never sampled).
            chosen = [s for s in spans if s.end - 1 >= reqs[s.request_id].next_emit]
            scored = self._prompt_rows(spans)
            rows = [s.row_start + s.end - s.start - 1 for s in chosen]
            rows += [s.row_start + p - s.start for s, first, end in scored for p in range(first, end)]
            keep = None if len(rows) == len(spans) and graphed else \
                torch.tensor(rows, dtype=torch.long, device=self.device)
            h = self._forward(plan, spans, x, has_tasks, graphed, keep)
            if scored:
                self._score_prompts(scored, h[len(chosen):])
            outputs, finished, fed_back = self._sample(chosen, h[:len(chosen)])
        else:
            h = self._forward(plan, spans, x, has_tasks, graphed, None)
            outputs, finished, fed_back = self._outputs(spans, h), [], []
        self.policy.complete(plan, finished)
        for rid in finished:
            self._forget(rid)
        for rid, token_id in fed_back:
            self._reqs[rid].tokens.append(token_id)
            self._reqs[rid].num_inputs += 1
            self.policy.feed(rid)
        return outputs

    def _forward(self, plan: StepPlan, spans: Sequence[RowSpan], x: torch.Tensor, has_tasks: bool,
                 graphed: bool, keep: torch.Tensor | None) -> torch.Tensor:
        """The slice's layers over the step's rows (``keep``: only those rows are returned)."""
        if graphed:   # a plain decode step: its graph (or static buffers) in decode-row order
            out = self.graphs.run(x, plan.decode_positions,
                                  [self.blocks.block_table(rid) for rid in plan.decode_ids])
            return out if keep is None else out[keep]
        batch = build_step_batch(spans, len(plan.decode_ids), self.blocks,
                                 {s.request_id: self._reqs[s.request_id].enter_offset for s in spans},
                                 self.weights.end - self.weights.start, self.device, self.dtype,
                                 self.attention)
        # Every task's rows run the shared base product together; each task's terms run on its rows.
        batch.tasks = task_rows([(self._reqs[s.request_id].adapter, s.end - s.start) for s in spans],
                                self.device, self._stacks) if has_tasks else None
        return self.model.forward(x, batch, keep)

    def release(self, request_ids: Sequence[Hashable]) -> None:
        for rid in request_ids:
            self.policy.finish(rid)
            self._forget(rid)
            self._compiling.pop(rid, None)
        if self._held or self._task_held:
            gone = set(request_ids)
            self._held = [i for i in self._held if i.request_id not in gone]
            self._task_held = [i for i in self._task_held if i.request_id not in gone]

    def _task_of(self, rid: Hashable) -> str | None:
        adapter = self._reqs[rid].adapter
        return None if adapter is None else adapter.name

    def _forget(self, rid: Hashable) -> None:
        req = self._reqs.pop(rid, None)
        if req is not None and req.adapter is not None:
            self.adapters.release(req.adapter.name)

    def has_work(self) -> bool:
        return (self.policy.has_ready()
                or any(f.done() for f in self._compiling.values())
                or any(i.new_request is not None and self.adapters.may_fit(i.new_request.adapter)
                       for i in self._task_held))

    # --- tasks made ready from disk -----------------------------------------------------------------
    def _hold_for_tasks(self, inputs: Sequence[StageInput]) -> list[StageInput]:
        """The inputs to accept now. A new request of a registered task is admitted only once its
        task is ready in the adapter cache and pinned there (read from disk on a miss, here, before
        the step runs); when the tasks pinned by requests in flight leave no room, it waits here
        with its later inputs, in arrival order, until requests end (never a step without its
        task's terms)."""
        if not self._task_held and not any(i.new_request is not None and i.new_request.adapter is not None
                                           for i in inputs):
            return list(inputs)
        ready, held, waiting = [], [], set()
        for item in [*self._task_held, *inputs]:
            rid, new = item.request_id, item.new_request
            if rid in waiting:
                held.append(item)
                continue
            if new is not None and isinstance(new.adapter, str) and rid not in self._pinned:
                try:
                    self._pinned[rid] = self.adapters.acquire(new.adapter,
                                                              draining_ok=not self.weights.is_first)
                except NoRoom:
                    waiting.add(rid)
                    held.append(item)
                    continue
                except Exception:   # unknown task, bad files: refused with this error by _admit
                    pass
            ready.append(item)
        self._task_held = held
        return ready

    # --- structured output --------------------------------------------------------------------------
    def _hold_for_guides(self, inputs: Sequence[StageInput]) -> list[StageInput]:
        """The inputs to accept now: held ones whose automaton is ready (in arrival order), then new
        ones; a guided request's inputs wait (here, not in the step) while its regex compiles, and a
        regex that does not compile fails the request."""
        if not self.weights.is_last or not (self._held or any(
                i.new_request is not None and i.new_request.sampling.guided_regex for i in inputs)):
            return list(inputs)
        ready, held, broken = [], [], {}
        for item in [*self._held, *inputs]:
            rid, new = item.request_id, item.new_request
            fut = self._compiling.get(rid)
            if fut is None and new is not None and new.sampling.guided_regex is not None:
                if self.guides is None:
                    broken[rid] = "structured output is not available on this engine (no checkpoint)"
                    continue
                fut = self._compiling[rid] = self.guides.compile(new.sampling.guided_regex)
            if rid in broken:
                continue
            if fut is not None and not fut.done():
                held.append(item)
            elif fut is not None and fut.exception() is not None:
                broken[rid] = _describe(fut.exception())
            else:
                ready.append(item)
        self._held = held
        if broken:
            ready = [i for i in ready if i.request_id not in broken]
            for rid, message in broken.items():
                self._fail([rid], message)
        return ready

    def _new_guide(self, new: NewRequest) -> Guide:
        """The automaton of a guided request, walked through the tokens an earlier pipeline
        generated (``guided_resume_tokens``, the end of its prompt) when it was moved here."""
        compiled = self._compiling.pop(new.request_id, None)   # done: _hold_for_guides saw to it
        if compiled is None or not compiled.done():
            raise RuntimeError(f"request {new.request_id!r}: admitted before its automaton compiled")
        guide = Guide(compiled.result())
        resume = new.sampling.guided_resume_tokens
        for token_id in (new.prompt_token_ids[-resume:] if resume else ()):
            guide.advance(token_id)
        return guide

    # --- inputs -----------------------------------------------------------------------------------
    def _accept(self, item: StageInput) -> None:
        rid = item.request_id
        if item.new_request is not None:
            self._admit(item.new_request)
        req = self._reqs.get(rid)
        if req is None:
            raise ValueError(f"input for unknown request {rid!r} without new_request")
        if item.start_position != req.num_inputs:
            raise ValueError(f"request {rid!r}: input starts at position {item.start_position}, "
                             f"expected {req.num_inputs}")
        if self.weights.is_first:
            if item.token_ids is None:
                raise ValueError(f"request {rid!r}: the first stage needs token ids")
            self._check_token_ids("token ids", item.token_ids)
            req.tokens.extend(item.token_ids)
        else:
            if item.hidden_states is None:
                raise ValueError(f"request {rid!r}: a later stage needs hidden states")
            shape, hidden = tuple(item.hidden_states.shape), self.weights.spec.hidden_size
            if len(shape) != 2 or shape[1] != hidden:   # would fail the whole step's matmul
                raise ValueError(f"request {rid!r}: hidden states of shape {list(shape)}, expected "
                                 f"[num_tokens, {hidden}]")
            req.hidden.append(item.hidden_states.to(self.device, self.dtype))
            req.hidden_starts.append(req.num_inputs)
        req.num_inputs += item.num_tokens
        self.policy.feed(rid, item.num_tokens)

    def _admit(self, new: NewRequest) -> None:
        adapter = self._pinned.pop(new.request_id, None)   # its task, acquired by _hold_for_tasks
        try:
            if adapter is None and new.adapter is not None:
                if not isinstance(new.adapter, str):
                    raise HelixUserError(f"request {new.request_id!r}: adapter must be a name, "
                                         f"got {new.adapter!r}")
                # Unknown, or draining on the first stage: refused here.
                adapter = self.adapters.acquire(new.adapter, draining_ok=not self.weights.is_first)
            self._reqs[new.request_id] = self._new_request(new, adapter)
        except Exception:
            if adapter is not None:
                self.adapters.release(adapter.name)
            raise

    def _new_request(self, new: NewRequest, adapter: SliceAdapter | None) -> _Request:
        w = self.weights
        enter = w.start if new.enter_layer is None else new.enter_layer
        if not w.start <= enter < w.end:
            raise HelixUserError(f"request {new.request_id!r}: enter layer {enter} is outside this "
                                 f"slice [{w.start}, {w.end})")
        if enter != w.start and w.is_first:
            raise HelixUserError(f"request {new.request_id!r}: the first stage cannot skip layers")
        if new.sampling.max_tokens is None:   # the coordinator resolves it before dispatch
            raise HelixUserError(f"request {new.request_id!r}: max_tokens is not set")
        req = _Request(new, enter - w.start, adapter=adapter)
        self._admit_checked(new, req)
        return req

    def _admit_checked(self, new: NewRequest, req: _Request) -> None:
        w = self.weights
        if w.is_last:
            # What the sampler indexes by token id must lie in the vocabulary (it would raise inside
            # a step shared with other requests).
            self._check_token_ids("stop_token_ids", new.sampling.stop_token_ids)
            self._check_token_ids("logit_bias token ids", [t for t, _ in new.sampling.logit_bias])
            self._check_token_ids("prompt token ids", new.prompt_token_ids)
            if (new.sampling.logprobs or 0) > w.spec.vocab_size:
                raise HelixUserError(f"logprobs={new.sampling.logprobs} exceeds the vocabulary "
                                     f"({w.spec.vocab_size} tokens)")
            req.sampling = self.sampler.new_state(new.sampling, new.prompt_token_ids)
            if new.sampling.prompt_logprobs is not None:
                if len(new.prompt_token_ids) != new.num_prompt_tokens:
                    raise HelixUserError(f"request {new.request_id!r}: prompt_logprobs needs the "
                                         f"prompt's token ids")
                req.prompt_lps = []
            if new.sampling.guided_regex is not None:
                req.sampling.guide = self._new_guide(new)
            req.next_emit = new.num_prompt_tokens - 1   # positions before the prompt's last sample nothing
        self.policy.add(new.request_id, new.num_prompt_tokens, new.sampling.max_tokens,
                        num_available_tokens=0)

    def _check_token_ids(self, what: str, ids: Sequence[int]) -> None:
        vocab = self.weights.spec.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            bad = [t for t in ids if not 0 <= t < vocab]
            raise HelixUserError(f"{what} {bad[:5]} outside the vocabulary [0, {vocab})")

    def _inputs(self, spans: Sequence[RowSpan]) -> torch.Tensor:
        """The step's input matrix ``[num_tokens, hidden]``."""
        if self.weights.is_first:
            ids = [t for s in spans for t in self._reqs[s.request_id].tokens[s.start:s.end]]
            return self.model.embed(torch.tensor(ids, device=self.device))
        return torch.cat([_hidden_rows(self._reqs[s.request_id], s.start, s.end) for s in spans])

    # --- outputs ----------------------------------------------------------------------------------
    def _outputs(self, spans: Sequence[RowSpan], x: torch.Tensor) -> list[StageOutput]:
        """Hidden states for never-emitted positions (stages before the last)."""
        outs = []
        for s in spans:
            req = self._reqs[s.request_id]
            first = max(s.start, req.next_emit)
            if first < s.end:
                rows = x[s.row_start + first - s.start:s.row_start + s.end - s.start]
                outs.append(StageOutput(s.request_id, first, hidden_states=rows.clone(),
                                        new_request=req.new if first == 0 else None))
                req.next_emit = s.end
        return outs

    def _prompt_rows(self, spans: Sequence[RowSpan]) -> list[tuple[RowSpan, int, int]]:
        """(span, first, end): positions ``[first, end)`` of the span whose logits score the prompt
        token after them, for requests that asked for prompt logprobs, each position once (a
        recompute after preemption scores nothing again)."""
        out = []
        for s in spans:
            req = self._reqs[s.request_id]
            if req.prompt_lps is None:
                continue
            first, end = max(s.start, len(req.prompt_lps)), min(s.end, req.new.num_prompt_tokens - 1)
            if first < end:
                out.append((s, first, end))
        return out

    def _score_prompts(self, scored: Sequence[tuple[RowSpan, int, int]], x: torch.Tensor) -> None:
        """vLLM's prompt logprobs: the raw ``log_softmax`` at position ``p`` scores prompt token
        ``p + 1`` (and gives the top ``prompt_logprobs``); ``x`` holds the rows in ``scored`` order."""
        logprobs = torch.log_softmax(self.model.logits(x), dim=-1)   # [rows, vocab]
        at = 0
        for s, first, end in scored:
            req = self._reqs[s.request_id]
            block, at = logprobs[at:at + end - first], at + end - first
            target = torch.tensor(req.new.prompt_token_ids[first + 1:end + 1], dtype=torch.long,
                                  device=block.device)
            values = block.gather(1, target[:, None])[:, 0].tolist()
            k = min(req.new.sampling.prompt_logprobs, block.shape[-1])
            tops = [()] * len(values)
            if k:
                top_vals, top_ids = block.topk(k, dim=-1)
                tops = [tuple(zip(i, v)) for i, v in zip(top_ids.tolist(), top_vals.tolist())]
            req.prompt_lps.extend(SampledToken(t, v, top) for t, v, top in
                                  zip(target.tolist(), values, tops))

    def _sample(self, chosen: Sequence[RowSpan], x: torch.Tensor):
        """Sample the last row of each ``chosen`` span; ``x`` holds exactly those rows, in order."""
        if not chosen:
            return [], [], []
        logits = self.model.logits(x)
        states = [self._reqs[s.request_id].sampling for s in chosen]
        tokens = self.sampler.sample(logits, states)
        outs, finished, fed_back = [], [], []
        for s, st, tok in zip(chosen, states, tokens):
            req = self._reqs[s.request_id]
            st.output_token_ids.append(tok.token_id)
            if st.guide is not None:
                st.guide.advance(tok.token_id)
            req.next_emit = s.end
            reason = self._finish_reason(st, tok.token_id)
            first = len(st.output_token_ids) == 1
            outs.append(StageOutput(s.request_id, s.end, token=tok, finish_reason=reason,
                                    new_request=req.new if first else None,
                                    prompt_logprobs=tuple(req.prompt_lps or ()) if first else ()))
            if reason is not None:
                finished.append(s.request_id)
            elif self.weights.is_first:
                fed_back.append((s.request_id, tok.token_id))
        return outs, finished, fed_back

    def _finish_reason(self, st: SamplingState, token_id: int) -> str | None:
        p = st.params
        if len(st.output_token_ids) >= p.min_tokens:
            if token_id in p.stop_token_ids:
                return "stop"
            if not p.ignore_eos and token_id in self.sampler.eos_token_ids:
                return "stop"
        if st.guide is not None and st.guide.finished:
            return "stop"   # the reply matches its format and nothing may follow
        if len(st.output_token_ids) >= p.max_tokens:
            return "length"
        return None


def _graph_mode(requested: str, backend: str, device: torch.device) -> str:
    """``on`` (capture), ``eager`` (static buffers, no capture) or ``off``."""
    if requested not in ("auto", "on", "eager", "off"):
        raise HelixUserError(f"decode_graphs must be auto, on, eager or off, got {requested!r}")
    can_capture = device.type == "cuda" and backend == "triton"
    if requested == "auto":
        return "on" if can_capture else "off"
    if requested == "on" and not can_capture:
        raise HelixUserError(f"decode graphs need CUDA and the triton attention backend "
                             f"(device {device}, backend {backend})")
    if requested == "eager" and backend == "gather":
        raise HelixUserError("decode_graphs 'eager' needs a paged attention backend (triton or native)")
    return requested


def _hidden_rows(req: _Request, start: int, end: int) -> torch.Tensor:
    """Rows ``[start, end)`` of a request's hidden-state inputs. A step mostly reads within one
    arrival (a decode's row, a prefill chunk): a view, whatever the request's length. A read across
    arrivals (a chunk over several, a recompute after preemption) joins just those into one piece.
    (Joining the whole history at every decode, as before, copied O(context) rows per token: 40 ms
    a step for 64 decodes at context 1024, hidden 512.)"""
    i = bisect.bisect_right(req.hidden_starts, start) - 1
    j = bisect.bisect_right(req.hidden_starts, end - 1) - 1   # the arrival holding the last row
    if j > i:
        req.hidden[i:j + 1] = [torch.cat(req.hidden[i:j + 1])]
        del req.hidden_starts[i + 1:j + 1]
    first = req.hidden_starts[i]
    return req.hidden[i][start - first:end - first]


def _describe(exc: Exception) -> str:
    """One line for the client: a user error's message marked as such (:data:`USER_FAILURE`),
    anything else with its type."""
    return USER_FAILURE + str(exc) if isinstance(exc, HelixUserError) else f"{type(exc).__name__}: {exc}"
