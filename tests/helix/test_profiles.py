"""Measured profiles: the reference's two-column files, the context dimension, writing and reading."""

import pytest

from helix.core.errors import SpecError
from helix.core.profiles import (DECODE_FILE, PROMPT_FILE, ProfileRow, load_profile, read_rows,
                            write_profile)


def _folder(tmp_path, prompt: str, decode: str):
    (tmp_path / PROMPT_FILE).write_text(prompt)
    (tmp_path / DECODE_FILE).write_text(decode)
    return tmp_path


def test_two_column_reference_files_load_as_before(tmp_path):
    # The Helix artifact's form: no header, a 0,0 row, batch -> ms; context is ignored.
    p = load_profile(_folder(tmp_path, "0,0\n250,1\n500,2\n", "0,0\n2,0.9\n4,0.9\n8,1.7\n"), "A100")
    assert p.prompt.contexts == () and p.decode.contexts == ()
    assert p.prompt(375) == pytest.approx(1.5e-3)
    assert p.decode(6) == pytest.approx(1.3e-3)
    assert p.prompt(1000) == pytest.approx(4e-3)          # extrapolated along the last segment
    assert p.layer_time_s(250, 4, decode_context=999, prompt_context=50) == pytest.approx(1.9e-3)
    assert p.meta == {}


def test_context_dimension_interpolates_between_and_beyond(tmp_path):
    decode = "# seqs,context,ms\n1,100,1\n4,100,2\n1,300,3\n4,300,6\n"
    p = load_profile(_folder(tmp_path, "64,64,1\n128,64,2\n", decode), "CPU")
    assert p.decode.contexts == (100, 300)
    assert p.decode(4, 300) == pytest.approx(6e-3)                 # a measured point
    assert p.decode(4, 200) == pytest.approx(4e-3)                 # between contexts
    assert p.decode(2.5, 200) == pytest.approx((1.5 + 4.5) / 2 * 1e-3)
    assert p.decode(4, 500) == pytest.approx(10e-3)                # past the longest: same slope
    assert p.decode(4, 10) == pytest.approx(2e-3)                  # below the shortest: the shortest
    # The prompt table's context is the prompt length; the cost model passes the mean attention
    # context of a whole prompt, half its length.
    assert p.layer_time_s(128, 4, decode_context=300, prompt_context=32) == pytest.approx(8e-3)


def test_extrapolation_never_falls_below_the_last_measured_point(tmp_path):
    # Noise made the longer context and the bigger batch look cheaper: extrapolating along those
    # slopes would reach 0 s (a 0.2 ms simulated TPOT); the last measured figure is the floor.
    decode = "1,100,2\n4,100,1.5\n1,300,1\n4,300,1.2\n"
    p = load_profile(_folder(tmp_path, "64,1\n128,0.5\n", decode), "CPU")
    assert p.decode(4, 2000) == pytest.approx(1.2e-3)
    assert p.decode(400, 100) == pytest.approx(1.5e-3)
    assert p.prompt(10_000) == pytest.approx(0.5e-3)


def test_bad_rows_are_one_line_errors(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("1,2,3\n4,5\n")
    with pytest.raises(SpecError, match=r"x.csv:2: .*2 columns where the rows above have 3"):
        read_rows(f)
    f.write_text("1,2,3,4\n")
    with pytest.raises(SpecError, match=r"batch,context,milliseconds"):
        read_rows(f)
    f.write_text("1,-2\n")
    with pytest.raises(SpecError, match="non-negative"):
        read_rows(f)


def test_write_then_load_round_trips(tmp_path):
    prompt = [ProfileRow(64, 64, 1e-3), ProfileRow(128, 64, 1.5e-3), ProfileRow(256, 256, 4e-3)]
    decode = [ProfileRow(1, 128, 2e-4), ProfileRow(8, 128, 5e-4)]
    meta = {"device": "cpu", "dtype": "float32", "torch_threads": 2}
    write_profile(tmp_path / "p", prompt, decode, meta)
    p = load_profile(tmp_path / "p", "CPU")
    assert p.prompt.rows() == prompt and p.decode.rows() == decode
    assert p.meta == meta and p.step_overhead_s(64, 8, 128, 32) == 0.0
    # With the step's fixed cost: charged once per step, prompt part + decode part.
    write_profile(tmp_path / "q", prompt, decode, meta, [ProfileRow(64, 64, 3e-4)],
                  [ProfileRow(1, 128, 1e-4), ProfileRow(8, 128, 8e-4)])
    q = load_profile(tmp_path / "q", "CPU")
    assert q.step_overhead_s(0, 4, 128) == pytest.approx(4e-4)
    assert q.step_overhead_s(64, 8, 128, 32) == pytest.approx(3e-4 + 8e-4)
    assert q.meta["step_overhead_ms"]["decode"] == [[1, 128, 0.1], [8, 128, 0.8]]
    # A profile without a last stage's figures charges a last stage the middle one's.
    assert q.step_overhead_s(0, 4, 128, last=True) == pytest.approx(4e-4)


def test_a_last_stage_pays_its_own_measured_fixed_cost(tmp_path):
    prompt, decode = [ProfileRow(64, 64, 1e-3)], [ProfileRow(1, 128, 2e-4), ProfileRow(8, 128, 5e-4)]
    write_profile(tmp_path / "p", prompt, decode, {}, [ProfileRow(64, 64, 3e-4)],
                  [ProfileRow(1, 128, 1e-4), ProfileRow(8, 128, 8e-4)],
                  [ProfileRow(64, 64, 5e-4)], [ProfileRow(1, 128, 6e-4), ProfileRow(8, 128, 1.3e-3)])
    p = load_profile(tmp_path / "p", "CPU")
    assert p.step_overhead_s(0, 8, 128) == pytest.approx(8e-4)                 # a middle stage
    assert p.step_overhead_s(0, 8, 128, last=True) == pytest.approx(1.3e-3)    # a last stage
    assert p.step_overhead_s(64, 1, 128, 32, last=True) == pytest.approx(5e-4 + 6e-4)
    assert p.meta["step_overhead_ms"]["last_decode"] == [[1, 128, 0.6], [8, 128, 1.3]]


# A CPU profile as ``helix profile`` writes it (small-llama, one thread, corun; ms for one layer):
# at lengths 256 and 512 only whole prompts are measured, so no batch below the length, and the
# first segments there are steeper than proportional.
_CPU_PROMPT = ("64,64,5.99\n128,64,11.28\n256,64,24.08\n512,64,51.09\n1024,64,123.86\n"
               "256,256,21.15\n512,256,58.79\n1024,256,104.2\n512,512,61.66\n1024,512,140.36\n")


def test_a_prompt_piece_below_the_measured_batches_costs_its_share(tmp_path):
    # The second piece of a 356-token prompt at the 256-token budget (101 tokens, mean
    # position 305.5, looked up at length 611) came out 0 ms: each length's first segment,
    # extrapolated down to 101 tokens, is below zero. Measured on the engine (one pinned thread):
    # the whole prompt 29.4 ms / layer, the pieces 255 + 101 tokens 20.4 + 8.9 ms.
    p = load_profile(_folder(tmp_path, _CPU_PROMPT, "1,128,1.35\n32,128,6.8\n"), "CPU")
    whole = p.prompt(356, 356)
    pieces = p.prompt(255, 255) + p.prompt(101, 2 * (255 + 101 / 2))
    assert p.prompt(101, 611) >= p.prompt(101, 64)   # attending over more never costs less here
    assert 0.85 * whole <= pieces <= 1.15 * whole
    # Continuous at a length's smallest measured batch; measured points unchanged.
    assert p.prompt(511.999, 512) == pytest.approx(p.prompt(512, 512), rel=1e-4)
    assert p.prompt(512, 512) == pytest.approx(61.66e-3)
    assert p.prompt(128, 64) == pytest.approx(11.28e-3)
