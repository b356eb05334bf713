"""Requests that enter a slice at a later layer: the skipped layers do no work, outputs unchanged."""

from __future__ import annotations

import torch

from worker.engine import SliceEngine
from worker.engine_config import EngineConfig
from worker.local_pipeline import LocalPipeline, Prompt
from helix.net.sampling import SamplingParams


def _recording(engine: SliceEngine, log: list) -> SliceEngine:
    """Keep every output the (real) engine emits, in order."""
    step = engine.step

    def recorded(inputs=()):
        outs = step(inputs)
        log.extend(outs)
        return outs

    engine.step = recorded
    return engine


def _run(ckpt, prompts, mid_slice, enter, **cfg):
    config = EngineConfig(eos_token_ids=(2,), **cfg)
    log: list = []
    engines = [SliceEngine.from_checkpoint(ckpt, 0, 3, config),
               _recording(SliceEngine.from_checkpoint(ckpt, *mid_slice, config), log),
               SliceEngine.from_checkpoint(ckpt, 6, 8, config)]
    pipe = LocalPipeline(engines, enter_layers=[None, enter, None])
    got = pipe.run([Prompt(i, tuple(ids), SamplingParams(temperature=0, max_tokens=5))
                    for i, ids in enumerate(prompts)])
    return got, log, engines[1].model.rows_run


def test_entering_late_skips_layers_and_matches_a_slice_that_starts_there(tiny_ckpt, prompts):
    """[2,6) entered at 3 computes nothing at layer 2 and gives bit-for-bit the hidden states of a
    [3,6) slice; its other layers process exactly the rows the [3,6) slice does."""
    ckpt, _ = tiny_ckpt
    for cfg in (dict(max_num_batched_tokens=24), dict(chunked_prefill=False, max_num_batched_tokens=64)):
        got_skip, out_skip, rows_skip = _run(ckpt, prompts, (2, 6), 3, **cfg)
        got_ref, out_ref, rows_ref = _run(ckpt, prompts, (3, 6), None, **cfg)
        assert got_skip == got_ref
        assert rows_skip[0] == 0, "layer 2 ran although every request enters at 3"
        assert rows_skip[1:] == rows_ref and min(rows_ref) > 0
        assert [(o.request_id, o.start_position) for o in out_skip] == \
            [(o.request_id, o.start_position) for o in out_ref]
        assert all(torch.equal(a.hidden_states, b.hidden_states) for a, b in zip(out_skip, out_ref))


def test_last_slice_entered_at_its_final_layer(tiny_ckpt, prompts):
    """The last stage runs only its final layer for these requests (the final layer is then a
    per-row subset and the sampled rows are picked after it): same tokens as a [7,8) last stage."""
    ckpt, _ = tiny_ckpt
    config = EngineConfig(eos_token_ids=(2,), max_num_batched_tokens=24)
    reqs = [Prompt(i, tuple(ids), SamplingParams(temperature=0, max_tokens=5)) for i, ids in enumerate(prompts)]
    got = {}
    for last, enter in (((5, 8), 7), ((7, 8), None)):
        engines = [SliceEngine.from_checkpoint(ckpt, 0, 3, config),
                   SliceEngine.from_checkpoint(ckpt, 3, 7, config),
                   SliceEngine.from_checkpoint(ckpt, *last, config)]
        got[last] = LocalPipeline(engines, enter_layers=[None, None, enter]).run(reqs)
        if enter is not None:
            assert engines[2].model.rows_run[:2] == [0, 0]
    assert got[(5, 8)] == got[(7, 8)]
