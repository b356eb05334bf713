"""Slices of a GGUF file: each worker reads only its tensors, dequantized, with llama.cpp's q/k row
order undone (float32 tensors come back exactly as written); a two-stage pipeline over a quantized
file generates what ``transformers`` generates from the same file."""

from __future__ import annotations

import pytest
import torch

from helix.core.gguf import open_gguf
from helix.net.sampling import SamplingParams
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt
from worker.weights import load_slice
from tests.builders.gguf import write_tiny_gguf

pytest.importorskip("gguf")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HELIX_CACHE", str(tmp_path / "cache"))


def test_slice_tensors_are_the_weights_written(tmp_path):
    path = tmp_path / "f32.gguf"
    spec, w = write_tiny_gguf(path)
    full, report = load_slice(path, 0, spec.num_layers)
    layer = full.layers[3]
    p = "model.layers.3."
    t = {k: torch.from_numpy(v) for k, v in w.items()}
    assert torch.equal(layer.qkv, torch.cat([t[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]))
    assert torch.equal(layer.gate_up, torch.cat([t[p + "mlp.gate_proj.weight"],
                                                 t[p + "mlp.up_proj.weight"]]))
    assert torch.equal(layer.down, t[p + "mlp.down_proj.weight"])
    assert torch.equal(full.embed, t["model.embed_tokens.weight"])
    assert torch.equal(full.lm_head, t["lm_head.weight"])
    middle, part = load_slice(path, 2, 4, dtype=torch.float16)
    assert {n.split(".")[2] for n in part.tensor_names} == {"2", "3"}
    assert middle.embed is None and middle.lm_head is None and middle.layers[0].o.dtype == torch.float16
    tensor_bytes = 4 * sum(v.size for k, v in w.items()
                           if k.startswith(("model.layers.2.", "model.layers.3.")))
    header = open_gguf(path).header_bytes   # metadata and tensor table, then only the slice's tensors
    assert part.bytes_read == header + tensor_bytes < path.stat().st_size / 3
    assert report.bytes_read == header + 4 * sum(v.size for v in w.values())


def test_quantized_pipeline_generates_as_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "q.gguf"
    spec, _ = write_tiny_gguf(path, quant={"attn_q.weight": "Q8_0", "attn_k.weight": "Q4_1",
                                           "ffn_down.weight": "Q4_0", "token_embd.weight": "Q8_0"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    config = EngineConfig(eos_token_ids=(2,))
    pipe = LocalPipeline([SliceEngine.from_checkpoint(path, 0, 5, config),
                          SliceEngine.from_checkpoint(path, 5, spec.num_layers, config)])
    prompts = [[5, 17, 42, 99], [7, 8, 9, 10, 11, 12, 13, 14, 15]]
    got = pipe.run([Prompt(i, p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
                    for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        out = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
        assert got[i] == out[0, len(p):].tolist(), i
