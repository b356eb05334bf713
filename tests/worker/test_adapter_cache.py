"""Registered tasks made ready from disk into an LRU cache with a byte budget (beyond PetS).

The cache's order and budget on its own; then an engine whose tasks stay on disk against one that
holds the same tasks in memory: the same greedy tokens and logprobs (float32) for batches that mix
tasks already ready (hits), tasks read on demand (misses) and requests that wait for room, with the
budget never passed; bad files fail only the requests of their task, with an error naming the tensor.
"""

from __future__ import annotations

import pytest
import torch

from helix.core.errors import USER_FAILURE, HelixUserError
from helix.net.sampling import SamplingParams
from tests.builders.adapters import random_task, write_task
from worker.adapter_cache import AdapterCache, NoRoom
from worker.adapters import SliceAdapter
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _put(cache: AdapterCache, name: str, nbytes: int) -> None:
    cache.put(SliceAdapter(name, "lora", {}), nbytes, load_s=0.01)


def test_lru_order_and_byte_budget():
    cache = AdapterCache(100)
    for name, nbytes in (("a", 40), ("b", 30), ("c", 20)):
        _put(cache, name, nbytes)
    assert cache.get("a") is not None            # a is now the most recently used
    _put(cache, "d", 30)                          # 120 > 100: the least recently used (b) goes
    assert cache.names() == ["c", "a", "d"] and cache.bytes_cached == 90
    _put(cache, "e", 10)                          # fits: nothing evicted
    assert cache.names() == ["c", "a", "d", "e"] and cache.bytes_cached == 100
    _put(cache, "f", 35)                          # c (20) then a (40) go
    assert cache.names() == ["d", "e", "f"] and cache.bytes_cached == 75
    s = cache.stats()
    assert (s.hits, s.misses, s.evictions, s.bytes_cached, s.num_cached) == (1, 6, 3, 75, 3)
    assert s.load_s_p50 == s.load_s_p99 == 0.01


def test_pinned_tasks_are_never_evicted():
    cache = AdapterCache(100)
    for name in ("a", "b", "c"):
        _put(cache, name, 30)
    cache.pin("a")                                # a request of a is in flight
    cache.pin("a")
    _put(cache, "d", 30)                          # the LRU unpinned one (b) goes, not a
    assert cache.names() == ["a", "c", "d"]
    cache.pin("c")
    cache.pin("d")
    with pytest.raises(NoRoom):                   # 90 pinned: no room for 30 now; nothing evicted
        _put(cache, "e", 30)
    assert cache.names() == ["a", "c", "d"] and cache.stats().num_pinned == 3
    cache.unpin("a")
    with pytest.raises(NoRoom):                   # a still has a request
        _put(cache, "e", 30)
    cache.unpin("a")
    _put(cache, "e", 30)
    assert cache.names() == ["c", "d", "e"]
    with pytest.raises(HelixUserError, match=r"adapter 'big' holds 0.00 MiB on this worker's layers, "
                                             r"over its adapter cache budget adapter_cache_bytes=100"):
        _put(cache, "big", 101)                   # bigger than the whole budget: never fits


@pytest.fixture(scope="module")
def lora_tasks(tiny_ckpt, tmp_path_factory):
    """Five LoRA tasks (same size) and a bottleneck task, in Helix's format."""
    _, model = tiny_ckpt
    root = tmp_path_factory.mktemp("cached_tasks")
    out = {f"t{k}": write_task(root / f"t{k}", "lora", random_task(model, "lora", ALL, 10 + k), scale=0.5)
           for k in range(5)}
    out["bn"] = write_task(root / "bn", "bottleneck", random_task(model, "bottleneck", ("o_proj",), 20))
    return out


def _engine(ckpt, **cfg) -> SliceEngine:
    return SliceEngine.from_checkpoint(ckpt, 0, 8, EngineConfig(eos_token_ids=(2,), max_num_batched_tokens=96,
                                                                **cfg))


def _batch(prompts, tasks, tag):
    sp = SamplingParams(temperature=0, max_tokens=5, logprobs=2, ignore_eos=True)
    return [Prompt(f"{tag}{i}", tuple(prompts[(i * 5 + len(tag)) % len(prompts)]), sp, adapter=t)
            for i, t in enumerate(tasks)]


def test_cached_tasks_equal_tasks_held_in_memory(tiny_ckpt, prompts, lora_tasks):
    ckpt, _ = tiny_ckpt
    held = _engine(ckpt)
    held._stacks = lambda adapters: None          # the reference adds each task's terms on its own
    for name, folder in lora_tasks.items():
        held.adapters.load(name, folder)
    one = held.adapters.list()[0].nbytes          # a LoRA task's packed bytes (all five alike)
    budget = 3 * one
    cached = _engine(ckpt, adapter_cache_bytes=budget)
    for name, folder in lora_tasks.items():
        cached.adapters.register(name, folder)    # headers only: nothing read yet
    assert cached.adapters.cache.names() == []
    listed = {i.name: i for i in cached.adapters.list()}
    assert [listed[f"t{k}"].nbytes for k in range(5)] == [one] * 5   # the headers' bytes are exact
    assert listed["bn"].nbytes == next(i.nbytes for i in held.adapters.list() if i.name == "bn")
    assert not any(i.cached for i in listed.values()) and all(i.on_disk for i in listed.values())
    # 1: two tasks read (misses); 2: those two hit, t2 misses, t3 waits for room (t0, t1, t2 pinned
    # fill the budget), base-model requests beside them; 3: t4 and t0 after t3 took room.
    batches = [["t0", "t1"], ["t0", "t2", None, "t1", "t3", "t0", None], ["t4", "t0", "t3"]]
    got = LocalPipeline([cached])
    want = LocalPipeline([held])
    waited, stacked = False, 0
    forward = cached.model.forward

    def recording(x, batch, keep=None):   # the cached engine batches its LoRA tasks' products
        nonlocal stacked
        stacked += batch.tasks is not None and batch.tasks.stacked is not None
        return forward(x, batch, keep)
    cached.model.forward = recording
    for k, tasks in enumerate(batches):
        reqs = _batch(prompts, tasks, f"b{k}-")
        for r in reqs:
            got.submit(r)
        while got.busy():
            got.step()
            assert cached.adapters.cache.bytes_cached <= budget
            waited |= bool(cached._task_held)
        want.run(reqs)
        for r in reqs:
            assert got.tokens[r.request_id] == want.tokens[r.request_id], (r.request_id, r.adapter)
            for a, b in zip(got.logprobs[r.request_id], want.logprobs[r.request_id]):
                assert a.logprob == pytest.approx(b.logprob, rel=1e-4, abs=1e-5)
    assert waited, "no request waited for room"
    assert stacked > 0, "no step stacked its LoRA tasks"
    s = cached.adapters.cache_stats()
    # Each task read once (t3 after the batch's others ended, evicting the least recently used);
    # hits: t0, t1, t0 again in batch 2, t0 and t3 in batch 3.
    assert (s.misses, s.hits, s.evictions) == (5, 5, 2), s
    assert s.num_pinned == 0 and s.bytes_cached <= budget and s.load_s_p50 is not None
    assert all(i.in_flight == 0 for i in cached.adapters.list())


def test_task_bigger_than_the_budget_fails_its_requests(tiny_ckpt, prompts, lora_tasks):
    ckpt, _ = tiny_ckpt
    engine = _engine(ckpt, adapter_cache_bytes=1000)
    engine.adapters.register("t0", lora_tasks["t0"])
    pipe = LocalPipeline([engine])
    pipe.run(_batch(prompts, ["t0", None], "x"))
    [failure] = engine.take_failures()
    assert failure.request_id == "x0" and failure.message.startswith(USER_FAILURE)
    assert "over its adapter cache budget adapter_cache_bytes=1000" in failure.message
    assert len(pipe.tokens["x1"]) == 5            # the base-model request beside it ran


def test_bad_files_fail_only_their_requests_naming_the_tensor(tiny_ckpt, prompts, tmp_path):
    ckpt, model = tiny_ckpt
    engine = _engine(ckpt)
    # A shape the headers show: refused when registered.
    tensors = random_task(model, "lora", ("q_proj",), 0)
    tensors["layers.5.q_proj.lora_A"] = torch.zeros(8, 65)
    with pytest.raises(HelixUserError, match=r"tensor 'layers\.5\.q_proj\.lora_A' has shape \[8, 65\]"):
        engine.adapters.register("bad-shape", write_task(tmp_path / "shape", "lora", tensors))
    assert "bad-shape" not in engine.adapters
    # Values only a read sees (an index outside the weight): refused when a request needs the task.
    diff = random_task(model, "diff", ("k_proj",), 1)
    diff["layers.3.k_proj.indices"][1, 0] = 64
    engine.adapters.register("bad-index", write_task(tmp_path / "index", "diff", diff))
    # A file cut short after it was registered.
    folder = write_task(tmp_path / "cut", "lora", random_task(model, "lora", ("v_proj",), 2))
    engine.adapters.register("cut", folder)
    data = (folder / "adapter.safetensors").read_bytes()
    (folder / "adapter.safetensors").write_bytes(data[:len(data) // 2])
    pipe = LocalPipeline([engine])
    pipe.run(_batch(prompts, ["bad-index", None, "cut"], "y"))
    failures = {f.request_id: f.message for f in engine.take_failures()}
    assert set(failures) == {"y0", "y2"} and len(pipe.tokens["y1"]) == 5
    assert failures["y0"] == (USER_FAILURE + "adapter 'bad-index': tensor 'layers.3.k_proj.indices' has "
                              "indices outside the 32 x 64 weight")
    assert failures["y2"].startswith(USER_FAILURE + "adapter 'cut': cannot read adapter.safetensors")
    assert engine.adapters.cache.names() == [] and engine.adapters.cache.stats().num_pinned == 0
