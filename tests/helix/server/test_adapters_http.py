"""Fine-tuned tasks over the OpenAI API: load / unload with vLLM's routes, requests naming
a task in ``model``, against ``transformers`` with the task merged in. Three real workers (ZeroMQ,
gRPC control), the coordinator and uvicorn in this process."""

from __future__ import annotations

import json
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from tests.builders.adapters import merged_model, random_task, write_task  # noqa: E402
from tests.builders.serving import PROMPTS  # noqa: E402
from tests.builders.stack import MODEL_NAME, local_stack  # noqa: E402

MAX_TOKENS = 8
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TASKS = [("lora", "lora", ALL, {"scale": 0.5}), ("bitfit", "bitfit", ALL, {}),
         ("bottleneck", "bottleneck", ("o_proj", "down_proj"), {})]


def _hf_text(model, tok, prompt: str) -> str:
    ids = tok(prompt)["input_ids"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=0)
    return tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """(stack, httpx client, {task: (folder, reference model)})."""
    ckpt, model = tiny_model
    root = tmp_path_factory.mktemp("http_tasks")
    tasks = {}
    for seed, (name, kind, targets, opts) in enumerate(TASKS):
        tensors = random_task(model, kind, targets, seed + 10)
        tasks[name] = (write_task(root / name, kind, tensors, **opts),
                       merged_model(model, kind, tensors, **opts))
    with local_stack(ckpt) as stack, httpx.Client(base_url=stack.url, timeout=60) as client:
        yield stack, client, tasks


def _complete(client, model: str, prompt: str):
    return client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                "temperature": 0})


def test_tasks_served_equal_merged_references(tiny_model, served):
    ckpt, base = tiny_model
    stack, client, tasks = served
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    for name, (folder, _) in tasks.items():
        r = client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder)})
        assert r.status_code == 200, r.text
    cards = client.get("/v1/models").json()["data"]
    assert [c["id"] for c in cards] == [MODEL_NAME, *tasks]
    assert all(c["parent"] == MODEL_NAME and c["bytes"] > 0 for c in cards[1:])
    # Every task and the base model at once: their requests share the workers' steps.
    jobs = [(m, p) for p in PROMPTS[:4] for m in (MODEL_NAME, *tasks, f"{MODEL_NAME}:lora")]
    got: dict = {}

    def send(job):
        got[job] = _complete(client, *job)
    threads = [threading.Thread(target=send, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    changed = set()
    for (m, prompt), r in got.items():
        assert r.status_code == 200, r.text
        assert r.json()["model"] == m   # the answer names what was asked for, as vLLM's
        task = m.split(":")[-1]
        ref = base if m == MODEL_NAME else tasks[task][1]
        text = r.json()["choices"][0]["text"]
        assert text == _hf_text(ref, tok, prompt), (m, prompt)
        if m != MODEL_NAME and text != got[(MODEL_NAME, prompt)].json()["choices"][0]["text"]:
            changed.add(task)
    assert changed == set(tasks)
    assert client.get("/v1/models/lora").json()["parent"] == MODEL_NAME
    # Streamed chunks and chat name the task too.
    with client.stream("POST", "/v1/chat/completions", json={
            "model": "lora", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "stream": True}) as r:
        chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert chunks and all(c["model"] == "lora" for c in chunks)
    # Each worker read each task its requests brought from disk once into its adapter cache (tasks
    # are registered, not read, by the load), and later requests hit; /metrics shows it per node.
    # Every request crosses cpu-0 (the only first stage); a task's requests may all have taken the
    # same one of cpu-1 / cpu-2, so those two read each task once between them at least.
    from prometheus_client import parser
    deadline, n = time.monotonic() + 10, len(tasks)

    def settled(cache) -> bool:
        branches = [cache.get((node, "misses"), 0) for node in ("cpu-1", "cpu-2")]
        return cache.get(("cpu-0", "misses")) == n and sum(branches) >= n and max(branches) <= n
    while True:
        text = client.get("/metrics").text
        cache = {(s.labels["node"], s.labels["value"]): s.value
                 for f in parser.text_string_to_metric_families(text) for s in f.samples
                 if s.name == "helix:adapter_cache"}
        if settled(cache) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert settled(cache), cache
    assert cache[("cpu-0", "hits")] > 0, cache
    read = [node for node, k in cache if k == "misses" and cache[(node, k)]]
    assert all(cache[(node, "bytes")] > 0 for node in read), cache
    assert "helix:adapter_load_seconds" in text


def test_bad_requests_and_loads(served, tiny_model, tmp_path):
    _, model = tiny_model
    stack, client, tasks = served
    r = _complete(client, "no-such-task", "Helix")
    assert r.status_code == 404 and "no-such-task" in r.json()["error"]["message"]
    assert _complete(client, f"{MODEL_NAME}:nope", "Helix").status_code == 404
    tensors = random_task(model, "lora", ("q_proj",), 3)
    tensors["layers.1.q_proj.lora_B"] = tensors["layers.1.q_proj.lora_B"][:-1]
    bad = write_task(tmp_path / "bad", "lora", tensors)
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(bad)})
    assert r.status_code == 400
    assert "tensor 'layers.1.q_proj.lora_B' has shape" in r.json()["error"]["message"]
    assert "bad" not in [c["id"] for c in client.get("/v1/models").json()["data"]]
    # The workers that did load it dropped it again: the name is free.
    assert all("bad" not in s.engine.adapters for s in stack.servers)
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
    assert r.status_code == 400 and "helix_adapter.json" in r.json()["error"]["message"]
    assert client.post("/v1/load_lora_adapter", json={"lora_name": 3, "lora_path": "/"}).status_code == 400
    r = client.post("/v1/unload_lora_adapter", json={"lora_name": "never-loaded"})
    assert r.status_code == 404


def test_unload_waits_for_requests_in_flight(served, tiny_model):
    ckpt, _ = tiny_model
    stack, client, tasks = served
    folder, ref = tasks["bitfit"]
    client.post("/v1/load_lora_adapter", json={"lora_name": "drainme", "lora_path": str(folder)})
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    prompt = PROMPTS[2]
    body = {"model": "drainme", "prompt": prompt, "max_tokens": 64, "temperature": 0, "stream": True,
            "ignore_eos": True}
    texts, unloaded = [], {}
    with client.stream("POST", "/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))   # the request runs
        texts.append(first)
        assert stack.coordinator._requests_of("drainme") == 1   # still generating

        def unload():
            unloaded["r"] = client.post("/v1/unload_lora_adapter", json={"lora_name": "drainme"})
            unloaded["t"] = time.monotonic()
        t = threading.Thread(target=unload)
        t.start()
        time.sleep(0.05)
        assert _complete(client, "drainme", "Helix").status_code == 404   # refused while draining
        texts.extend(line for line in lines if line.startswith("data: "))
        done = time.monotonic()
    t.join(30)
    assert unloaded["r"].status_code == 200 and unloaded["t"] >= done - 0.5
    text = "".join(json.loads(x[6:])["choices"][0]["text"] for x in texts if x != "data: [DONE]"
                   and json.loads(x[6:])["choices"])
    ids = tok(prompt)["input_ids"]
    out = ref.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, eos_token_id=None,
                       pad_token_id=0)
    assert text == tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)
    assert all("drainme" not in s.engine.adapters for s in stack.servers)
    assert "drainme" not in [c["id"] for c in client.get("/v1/models").json()["data"]]


def test_native_client_names_the_task(served, tiny_model):
    """``helix.Client(...).generate(..., adapter=task)`` over gRPC gives the task's tokens; an
    unknown task is NOT_FOUND, a non-string one INVALID_ARGUMENT."""
    from helix.client import Client, ClientError
    ckpt, _ = tiny_model
    stack, client, tasks = served
    folder, ref = tasks["bottleneck"]
    if "bottleneck" not in [c["id"] for c in client.get("/v1/models").json()["data"]]:
        client.post("/v1/load_lora_adapter", json={"lora_name": "bottleneck", "lora_path": str(folder)})
    ids = list(stack.coordinator.codec.encode(PROMPTS[1]))
    out = ref.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                       pad_token_id=0)
    with Client(stack.grpc.address, timeout_s=60) as c:
        got = c.generate(ids, max_tokens=6, temperature=0, ignore_eos=True, adapter="bottleneck")
        assert list(got.token_ids) == out[0, len(ids):].tolist()
        with pytest.raises(ClientError, match="NOT_FOUND"):
            c.generate(ids, max_tokens=2, adapter="nope")
        with pytest.raises(ClientError, match="INVALID_ARGUMENT"):
            c.generate(ids, max_tokens=2, adapter=7)

def test_a_rejoining_worker_loads_the_tasks(served, tiny_model):
    """A new process for cpu-2 gets every loaded task before it serves; the task's output is the
    reference's through it."""
    from coordinator.runtime import WorkerHandle
    from worker.server import WorkerServer
    ckpt, _ = tiny_model
    stack, client, tasks = served
    folder, ref = tasks["lora"]
    if "lora" not in [c["id"] for c in client.get("/v1/models").json()["data"]]:
        client.post("/v1/load_lora_adapter", json={"lora_name": "lora", "lora_path": str(folder)})
    replacement = WorkerServer("cpu-2", str(ckpt), torch_threads=1)
    try:
        stack.coordinator.rejoin(WorkerHandle("cpu-2", replacement.control.address, replacement.data.address))
        assert "lora" in replacement.engine.adapters
    finally:
        replacement.shutdown()
