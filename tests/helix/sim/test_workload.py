import math
import statistics

import pytest

from helix.core.errors import HelixUserError
from helix.sim.workload import (load_azure_trace, mean_lengths, mean_rate_per_s, poisson_workload,
                                rescale_to_rate, resolve_trace, timed_workload)


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


def _arrived(workload, window_s):
    return sum(r.arrival_s <= window_s for r in workload)


@pytest.mark.parametrize("rate_per_s, window_s", [(0.93, 600.0), (2.0, 1800.0), (0.93, 120.0),
                                                  (7.5, 60.0)])
def test_trace_rate_holds_over_the_window(conv, rate_per_s, window_s):
    # The trace's first minutes run well below its hourly mean: rescaled by the whole trace's mean
    # rate, 600 s at 0.93 req/s got 416 arrivals. The windowed rescale puts exactly
    # round(rate x window) requests inside the window (relative error <= 0.5 / n).
    expected = rate_per_s * window_s
    whole = rescale_to_rate(conv, rate_per_s)
    assert _arrived(whole, window_s) < 0.95 * expected  # the old behaviour, kept without a window
    w = rescale_to_rate(conv, rate_per_s, window_s)
    assert _arrived(w, window_s) == round(expected)
    assert [r.prompt_tokens for r in w] == [r.prompt_tokens for r in conv]
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(w, w[1:])]
    assert min(gaps) >= 0  # order kept
    assert timed_workload(conv, len(conv), rate_per_s, "trace", window_s=window_s) == w


def test_window_longer_than_the_trace_keeps_the_whole_span_rate(conv):
    w = rescale_to_rate(conv[:100], 1.0, 600.0)   # 100 requests cannot fill 600 s at 1 req/s
    assert mean_rate_per_s(w) == pytest.approx(1.0)


def test_poisson_and_constant_arrivals_hold_the_rate(conv):
    # Poisson: the count in the window is Poisson(rate x window); 4 standard deviations.
    rate_per_s, window_s = 0.93, 600.0
    lam = rate_per_s * window_s
    for seed in range(3):
        w = timed_workload(conv, 2000, rate_per_s, "poisson", seed=seed)
        assert abs(_arrived(w, window_s) - lam) <= 4 * lam ** 0.5
    c = timed_workload(conv, 2000, rate_per_s, "constant")
    assert _arrived(c, window_s) == math.floor(lam) + 1   # t = 0, 1/rate, ..., <= window
    burst = timed_workload(conv, 10, math.inf, "trace")
    assert [r.arrival_s for r in burst] == [0.0] * 10


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
