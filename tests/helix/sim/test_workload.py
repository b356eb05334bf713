import statistics

import pytest

from helix.errors import HelixUserError
from helix.sim.workload import (load_azure_trace, mean_lengths, mean_rate_per_s, poisson_workload,
                                rescale_to_rate, resolve_trace)


@pytest.fixture(scope="module")
def conv():
    return load_azure_trace(resolve_trace("conv"))


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
