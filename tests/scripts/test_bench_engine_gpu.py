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
