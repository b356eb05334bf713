import pytest

from helix.core.units import (UnitError, format_bandwidth, parse_bandwidth, parse_duration,
                         parse_size)


@pytest.mark.parametrize("text,expected", [
    ("10Gbps", 1.25e9), ("10Gb/s", 1.25e9), ("100Mbps", 12.5e6), ("1GB/s", 1e9),
    ("1.25GBps", 1.25e9), ("512MiB/s", 512 * 2**20), ("8bps", 1.0), (" 2.5 GB/s ", 2.5e9),
])
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("50ms", 0.05), ("1s", 1.0), ("200us", 2e-4), ("3ns", 3e-9), ("0ms", 0.0), ("1e-3s", 1e-3),
])
def test_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("40GB", 40e9), ("40GiB", 40 * 2**30), ("512MiB", 512 * 2**20), ("1TB", 1e12), ("64B", 64),
])
def test_size(text, expected):
    assert parse_size(text) == pytest.approx(expected)


@pytest.mark.parametrize("parse,text", [
    (parse_bandwidth, "10"), (parse_bandwidth, "10Gxps"), (parse_bandwidth, "fast"),
    (parse_duration, "50"), (parse_duration, "50 parsecs"), (parse_size, "40"),
    (parse_size, "40 furlongs"), (parse_bandwidth, True),
])
def test_rejects_missing_or_unknown_units(parse, text):
    with pytest.raises(UnitError):
        parse(text)


def test_format_round_trip():
    assert parse_bandwidth(format_bandwidth(1.25e9)) == pytest.approx(1.25e9)
