"""Slice loading: only the slice's bytes are read; bad checkpoints and slices get one clear error."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helix.core.errors import HelixUserError, SpecError
from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from helix.net.io_types import NewRequest, StageInput
from helix.net.sampling import SamplingParams
from worker.weights import expected_shapes, load_slice
from helix.core.models import ModelSpec


def _rchar() -> int:
    """Bytes this process read through read()/pread() so far (kernel counter, not ours)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_reads_only_the_slice_bytes(tiny_ckpt):
    ckpt, _ = tiny_ckpt
    spec = ModelSpec.from_pretrained_dir(ckpt)
    file_bytes = (ckpt / "model.safetensors").stat().st_size
    slice_bytes = 4 * sum(torch.Size(s).numel() for s in expected_shapes(spec, 2, 4).values())
    before = _rchar()
    weights, report = load_slice(ckpt, 2, 4)
    read = _rchar() - before
    # Header (a few KB) and config.json on top of the tensors themselves; nothing else.
    assert slice_bytes <= report.bytes_read <= slice_bytes + 16_384
    assert read <= report.bytes_read + 8_192, (read, report.bytes_read)
    assert read < file_bytes / 3          # 2 of 8 layers, no embedding or LM head
    assert weights.embed is None and weights.lm_head is None and len(weights.layers) == 2
    assert all(".layers.2." in n or ".layers.3." in n for n in report.tensor_names)


def test_first_and_last_slices_get_embedding_and_head(tied_ckpt):
    ckpt, model = tied_ckpt
    first, _ = load_slice(ckpt, 0, 1)
    last, report = load_slice(ckpt, 3, 4)
    assert first.embed is not None and first.lm_head is None
    assert last.embed is None and torch.equal(last.lm_head, model.lm_head.weight)
    assert "lm_head.weight" not in report.tensor_names   # tied: read the embedding instead


def _copy(ckpt: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(ckpt, dst)
    return dst


def test_unknown_architecture(tiny_ckpt, tmp_path):
    ckpt = _copy(tiny_ckpt[0], tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_slice(ckpt, 0, 2)


def test_missing_tensor(tiny_ckpt, tmp_path):
    ckpt = _copy(tiny_ckpt[0], tmp_path)
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.5.mlp.up_proj.weight"]
    save_file(tensors, ckpt / "model.safetensors")
    load_slice(ckpt, 0, 5)    # fine: layer 5 is not needed
    with pytest.raises(SpecError, match=r"lacks tensor 'model.layers.5.mlp.up_proj.weight'"):
        load_slice(ckpt, 4, 8)


def test_misshaped_tensor(tiny_ckpt, tmp_path):
    ckpt = _copy(tiny_ckpt[0], tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=r"gate_proj.weight' has shape \[160, 64\], expected \[96, 64\]"):
        load_slice(ckpt, 0, 1)


def test_no_weights_file(tiny_ckpt, tmp_path):
    ckpt = tmp_path / "empty"
    ckpt.mkdir()
    shutil.copy(tiny_ckpt[0] / "config.json", ckpt)
    with pytest.raises(SpecError, match="neither model.safetensors nor"):
        load_slice(ckpt, 0, 1)


@pytest.mark.parametrize("start,end", [(6, 9), (-1, 2), (3, 3)])
def test_slice_outside_model(tiny_ckpt, start, end):
    with pytest.raises(HelixUserError, match="outside model"):
        load_slice(tiny_ckpt[0], start, end)


def test_request_longer_than_kv_capacity_fails_at_admission(tiny_ckpt):
    engine = SliceEngine.from_checkpoint(tiny_ckpt[0], 0, 8,
                                         EngineConfig(num_kv_blocks=4, block_size_tokens=8))
    new = NewRequest("long", 30, SamplingParams(max_tokens=5))
    assert engine.step([StageInput("long", 0, token_ids=tuple(range(30)), new_request=new)]) == []
    [failure] = engine.take_failures()   # refused and dropped; the engine keeps serving others
    assert failure.request_id == "long"
    assert re.search("needs KV for 35 tokens .* at most 32 tokens", failure.message)
    assert not engine.has_work()


def test_kv_capacity_comes_from_the_memory_budget(tiny_ckpt):
    # 2 layers x 16 tokens x 2 kv heads x 16 dims x 4 bytes x (K and V) = 8 KiB per block.
    engine = SliceEngine.from_checkpoint(tiny_ckpt[0], 0, 2, EngineConfig(kv_budget_bytes=80 * 1024))
    assert engine.blocks.num_blocks == 10
