import subprocess
import sys

import pytest
import yaml

from helix.cli import main

from tests.conftest import CLUSTER_SPECS
from tests.builders.specs import tiny_spec
from tests.helix.test_helix_ini import CLUSTER, PROFILE

EXAMPLES = ["single24.yaml", "geo24.yaml", "hetero42.yaml", "local3.yaml",
            "reference/helix-single24-70b.yaml"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_validate_example_clusters(name, capsys):
    assert main(["validate", str(CLUSTER_SPECS / name)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "layer slots" in out


def test_validate_prints_kinds_and_curve(capsys):
    assert main(["validate", str(CLUSTER_SPECS / "hetero42.yaml")]) == 0
    out = capsys.readouterr().out
    for label in ("A100-40G", "V100-16G", "L4x2", "T4x4"):
        assert label in out


def _run_bad(tmp_path, data, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("data,fragment", [
    ("model: [unclosed\n", "invalid YAML"),
    (tiny_spec(model="llama-9-900b"), "unknown model"),
    (tiny_spec(nodes=[{"name": "x", "gpu": "Z80", "region": "east"}]), "unknown GPU 'Z80'"),
    (tiny_spec(nodes=[{"name": "x", "gpu": "CPU", "memory": "1MiB", "region": "east"}]),
     "no node can hold even one layer"),
    (tiny_spec(nodes=[{"name": "t-{i}", "gpu": "T4", "count": 3, "region": "east"}]),
     "the cluster holds at most"),
])
def test_bad_input_one_line_exit_2(tmp_path, capsys, data, fragment):
    code, err = _run_bad(tmp_path, data, capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert fragment in err


def test_console_script_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_spec(dtype="int3")))
    proc = subprocess.run([sys.executable, "-m", "helix.cli", "validate", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "unknown dtype 'int3'" in proc.stderr


def test_help_lists_commands():
    proc = subprocess.run([sys.executable, "-m", "helix.cli", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0
    assert "validate" in proc.stdout and "convert" in proc.stdout


def test_from_helix_ini_and_convert(tmp_path, capsys):
    (tmp_path / "c.ini").write_text(CLUSTER)
    (tmp_path / "m.ini").write_text(PROFILE)
    assert main(["validate", str(tmp_path / "c.ini"), "--from-helix-ini",
                 str(tmp_path / "m.ini"), "--model", "llama-3-8b"]) == 0
    out = tmp_path / "out.yaml"
    assert main(["convert", str(tmp_path / "c.ini"), str(tmp_path / "m.ini"), "-o", str(out),
                 "--model", "llama-3-8b"]) == 0
    capsys.readouterr()
    assert main(["validate", str(out)]) == 0
    assert "llama-3-8b" in capsys.readouterr().out


@pytest.mark.parametrize("argv,fragment", [
    (["validate"], "Missing argument 'cluster'. (see: helix validate --help)"),
    (["validate", "x.yaml", "--bogus", "1"], "No such option: --bogus"),
    (["convert", "a.ini"], "Missing argument"),
    (["frobnicate"], "No such command 'frobnicate'. (see: helix --help)"),
])
def test_usage_errors_are_one_line(argv, fragment):
    proc = subprocess.run([sys.executable, "-m", "helix.cli", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]


def test_cut_off_region_warns_and_counts_only_reachable_nodes(tmp_path, capsys):
    data = tiny_spec()
    del data["inter_region"]          # west (l4-0) has no path to the coordinator in east
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no network path" in out and "l4-0" in out
    # with the A100s cut off instead, what is left cannot hold LLaMA-2 70B: one clear line
    data["coordinator"] = {"region": "west"}
    code, err = _run_bad(tmp_path, data, capsys)
    assert code == 2 and "the cluster holds at most" in err and str(path) in err


def test_a_node_with_no_way_back_to_the_coordinator_is_cut_off(tmp_path, capsys):
    """Directed links: l4-0 is reached from the coordinator but cannot send back (its only
    route, to the coordinator, is overridden one way and west has no inter-region link)."""
    data = tiny_spec(links=[{"from": "coordinator", "to": "l4-0", "bandwidth": "1Gbps"}])
    del data["inter_region"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no network path" in out and "l4-0" in out
    data["links"].append({"from": "l4-0", "to": "coordinator", "bandwidth": "1Gbps"})
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", str(path)]) == 0
    assert "no network path" not in capsys.readouterr().out
