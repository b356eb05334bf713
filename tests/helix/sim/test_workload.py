import statistics

import pytest

from helix.errors import HelixUserError
from helix.sim.workload import (load_azure_trace, mean_lengths, mean_rate_per_s, poisson_workload,
                                rescale_to_rate, resolve_trace)


@pytest.fixture(scope="module")
def conv():
    return load_azure_trace(resolve_trace("conv"))


def test_packed_traces_equal_the_public_csvs(shared_data):
    """The traces shipped in the package hold the same requests as the public CSVs, arrivals equal to
    the traces' 100 ns resolution (float parsing of the CSV's epoch times rounds to ~2e-7 s)."""
    for name, csv_name in (("conv", "azure_llm_2023_conv.csv"), ("code", "azure_llm_2023_code.csv")):
        packed = load_azure_trace(resolve_trace(name), 10**9, 10**9)
        public = load_azure_trace(shared_data / "traces" / csv_name, 10**9, 10**9)
        assert [(r.prompt_tokens, r.output_tokens) for r in packed] == \
               [(r.prompt_tokens, r.output_tokens) for r in public]
        assert max(abs(a.arrival_s - b.arrival_s) for a, b in zip(packed, public)) < 1e-6


def test_packaged_traces_need_no_data_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HELIX_DATA_DIR", raising=False)
    path = resolve_trace("code")
    assert path.name.endswith(".csv.gz") and "helix" in path.parts
    assert len(load_azure_trace(path)) > 5000


def test_gzip_azure_csv_and_comment_lines(tmp_path):
    import gzip
    text = ("# a comment\nTIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(text.encode()))
    w = load_azure_trace(tmp_path / "t.csv.gz")
    assert [(r.prompt_tokens, r.output_tokens) for r in w] == [(374, 44), (396, 109)]
    assert w[1].arrival_s == pytest.approx(4.3145790, abs=1e-6)
    (tmp_path / "junk.csv").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(HelixUserError, match="not a CSV"):
        load_azure_trace(tmp_path / "junk.csv")


def test_conv_trace_filtered_like_the_paper(conv):
    # shared/data/README.md: 19,366 requests; <= 2048 prompt and <= 1024 output leaves about 16,657
    # with mean prompt 763 and mean output 232.
    assert abs(len(conv) - 16657) < 20
    mean_prompt, mean_output = mean_lengths(conv)
    assert mean_prompt == pytest.approx(763, abs=1.0)
    assert mean_output == pytest.approx(232, abs=1.0)
    assert max(r.prompt_tokens for r in conv) <= 2048 and max(r.output_tokens for r in conv) <= 1024
    times = [r.arrival_s for r in conv]
    assert times[0] == 0.0 and times == sorted(times)
    assert 3000 < times[-1] < 4000  # about an hour


def test_rescale_keeps_order_and_hits_rate(conv):
    fast = rescale_to_rate(conv[:2000], 7.5)
    assert mean_rate_per_s(fast) == pytest.approx(7.5)
    assert [r.prompt_tokens for r in fast] == [r.prompt_tokens for r in conv[:2000]]
    assert [r.arrival_s for r in fast] == sorted(r.arrival_s for r in fast)


def test_poisson_rate_and_empirical_lengths(conv):
    w = poisson_workload(4.0, 20_000, seed=1, lengths=conv)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(w, w[1:])]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.05)  # exponential: sd == mean
    assert mean_lengths(w)[0] == pytest.approx(763, rel=0.03)
    assert poisson_workload(4.0, 50, seed=1) == poisson_workload(4.0, 50, seed=1)


def test_bad_inputs_are_user_errors(tmp_path):
    with pytest.raises(HelixUserError, match="no such file"):
        resolve_trace(str(tmp_path / "nope.csv"))
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n")
    with pytest.raises(HelixUserError, match="missing columns"):
        load_azure_trace(bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,x,3\n")
    with pytest.raises(HelixUserError, match="line 2"):
        load_azure_trace(bad)
    with pytest.raises(HelixUserError):
        poisson_workload(0.0, 10)
