"""scripts/bench_costmodel.py --profile: every measured point of a profile folder beside the
roofline of its device, the ratio being measured / model as helix.core.costmodel computes it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from statistics import median

import pytest

from helix.core.costmodel import analytic_layer_time_s
from helix.core.hardware import GpuKind, lookup_gpu
from helix.core.models import MODEL_CATALOG, ModelSpec
from helix.core.profiles import ProfileRow, write_profile
from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "bench_costmodel.py"
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import bench_costmodel  # noqa: E402

# Uneven times, so that a ratio taken against the wrong point, context or figures shows.
PROMPT = [ProfileRow(16, 16, 0.9e-3), ProfileRow(64, 16, 2.5e-3), ProfileRow(128, 16, 7.0e-3),
          ProfileRow(64, 64, 3.1e-3), ProfileRow(256, 64, 11e-3)]
DECODE = [ProfileRow(1, 16, 0.4e-3), ProfileRow(4, 16, 0.7e-3), ProfileRow(1, 256, 0.5e-3),
          ProfileRow(4, 256, 1.3e-3), ProfileRow(16, 256, 4.2e-3)]


def write(folder, model: ModelSpec, device: str, device_name: str, dtype: str):
    meta = {"helix_profile": 1, "model": dataclasses.asdict(model), "device": device,
            "device_name": device_name, "dtype": dtype, "torch_threads": 2}
    return write_profile(folder, PROMPT, DECODE, meta)


def table_rows(out: str) -> list[tuple[str, float, float, float, float, float]]:
    """(phase, batch, context, measured ms, model ms, ratio) of each printed row."""
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("prompt", "decode"):
            rows.append((cells[0], *map(float, cells[1:])))
    return rows


def expected(model: ModelSpec, kind: GpuKind, dtype_bytes: int) -> list[tuple]:
    """(phase, batch, context, measured s, model s) for every written point: a prompt point of
    length L at a mean attention context of L / 2, a decode point at its context."""
    out = [("prompt", r.batch, r.context, r.seconds,
            analytic_layer_time_s(model, kind, 1, dtype_bytes, r.batch, 0, 0, r.context / 2))
           for r in PROMPT]
    out += [("decode", r.batch, r.context, r.seconds,
             analytic_layer_time_s(model, kind, 1, dtype_bytes, 0, r.batch, r.context, 0))
            for r in DECODE]
    return out


def check_table(out: str, want: list[tuple]) -> None:
    got = table_rows(out)
    assert len(got) == len(want) == len(PROMPT) + len(DECODE)   # one row per measured point
    for (phase, batch, ctx, meas_ms, model_ms, ratio), (w_phase, w_b, w_c, w_meas, w_model) \
            in zip(got, want):
        assert (phase, batch, ctx) == (w_phase, w_b, w_c)
        assert meas_ms == pytest.approx(w_meas * 1e3, rel=1e-3)
        assert model_ms == pytest.approx(w_model * 1e3, rel=1e-3)
        assert ratio == pytest.approx(w_meas / w_model, rel=5e-3)
    for phase in ("prompt", "decode"):
        ratios = [m / s for p, _, _, m, s in want if p == phase]
        line = next(x for x in out.splitlines() if x.startswith(f"{phase}: "))
        assert f"median {median(ratios):#.3g}x" in line
        assert f"range {min(ratios):#.3g}x - {max(ratios):#.3g}x" in line


@pytest.fixture
def benchmarks_unchanged():
    path = REPO_ROOT / "BENCHMARKS.md"
    before = path.read_bytes()
    yield
    assert path.read_bytes() == before, "--no-append wrote BENCHMARKS.md"


def test_cpu_profile_with_this_cpus_figures(tmp_path, capsys, benchmarks_unchanged):
    model = MODEL_CATALOG["small-llama"]
    folder = write(tmp_path / "p", model, "cpu", "Some CPU", "float32")
    argv = ["--profile", str(folder), "--no-append", "--tflops", "0.5", "--bandwidth-gbs", "20"]
    assert bench_costmodel.main(argv) == 0
    out = capsys.readouterr().out
    kind = dataclasses.replace(lookup_gpu("CPU"), fp16_flops=0.5e12,
                               memory_bandwidth_bytes_per_s=20e9)
    check_table(out, expected(model, kind, 4))
    assert "catalog entry CPU" in out and "--tflops" in out


def test_cpu_profile_defaults_to_the_catalogs_cpu_kind(tmp_path, capsys, benchmarks_unchanged):
    model = MODEL_CATALOG["tiny-llama"]
    folder = write(tmp_path / "p", model, "cpu", "Some CPU", "float32")
    assert bench_costmodel.main(["--profile", str(folder), "--no-append"]) == 0
    check_table(capsys.readouterr().out, expected(model, lookup_gpu("CPU"), 4))


def test_h200_stands_in_as_h100_with_its_bandwidth_and_gpu_overrides(tmp_path,
                                                                     benchmarks_unchanged):
    model = MODEL_CATALOG["llama-2-7b"]
    folder = write(tmp_path / "p", model, "cuda", "NVIDIA H200", "float16")
    res = subprocess.run([sys.executable, str(SCRIPT), "--profile", str(folder), "--no-append"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    h200 = dataclasses.replace(lookup_gpu("H100-80G"), memory_bandwidth_bytes_per_s=4.8e12)
    check_table(res.stdout, expected(model, h200, 2))
    assert "no H200" in res.stdout and "H100-80G" in res.stdout
    res = subprocess.run([sys.executable, str(SCRIPT), "--profile", str(folder), "--no-append",
                          "--gpu", "A100-80G", "--bandwidth-tbs", "1.5"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    a100 = dataclasses.replace(lookup_gpu("A100-80G"), memory_bandwidth_bytes_per_s=1.5e12)
    check_table(res.stdout, expected(model, a100, 2))


@pytest.mark.parametrize("device_name, entry", [
    ("NVIDIA A100-SXM4-80GB", "A100-80G"), ("NVIDIA A100-PCIE-40GB", "A100-40G"),
    ("Tesla T4", "T4"), ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ("NVIDIA L40S", None),   # not an L4
])
def test_the_profiles_device_name_picks_the_catalog_kind(tmp_path, capsys, device_name, entry,
                                                         benchmarks_unchanged):
    model = MODEL_CATALOG["tiny-llama"]
    folder = write(tmp_path / "p", model, "cuda", device_name, "float16")
    code = bench_costmodel.main(["--profile", str(folder), "--no-append"])
    out, err = capsys.readouterr()
    if entry is None:
        assert code == 2 and "not in the catalog: pass --gpu" in err
    else:
        assert code == 0 and f"catalog entry {entry}," in out
        check_table(out, expected(model, lookup_gpu(entry), 2))


def test_a_folder_without_model_metadata_is_one_line_of_error(tmp_path, capsys,
                                                              benchmarks_unchanged):
    folder = write_profile(tmp_path / "bare", PROMPT, DECODE, {"device": "cpu"})
    assert bench_costmodel.main(["--profile", str(folder), "--no-append"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "names no model" in err and "Traceback" not in err
    folder = write(tmp_path / "odd", MODEL_CATALOG["tiny-llama"], "cuda", "Mystery GPU", "float16")
    assert bench_costmodel.main(["--profile", str(folder), "--no-append"]) == 2
    assert "not in the catalog: pass --gpu" in capsys.readouterr().err


def test_on_a_folder_helix_profile_wrote(tmp_path, capsys, benchmarks_unchanged):
    from helix.cli import main as helix
    from helix.core.profiles import load_profile
    folder = tmp_path / "measured"
    assert helix(["profile", "tiny-llama", "--quick", "--threads", "1", "-o", str(folder)]) == 0
    capsys.readouterr()
    assert bench_costmodel.main(["--profile", str(folder), "--no-append"]) == 0
    rows = table_rows(capsys.readouterr().out)
    profile = load_profile(folder, "CPU")
    measured = [("prompt", r) for r in profile.prompt.rows()] + \
        [("decode", r) for r in profile.decode.rows()]
    assert [(p, b, c) for p, b, c, *_ in rows] == [(p, r.batch, r.context) for p, r in measured]
    for (*_, meas_ms, _, _), (_, r) in zip(rows, measured):
        assert meas_ms == pytest.approx(r.seconds * 1e3, rel=1e-3)
