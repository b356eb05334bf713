"""Measure the worker engine's one-layer step times on this machine: what ``helix profile`` runs.

The planner's cost model and the simulator charge a step ``k x layer_time(P, D, context)`` on a node
holding ``k`` layers. This module measures that function for the engine ``helix serve`` runs
(:class:`~worker.engine.SliceEngine`: the same step policy, paged KV cache, batching and kernels), on
the local device, so a cluster can be planned with its own figures instead of the roofline.

How a figure is taken:

- an engine of random weights with the model's shapes (times depend on shapes and dtype, not on
  the values) holding ``layers`` middle layers (hidden states in, hidden states out: no embedding,
  LM head or sampling, which are not per-layer costs);
- a *prompt* point ``(tokens, length)``: ``tokens / length`` fresh requests of ``length`` prompt tokens
  each, computed in one step; a *decode* point ``(seqs, context)``: ``seqs`` requests whose KV holds
  ``context`` tokens each decode one token (the least advanced of a prefilled set, so contexts stay
  within a few tokens of the nominal one);
- each step is timed whole and, inside it, the model run over the layers (CUDA: synchronised):
  one layer costs the model run over ``layers``, and the rest of the step (the step policy,
  building the batch's positions and block tables, moving inputs and outputs) is the step's fixed
  cost, reported apart. Each is the fastest of ``reps`` steps after a warm-up (other processes only
  ever slow a step down).

The figures are written by :func:`helix.core.profiles.write_profile` in the format
``performance.profiles`` reads.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from helix.core.errors import HelixUserError
from helix.core.models import ModelSpec
from helix.net.io_types import NewRequest, StageInput
from helix.net.sampling import SamplingParams
from helix.core.profiles import ProfileRow
from helix.core.serving import ServingSpec
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig, torch_dtype
from worker.kv_blocks import blocks_for_tokens
from worker.model import LayerWeights, SliceWeights

_BLOCK_TOKENS = ServingSpec().block_size_tokens   # as a served worker's pool


@dataclass(frozen=True)
class ProfileGrid:
    """Where the step times are measured."""

    prompt_lengths: tuple[int, ...]
    """Prompt tokens per request (the prompt table's context column)."""
    max_prompt_tokens: int
    """Prompt tokens of one step: requests of one length are batched 1, 2, 4, ... up to this."""
    decode_contexts: tuple[int, ...]
    """Tokens of KV each decoding request holds (the decode table's context column)."""
    decode_seqs: tuple[int, ...]
    """Decoding requests in one step."""
    reps: int = 5
    """Timed steps per point and engine (after one warm-up); the fastest counts."""
    layers: int = 4
    """Layers the measured engine holds (its model run over them is one layer's time)."""

    @classmethod
    def quick(cls) -> "ProfileGrid":
        """Seconds, for tests: two lengths, two batch sizes, two reps."""
        return cls((16, 64), 128, (16, 64), (1, 4), reps=2, layers=2)

    @classmethod
    def default(cls, device: str) -> "ProfileGrid":
        """A useful grid: a few minutes on a CPU for a small model, on a GPU for a large one."""
        if device == "cpu":
            # 3 too: on one thread a 2- or 3-row decode step costs more than a 4-row one (MKL).
            return cls((64, 256, 1024), 2048, (128, 512, 1024), (1, 2, 3, 4, 8, 16, 32, 64))
        return cls((128, 512, 2048), 8192, (256, 1024, 2048),
                   (1, 2, 4, 8, 16, 32, 64, 128, 256))

    @property
    def decode_advance(self) -> int:
        """Most tokens a held request decodes past its context: each decode point's warm-up and
        reps go to the least advanced requests, spread over the largest batch."""
        if not self.decode_seqs:
            return 0
        return -(-(self.reps + 1) * sum(self.decode_seqs) // max(self.decode_seqs)) + 1

    def fit_to(self, max_positions: int) -> "ProfileGrid":
        """Lengths and contexts cut to what the model's position table holds (decodes advance a
        few tokens past their context)."""
        room = max_positions - self.decode_advance
        prompt = sorted({min(n, max_positions) for n in self.prompt_lengths})
        contexts = sorted({min(c, room) for c in self.decode_contexts if min(c, room) > 0})
        return dataclasses.replace(self, prompt_lengths=tuple(prompt), decode_contexts=tuple(contexts))

    def prompt_points(self) -> list[tuple[int, int]]:
        """(requests, length) of every prompt point."""
        points = []
        for length in self.prompt_lengths:
            n = 1
            while n * length <= max(self.max_prompt_tokens, length):
                points.append((n, length))
                n *= 2
        return points

    def decode_points(self) -> list[tuple[int, int]]:
        """(seqs, context) of every decode point."""
        return [(d, c) for c in self.decode_contexts for d in self.decode_seqs]

    @property
    def num_points(self) -> int:
        return len(self.prompt_points()) + len(self.decode_points())

    @property
    def max_seqs(self) -> int:
        """Most requests in one measured step."""
        return max([*self.decode_seqs, *(n for n, _ in self.prompt_points())], default=1)

    @property
    def step_tokens(self) -> int:
        """Most tokens in one measured step."""
        return max(self.max_prompt_tokens, *self.prompt_lengths, 1)

    @property
    def kv_blocks(self) -> int:
        """KV blocks the measured engine needs: the largest prompt step, or the held decodes."""
        per_seq = blocks_for_tokens(max(self.decode_contexts, default=0) + self.decode_advance,
                                    _BLOCK_TOKENS)
        return max(blocks_for_tokens(self.step_tokens, _BLOCK_TOKENS) + self.max_seqs,
                   per_seq * max(self.decode_seqs, default=0), 1)

    def bytes_needed(self, spec: ModelSpec, dtype_bytes: int, packed_weights: bool) -> float:
        """Memory the measured engine takes: weights (twice when packed for MKL), the KV pool, and
        the largest step's activations (a generous ``16 x hidden + 4 x intermediate`` per token)."""
        weights = spec.layer_bytes(dtype_bytes) * (2 if packed_weights else 1)
        kv = self.kv_blocks * _BLOCK_TOKENS * spec.kv_bytes_per_token_per_layer(dtype_bytes)
        acts = self.step_tokens * (16 * spec.hidden_size + 4 * spec.intermediate_size) * 4
        return self.layers * (weights + kv) + acts

    def fit_memory(self, spec: ModelSpec, dtype_bytes: int, packed_weights: bool,
                   free_bytes: float) -> "ProfileGrid":
        """The grid with as many layers (at most ``layers``) as fit in 90 % of ``free_bytes``;
        HelixUserError when not even one does."""
        for n in range(self.layers, 0, -1):
            grid = dataclasses.replace(self, layers=n)
            if grid.bytes_needed(spec, dtype_bytes, packed_weights) <= 0.9 * free_bytes:
                return grid
        one = dataclasses.replace(self, layers=1).bytes_needed(spec, dtype_bytes, packed_weights)
        raise HelixUserError(f"profiling {spec.name!r} on this grid takes {one / 2**30:.1f} GiB for "
                             f"one layer (weights, {max(self.decode_seqs, default=0)} sequences' KV "
                             f"at context {max(self.decode_contexts, default=0)}, activations) but "
                             f"{free_bytes / 2**30:.1f} GiB are free: lower --seqs, --contexts or "
                             f"--max-prompt-tokens")


@dataclass(frozen=True)
class ProfileResult:
    """Measured one-layer times and fixed step costs (seconds)."""

    prompt: tuple[ProfileRow, ...]
    decode: tuple[ProfileRow, ...]
    prompt_overhead: tuple[ProfileRow, ...]
    decode_overhead: tuple[ProfileRow, ...]
    last_prompt_overhead: tuple[ProfileRow, ...] = ()
    """The fixed cost of a last stage's step (it also embeds, when first, and runs the final norm,
    the LM head and sampling for each sequence it samples), by prompt tokens and length."""
    last_decode_overhead: tuple[ProfileRow, ...] = ()
    """The same by decoding sequences and context."""


def random_slice(spec: ModelSpec, num_layers: int, dtype: torch.dtype, device: torch.device,
                 seed: int = 0) -> SliceWeights:
    """``num_layers`` middle layers of ``spec``'s shapes with random weights (scaled like a
    trained model's, so activations stay in range)."""
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    gen = torch.Generator().manual_seed(seed)

    def mat(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen) * cols ** -0.5).to(device, dtype)

    def layer() -> LayerWeights:
        return LayerWeights(qkv=mat((spec.num_heads + 2 * spec.num_kv_heads) * d, h),
                            o=mat(h, spec.num_heads * d), gate_up=mat(2 * inter, h), down=mat(h, inter),
                            input_norm=torch.ones(h, dtype=dtype, device=device),
                            post_norm=torch.ones(h, dtype=dtype, device=device))
    # Two spare layers around the slice keep it a middle one, whatever the model's depth.
    deep = dataclasses.replace(spec, num_layers=max(spec.num_layers, num_layers + 2))
    return SliceWeights(deep, 1, 1 + num_layers, [layer() for _ in range(num_layers)])


def random_model(spec: ModelSpec, num_layers: int, dtype: torch.dtype, device: torch.device,
                 seed: int = 1) -> SliceWeights:
    """A whole model of ``spec``'s shapes with ``num_layers`` random layers: a slice that is the
    first and the last stage at once (embedding, final norm, LM head), as a worker serving a whole
    replica runs."""
    middle = random_slice(spec, num_layers, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    h, vocab = spec.hidden_size, spec.vocab_size

    def mat() -> torch.Tensor:
        return (torch.randn(vocab, h, generator=gen) * h ** -0.5).to(device, dtype)
    whole = dataclasses.replace(spec, num_layers=num_layers)
    return SliceWeights(whole, 0, num_layers, middle.layers, embed=mat(),
                        final_norm=torch.ones(h, dtype=dtype, device=device), lm_head=mat())


class _Timer:
    """One engine and the requests it holds, driven with hidden-state inputs. Its model's
    ``forward`` (the layers) is timed inside each step, so a step splits into layers and the rest."""

    def __init__(self, weights: SliceWeights, grid: ProfileGrid, device: torch.device,
                 dtype: str, kv_blocks: int | None = None) -> None:
        config = EngineConfig(block_size_tokens=_BLOCK_TOKENS,
                              num_kv_blocks=kv_blocks or grid.kv_blocks,
                              max_num_seqs=grid.max_seqs, max_num_batched_tokens=grid.step_tokens,
                              chunked_prefill=True, dtype=dtype, device=str(device),
                              pack_cpu_weights=True)
        self.engine = SliceEngine(weights, config)
        self.device = device
        self.hidden = weights.spec.hidden_size
        self._ids = itertools.count()
        self._held: list[list] = []
        self._forward_s = 0.0
        self._depth = 0
        model = self.engine.model
        model.forward = self._timed(model.forward)   # this engine's instances only
        if self.engine.graphs is not None:   # plain decode steps replay a graph instead
            self.engine.graphs.run = self._timed(self.engine.graphs.run)

    def _timed(self, fn: Callable) -> Callable:
        """``fn`` with its time added to the step's layer time (the outermost timed call only:
        a graph's eager warm-up runs the model inside it; nothing is timed while a graph is
        being captured, when no kernel runs)."""
        def timed(*args, **kwargs):
            if self._depth or (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
                return fn(*args, **kwargs)
            self._depth += 1
            try:
                self._sync()
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                self._sync()
                self._forward_s += time.perf_counter() - t0
            finally:
                self._depth -= 1
            return out
        return timed

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _states(self, n: int) -> torch.Tensor:
        return torch.randn(n, self.hidden, device=self.device, dtype=self.engine.dtype)

    def _new(self, length: int, max_tokens: int) -> StageInput:
        rid = next(self._ids)
        if self.engine.weights.is_first:   # token ids in; sampled to the end, whatever they are
            ids = tuple(int(t) for t in torch.randint(self.engine.weights.spec.vocab_size, (length,)))
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            return StageInput(rid, 0, token_ids=ids, new_request=NewRequest(rid, length, params, ids))
        return StageInput(rid, 0, hidden_states=self._states(length),
                          new_request=NewRequest(rid, length, SamplingParams(max_tokens=max_tokens)))

    def _timed_step(self, inputs: list[StageInput]) -> tuple[float, float]:
        """(the whole step, its layers) in seconds."""
        self._forward_s = 0.0
        self._sync()
        t0 = time.perf_counter()
        self.engine.step(inputs)
        self._sync()
        return time.perf_counter() - t0, self._forward_s

    def prompt_step(self, n: int, length: int) -> tuple[float, float]:
        """One step that computes ``n`` fresh prompts of ``length`` tokens."""
        inputs = [self._new(length, 1) for _ in range(n)]
        times = self._timed_step(inputs)
        self._check(prefill_tokens=n * length)
        self.engine.release([i.request_id for i in inputs])
        return times

    def prefill(self, seqs: int, context: int, max_tokens: int) -> None:
        """Hold ``seqs`` requests with ``context`` tokens of KV each."""
        self.release_all()
        inputs = [self._new(context, max_tokens) for _ in range(seqs)]
        self.engine.step(inputs)
        while self.engine.has_work():
            self.engine.step()
        self._held = [[context, i.request_id] for i in inputs]   # [position, request id]

    def decode_step(self, seqs: int) -> tuple[float, float]:
        """One step in which the ``seqs`` least advanced held requests decode."""
        self._held.sort()
        chosen = self._held[:seqs]
        times = self._timed_step([StageInput(rid, pos, hidden_states=self._states(1))
                                  for pos, rid in chosen])
        self._check(decodes=seqs)
        for pair in chosen:
            pair[0] += 1
        return times

    def release_all(self) -> None:
        self.engine.release([rid for _, rid in self._held])
        self._held = []

    def _check(self, prefill_tokens: int = 0, decodes: int = 0) -> None:
        plan = self.engine.last_plan
        got = (sum(c.num_tokens for c in plan.prefill_chunks), len(plan.decode_ids))
        if got != (prefill_tokens, decodes) or self.engine.take_failures():
            raise RuntimeError(f"profile step ran {got} (prefill tokens, decodes), expected "
                               f"{(prefill_tokens, decodes)}: a bug in the profiler's setup")


class _WholeTimer(_Timer):
    """A whole-model engine (:func:`random_model`): it samples and feeds its tokens back itself,
    so every request it holds decodes in every step; a decode point holds exactly its sequences."""

    def hold(self, seqs: int, context: int, max_tokens: int) -> None:
        """Hold ``seqs`` requests whose prompts of ``context`` tokens are computed."""
        self.release_all()
        inputs = [self._new(context, max_tokens) for _ in range(seqs)]
        self.engine.step(inputs)
        policy = self.engine.policy
        while any(policy.num_computed(i.request_id) < context for i in inputs):
            self.engine.step()   # the prompts' chunks (the first ones decode meanwhile)
        self._held = [[context, i.request_id] for i in inputs]

    def keep(self, seqs: int) -> None:
        """Release held requests until ``seqs`` remain."""
        gone = self._held[seqs:]
        self.engine.release([rid for _, rid in gone])
        self._held = self._held[:seqs]

    def decode_step(self, seqs: int) -> tuple[float, float]:
        times = self._timed_step([])
        self._check(decodes=seqs)
        return times


def _time(run: Callable[[], tuple[float, float]], reps: int, layers: int) -> tuple[float, float]:
    """(one layer, the step's fixed cost) in seconds: the fastest of ``reps`` runs after a warm-up,
    each part on its own (other processes only ever slow a run down)."""
    run()
    runs = [run() for _ in range(reps)]
    return min(f for _, f in runs) / layers, max(0.0, min(s - f for s, f in runs))


def free_memory_bytes(device: str) -> float | None:
    """What a profile may take on ``device``: the GPU's free memory, or the machine's available
    memory (Linux ``MemAvailable``); None when unknown."""
    if device.startswith("cuda"):
        return float(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def measure(spec: ModelSpec, grid: ProfileGrid, device: str, dtype: str,
            advance: Callable[[str], None] = lambda _what: None) -> ProfileResult:
    """Measure every point of ``grid`` (``advance`` is called once per point, for a progress bar)."""
    dev = torch.device(device)
    timer = _Timer(random_slice(spec, grid.layers, torch_dtype(dtype), dev), grid, dev, dtype)
    prompt, prompt_fixed, decode, decode_fixed = [], [], [], []
    for n, length in grid.prompt_points():
        layer_s, fixed_s = _time(lambda: timer.prompt_step(n, length), grid.reps, grid.layers)
        prompt.append(ProfileRow(n * length, length, layer_s))
        prompt_fixed.append(ProfileRow(n * length, length, fixed_s))
        advance(f"prompt {n} x {length} tokens")
    max_seqs = max(grid.decode_seqs, default=0)
    for context in grid.decode_contexts:
        timer.prefill(max_seqs, context, max_tokens=grid.decode_advance)
        for seqs in grid.decode_seqs:
            layer_s, fixed_s = _time(lambda: timer.decode_step(seqs), grid.reps, grid.layers)
            decode.append(ProfileRow(seqs, context, layer_s))
            decode_fixed.append(ProfileRow(seqs, context, fixed_s))
            advance(f"decode {seqs} seqs at context {context}")
        timer.release_all()
    del timer   # its engine (weights, KV pool) goes before the next one is built
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    last_prompt, last_decode = measure_last_stage(spec, grid, dev, dtype, advance)
    return ProfileResult(tuple(prompt), tuple(decode), tuple(prompt_fixed), tuple(decode_fixed),
                         last_prompt, last_decode)


def measure_last_stage(spec: ModelSpec, grid: ProfileGrid, dev: torch.device, dtype: str,
                       advance: Callable[[str], None] = lambda _what: None
                       ) -> tuple[tuple[ProfileRow, ...], tuple[ProfileRow, ...]]:
    """The fixed step cost (apart from the layers) of a whole-model engine of one layer at every
    point of ``grid``: what a worker that is its pipeline's last stage pays per step beyond a
    middle stage's cost (sampling, LM head; and embedding when it is also the first stage).
    Decode points of one context share one prefill: the sequences are released, largest batch
    first, down to each point's count."""
    # Tokens a held request samples: one in every timed step, and one per step of the prompts.
    steps = (grid.reps + 1) * len(grid.decode_seqs) + 2 + \
        max(grid.decode_seqs, default=0) * max(grid.decode_contexts, default=0) // grid.step_tokens
    per_seq = blocks_for_tokens(max(grid.decode_contexts, default=0) + steps + 1, _BLOCK_TOKENS)
    blocks = max(grid.kv_blocks, per_seq * max(grid.decode_seqs, default=0))
    timer = _WholeTimer(random_model(spec, 1, torch_dtype(dtype), dev), grid, dev, dtype, blocks)
    prompt = []
    for n, length in grid.prompt_points():
        _, fixed_s = _time(lambda: timer.prompt_step(n, length), grid.reps, 1)
        prompt.append(ProfileRow(n * length, length, fixed_s))
    advance("last stage: prompt steps")
    decode = []
    for context in grid.decode_contexts:
        ctx = min(context, spec.max_position_embeddings - steps - 1)
        timer.hold(max(grid.decode_seqs), ctx, max_tokens=steps + 1)
        for seqs in sorted(grid.decode_seqs, reverse=True):
            timer.keep(seqs)
            _, fixed_s = _time(lambda: timer.decode_step(seqs), grid.reps, 1)
            decode.append(ProfileRow(seqs, context, fixed_s))
        timer.release_all()
    advance("last stage: decode steps")
    return tuple(prompt), tuple(sorted(decode, key=lambda r: (r.context, r.batch)))
