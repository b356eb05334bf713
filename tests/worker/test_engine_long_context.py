"""Decode cost must not grow with what a request already holds beyond attention itself: a step
reads a request's newest hidden-state input as a view (no re-join of its history), and the decode
attention gathers into buffers kept across steps (no fresh pages each step)."""

import torch

from helix.core.models import MODEL_CATALOG
from helix.net.io_types import NewRequest, StageInput
from helix.net.sampling import SamplingParams
from worker.engine import SliceEngine, _hidden_rows
from worker.engine_config import EngineConfig
from worker.profile import random_slice


def _middle_engine():
    spec = MODEL_CATALOG["tiny-llama"]
    weights = random_slice(spec, 2, torch.float32, torch.device("cpu"))
    return SliceEngine(weights, EngineConfig(num_kv_blocks=64, device="cpu")), spec.hidden_size


def test_decodes_read_their_newest_input_without_joining_the_history():
    engine, hidden = _middle_engine()
    ids = ["a", "b"]
    engine.step([StageInput(r, 0, hidden_states=torch.randn(40, hidden),
                            new_request=NewRequest(r, 40, SamplingParams(max_tokens=20))) for r in ids])
    buffers = None
    for pos in range(40, 45):
        engine.step([StageInput(r, pos, hidden_states=torch.randn(1, hidden)) for r in ids])
        assert len(engine.last_plan.decode_ids) == 2
        if buffers is None:
            buffers = engine.model._kv_buffers
        assert engine.model._kv_buffers is buffers      # the same gather buffers every step
    req = engine._reqs["a"]
    assert len(req.hidden) == 6 and req.hidden_starts == [0, 40, 41, 42, 43, 44]
    row = _hidden_rows(req, 44, 45)
    assert row.data_ptr() == req.hidden[-1].data_ptr()  # a view of the newest arrival
    # A read across arrivals joins just those, and the rows are the ones that arrived.
    want = torch.cat(req.hidden[1:4])
    assert torch.equal(_hidden_rows(req, 40, 43), want) and req.hidden_starts == [0, 40, 43, 44]
