"""bench_engine_gpu.py's logic on a CPU (its --smoke mode): every section runs, the tables are
written, and the decode-graph buffers give the eager path's tokens."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_engine_gpu  # noqa: E402


def test_smoke_run_fills_every_section(tmp_path, capsys):
    rc = bench_engine_gpu.main(["--smoke", "--device", "cpu", "--no-append", "--skip-profile",
                                "--out", str(tmp_path)])
    res = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0 and res["errors"] == {}, res["errors"]
    assert res["graphs_exact"]["identical"] and res["graphs_exact"]["replays"] > 0
    # On a CPU both runs are the static buffers without capture; against the eager step (GEMMs
    # over the real rows, no padding) float32 tokens must still agree.
    assert res["graphs_exact"]["differing_vs_off"] == 0
    assert [r["requests"] for r in res["vs_hf"]] == [1, 4]
    assert all(r["agreement"]["first_token_equal"] == 1.0 for r in res["vs_hf"])
    assert res["decode128"]["seqs"] == 8 and res["decode128"]["ideal_step_s"] > 0
    table = (tmp_path / "results.md").read_text()
    assert "engine vs transformers generate" in table and "one step" in table


def test_a_lent_machines_results_render_the_block_here(tmp_path, capsys):
    """``--render``: the block says the run's machine, torch, cores and load (from its
    results.json), not this one's, and each measurement beside its target."""
    res = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "errors": {}, "started": "2026-11-28 17:28 UTC",
           "command": "python scripts/bench_engine_gpu.py --out /root/out", "cpus": 16, "load0": 0.9,
           "roofline": {"gemm_flops": 7.4e14, "gemm_n": 8192, "copy_bytes_per_s": 4.28e12},
           "vs_hf": [{"requests": 1, "engine_tok_s": 165.0, "hf_tok_s": 13.4, "ratio": 12.31,
                      "agreement": {"first_token_equal": 1.0}}],
           "decode128": {"seqs": 128, "median_step_s": 0.0029, "ideal_step_s": 0.00066,
                         "fraction_of_roofline": 0.227}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    assert bench_engine_gpu.main(["--render", str(path), "--no-append"]) == 0
    out = capsys.readouterr().out
    assert "on NVIDIA H200, torch 2.11.0+cu130, 16 CPU cores, load average 0.9" in out
    assert "165 vs 13 tok/s = 12.31x" in out and "2.90 ms a step" in out and "22.7%" in out
    assert out.count("\n") == 1   # one paragraph: BENCHMARKS.md keeps to 500 lines
