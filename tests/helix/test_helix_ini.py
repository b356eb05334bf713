import pytest

from helix.core.errors import SpecError
from helix.core.helix_ini import parse_quantity, read_helix_ini
from helix.core.plan import COORDINATOR

CLUSTER = """
[NodeNames]
total_compute_nodes=3

[SourceNode]
connected_nodes=[0, 1]

[SinkNode]
connected_nodes=[2]

[ComputeNode-0]
type=A100
connected_nodes=['source', 2]

[ComputeNode-1]
type=T4x2
connected_nodes=['source', 2]

[ComputeNode-2]
type=L4
connected_nodes=[0, 1, 'sink']

[Link-source-0]
bandwidth=1.25 * gbps
latency=1 * MilliSec

[Link-source-1]
bandwidth=1.25 * gbps
latency=1 * MilliSec

[Link-0-2]
bandwidth=100 * mbps
latency=50 * MilliSec

[Link-1-2]
bandwidth=1.25 * gbps
latency=2 * MilliSec

[Link-2-sink]
bandwidth=1.25 * gbps
latency=1 * MilliSec
"""

PROFILE = """
[SourceNode]
inbound_nic_speed = -1
outbound_nic_speed = 10 * gbps
vram_size = -1

[A100]
inbound_nic_speed = 10 * gbps
outbound_nic_speed = 10 * gbps
vram_size = 40 * GB

[T4x2]
inbound_nic_speed = 10 * gbps
outbound_nic_speed = 10 * gbps
vram_size = 32 * GB

[L4]
inbound_nic_speed = 1 * gbps
outbound_nic_speed = 10 * gbps
vram_size = 24 * GB
"""


@pytest.fixture
def ini_files(tmp_path):
    (tmp_path / "cluster.ini").write_text(CLUSTER)
    (tmp_path / "machine_profile.ini").write_text(PROFILE)
    return tmp_path / "cluster.ini", tmp_path / "machine_profile.ini"


def test_units_are_bytes():
    assert parse_quantity("1.25 * gbps", "x") == 1.25e9
    assert parse_quantity("100 * mbps", "x") == 1e8
    assert parse_quantity("40 * GB", "x") == 40 * 2**30
    assert parse_quantity("-1", "x") is None
    with pytest.raises(SpecError, match="unknown unit 'parsec'"):
        parse_quantity("3 * parsec", "x")


def test_reads_small_cluster(ini_files):
    spec = read_helix_ini(*ini_files)
    assert [(n.name, n.gpu, n.num_gpus) for n in spec.nodes] == [
        ("node-0", "A100-40G", 1), ("node-1", "T4", 2), ("node-2", "L4", 1)]
    assert spec.node("node-1").vram_bytes == 32 * 2**30
    assert spec.link(COORDINATOR, "node-0").bandwidth_bytes_per_s == 1.25e9
    assert spec.link("node-0", "node-2").bandwidth_bytes_per_s == 1e8
    assert spec.link("node-0", "node-2").latency_s == pytest.approx(0.05)
    # the L4's NIC (1 GB/s inbound) caps its links
    assert spec.link("node-1", "node-2").bandwidth_bytes_per_s == 1e9
    # pairs without a [Link-...] section are not connected
    assert spec.link("node-0", "node-1") is None
    # [Link-2-sink] is node -> coordinator only; [Link-source-0] coordinator -> node only
    assert spec.link("node-2", COORDINATOR) is not None
    assert spec.link(COORDINATOR, "node-2") is None and spec.link("node-0", COORDINATOR) is None
    assert spec.coordinator.nic_bandwidth_bytes_per_s == 1e10


def test_bad_ini(tmp_path, ini_files):
    bad = tmp_path / "bad.ini"
    bad.write_text(CLUSTER.replace("bandwidth=100 * mbps", "bandwidth=fast"))
    with pytest.raises(SpecError, match=r"\[Link-0-2\] bandwidth: cannot parse 'fast'"):
        read_helix_ini(bad, ini_files[1])
    bad.write_text(CLUSTER.replace("type=L4", "type=Z80"))
    with pytest.raises(SpecError, match="unknown GPU 'Z80'"):
        read_helix_ini(bad, ini_files[1])
    bad.write_text("[ComputeNode-0\ntype=L4\n")
    with pytest.raises(SpecError, match="invalid INI"):
        read_helix_ini(bad, ini_files[1])


def test_link_to_missing_node_names_the_section(tmp_path, ini_files):
    bad = tmp_path / "bad.ini"
    bad.write_text(CLUSTER + "\n[Link-1-7]\nbandwidth=1 * gbps\nlatency=1 * MilliSec\n")
    with pytest.raises(SpecError, match=r"\[Link-1-7\]: no \[ComputeNode-7\] section"):
        read_helix_ini(bad, ini_files[1])


# --- regions, directed coordinator links, tables, layouts ------------------------------------------

def _two_region_ini(cross_bw: str = "12 * mbps", odd: str = "1250 * mbps",
                    cross_lat: str = "50 * MilliSec") -> str:
    """Nodes 0-2 in one region, 3-4 in another; one slower pair inside the first region;
    coordinator links that differ by direction."""
    lines = ["[NodeNames]", "total_compute_nodes=5", ""]
    for i, gpu in enumerate(["A100", "A100", "L4", "T4", "T4"]):
        lines += [f"[ComputeNode-{i}]", f"type={gpu}", ""]
    region = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b"}
    for i in range(5):
        lines += [f"[Link-source-{i}]", "bandwidth=100 * mbps", "latency=20 * MilliSec", ""]
        lines += [f"[Link-{i}-sink]", "bandwidth=50 * mbps", "latency=30 * MilliSec", ""]
        for j in range(i + 1, 5):
            bw, lat = ("1250 * mbps", "1 * MilliSec") if region[i] == region[j] else \
                (cross_bw, cross_lat)
            if (i, j) == (0, 2):
                bw = odd
            lines += [f"[Link-{i}-{j}]", f"bandwidth={bw}", f"latency={lat}", ""]
    return "\n".join(lines)


FAST_NICS = "".join(f"[{t}]\ninbound_nic_speed = 10 * gbps\noutbound_nic_speed = 10 * gbps\n"
                    f"vram_size = {m} * GB\n\n" for t, m in (("A100", 40), ("L4", 24), ("T4", 16)))


@pytest.fixture
def two_regions(tmp_path):
    path, profile = tmp_path / "two.ini", tmp_path / "profile.ini"
    path.write_text(_two_region_ini(odd="900 * mbps"))
    profile.write_text(FAST_NICS)
    return path, profile


def test_regions_are_inferred_from_the_link_table(two_regions):
    from helix.core.helix_ini import convert_ini
    result = convert_ini(*two_regions)
    spec = result.spec
    assert result.regions.members == {"region-0": ("node-0", "node-1", "node-2"),
                                      "region-1": ("node-3", "node-4")}
    assert [spec.region_of(f"node-{i}") for i in range(5)] == ["region-0"] * 3 + ["region-1"] * 2
    assert spec.regions["region-0"].bandwidth_bytes_per_s == 1.25e9
    assert spec.inter_region.bandwidth_bytes_per_s == 12e6
    assert spec.coordinator.outbound.bandwidth_bytes_per_s == 1e8
    assert spec.coordinator.inbound.bandwidth_bytes_per_s == 5e7
    # only the one pair that differs from its region's figure is an override
    assert [(link.ends, link.bandwidth_bytes_per_s) for link in spec.links] == [
        (("node-0", "node-2"), 9e8)]
    assert not spec.only_listed_links and "bandwidth" in result.regions.how


def test_converted_links_equal_the_ini_exactly(two_regions):
    """Every ordered pair (coordinator both ways included) reads back its INI figures."""
    from helix.core.helix_ini import convert_ini
    spec = convert_ini(*two_regions).spec
    names = [n.name for n in spec.nodes]
    for a in names:
        assert spec.link(COORDINATOR, a).bandwidth_bytes_per_s == 1e8
        assert spec.link(a, COORDINATOR).bandwidth_bytes_per_s == 5e7
        assert spec.link(COORDINATOR, a).latency_s == pytest.approx(0.02)
        for b in names:
            if a != b:
                same = (a < "node-3") == (b < "node-3")
                expect = 9e8 if {a, b} == {"node-0", "node-2"} else 1.25e9 if same else 12e6
                assert spec.link(a, b).bandwidth_bytes_per_s == expect


def test_one_region_when_links_show_no_gap(tmp_path, two_regions):
    from helix.core.helix_ini import convert_ini
    path = tmp_path / "flat.ini"
    path.write_text(_two_region_ini(cross_bw="1000 * mbps", cross_lat="1 * MilliSec"))
    result = convert_ini(path, two_regions[1])
    assert list(result.regions.members) == ["region-0"] and "one region" in result.regions.how
    # equal bandwidth but 50 ms apart: latency alone splits the regions
    path.write_text(_two_region_ini(cross_bw="1000 * mbps"))
    result = convert_ini(path, two_regions[1])
    assert len(result.regions.members) == 2 and "latency" in result.regions.how


def test_link_tolerance_folds_near_figures(two_regions):
    from helix.core.helix_ini import convert_ini
    assert len(convert_ini(*two_regions, tolerance=0.5).spec.links) == 0
    with pytest.raises(SpecError, match="--link-tolerance must be >= 0"):
        convert_ini(*two_regions, tolerance=-1)


def test_regions_file_overrides_the_inference(two_regions):
    from helix.core.helix_ini import convert_ini
    given = {"east": ["node-0", "node-1"], "west": ["node-2", "node-3", "node-4"]}
    spec = convert_ini(*two_regions, regions=given).spec
    assert spec.region_of("node-2") == "west" and set(spec.regions) == {"east", "west"}
    # the network is still the INI's, whatever the regions
    assert spec.link("node-0", "node-2").bandwidth_bytes_per_s == 9e8
    assert spec.link("node-2", "node-3").bandwidth_bytes_per_s == 12e6
    for bad, message in [
        ({"east": ["node-0", "node-9"]}, "unknown node 'node-9'"),
        ({"east": ["node-0", "node-1"], "west": ["node-1", "node-2", "node-3", "node-4"]},
         "node 'node-1' is in regions 'east' and 'west'"),
        ({"east": ["node-0", "node-1"]}, "no region for node-2, node-3, node-4"),
        (["node-0"], "expected a mapping"),
    ]:
        with pytest.raises(SpecError, match=message):
            convert_ini(*two_regions, regions=bad)


def test_an_incomplete_link_table_lists_every_link(ini_files):
    from helix.core.helix_ini import convert_ini
    spec = convert_ini(*ini_files).spec
    assert spec.only_listed_links and len(spec.links) == 5
    # the two A100/T4x2 nodes reach node-2 slowly / fast, but are not joined to each other
    assert spec.link("node-0", "node-1") is None


def test_throughput_tables_are_embedded(two_regions, tmp_path):
    from helix.core.helix_ini import convert_ini, load_throughput_tables
    path = tmp_path / "tables.yaml"
    path.write_text("two:\n  A100: [30, 20, 10]\n  T4: [9, 4]\n  V100: [5]\nother:\n  L4: [1]\n")
    tables = load_throughput_tables(path, "two")
    assert tables == {"A100-40G": (30.0, 20.0, 10.0), "T4": (9.0, 4.0), "V100-16G": (5.0,)}
    spec = convert_ini(*two_regions, throughput_tables=tables).spec
    assert dict(spec.performance.throughput_tables) == {"A100-40G": (30.0, 20.0, 10.0),
                                                        "T4": (9.0, 4.0)}
    with pytest.raises(SpecError, match="holds tables for cases two, other; no case 'nine'"):
        load_throughput_tables(path, "nine")
    with pytest.raises(SpecError, match="name none of this cluster's node kinds"):
        convert_ini(*two_regions, throughput_tables={"V100-16G": (5.0,)})


def test_read_layout(tmp_path):
    from helix.core.helix_ini import read_layout
    path = tmp_path / "sol.ini"
    path.write_text("[Settings]\noffset=2\n\n[Solution]\ncompute_node_2=[3, 4, 5]\n"
                    "compute_node_3=[0, 1, 2]\ncompute_node_4=[]\n")
    assert read_layout(path) == {0: (3, 6), 1: (0, 3)}
    path.write_text("[Solution]\ncompute_node_0=[0, 2]\n")
    with pytest.raises(SpecError, match="not one contiguous range"):
        read_layout(path)
    path.write_text("[Settings]\noffset=2\n")
    with pytest.raises(SpecError, match=r"no \[Solution\] section"):
        read_layout(path)


# --- the reference artifact's published cases (../shared/data/reference_cases) -------------------

CASES = {"3cluster24": "llama-2-70b", "cluster42": "llama-2-70b", "cluster10": "llama-1-30b"}


def _convert_case(shared_data, case):
    from helix.core.helix_ini import convert_ini, load_throughput_tables
    ref = shared_data / "reference_cases"
    tables = load_throughput_tables(ref / "throughput_tables.yaml", case)
    return convert_ini(ref / f"{case}.ini", ref / f"machine_profiles_{case}.ini", CASES[case],
                       throughput_tables=tables)


def test_reference_cases_keep_their_regions_and_links(shared_data):
    from helix.core.helix_ini import _links, _read
    three = _convert_case(shared_data, "3cluster24")
    assert [len(m) for m in three.regions.members.values()] == [4, 10, 10]
    assert three.regions.members["region-0"] == tuple(f"node-{i}" for i in range(4))
    assert three.regions.members["region-1"] == tuple(f"node-{i}" for i in range(4, 14))
    assert three.spec.coordinator.outbound and three.spec.coordinator.inbound
    for case in ("cluster42", "cluster10"):
        result = _convert_case(shared_data, case)
        assert len(result.regions.members) == 1 and len(result.spec.links) == 0
    for case in CASES:
        spec = _convert_case(shared_data, case).spec
        path = shared_data / "reference_cases" / f"{case}.ini"
        table = _links(_read(path), path, {n.name for n in spec.nodes})
        for (a, b), (bw, lat) in table.items():
            link = spec.link(a, b)
            assert (link.bandwidth_bytes_per_s, link.latency_s) == (bw, lat), (case, a, b)


@pytest.mark.parametrize("case,published", [("3cluster24", 1212.18), ("cluster42", 4137.55)])
def test_reference_ilp_layouts_score_their_published_flow(shared_data, case, published):
    """The reference ILP ran on a pruned topology; its layouts are bound by node capacity, so
    the full topology scores them the same."""
    from helix.core.helix_ini import read_layout
    from planner.build import build_problem
    from planner.flowgraph import max_flow
    problem = build_problem(_convert_case(shared_data, case).spec)
    layout = read_layout(shared_data / "reference_cases" / f"{case}_ilp_sol.ini")
    placement = {problem.nodes[i].name: r for i, r in layout.items()}
    assert max_flow(problem, placement).value_tokens_per_s == pytest.approx(published, abs=0.01)


def test_convert_command_prints_the_regions_and_writes_a_loadable_spec(two_regions, tmp_path,
                                                                          capsys):
    from helix.cli import main
    from helix.core.spec import load_cluster
    out = tmp_path / "two.yaml"
    tables = tmp_path / "tables.yaml"
    tables.write_text("two:\n  A100: [30, 20, 10]\n  L4: [9, 4]\n  T4: [5]\n")
    assert main(["convert", *map(str, two_regions), "-o", str(out), "--throughput-tables",
                 str(tables)]) == 0
    text = capsys.readouterr().out
    assert "  region-0: node-0, node-1, node-2  (2 A100-40G, 1 L4;" in text
    assert "  region-1: node-3, node-4  (2 T4;" in text
    assert "coordinator in region region-0; outbound 800Mbps, 20ms; inbound 400Mbps, 30ms" in text
    assert "throughput tables for A100-40G, L4, T4" in text
    spec = load_cluster(out)
    assert spec.region_of("node-4") == "region-1" and spec.performance.throughput_tables["T4"] == (5.0,)
    assert len(out.read_text().splitlines()) < 40  # one line per node and link
    regions = tmp_path / "regions.yaml"
    regions.write_text("east: [node-0, node-1, node-2, node-3]\nwest: [node-4]\n")
    assert main(["convert", *map(str, two_regions), "-o", str(out), "--regions", str(regions),
                 "--throughput-tables", str(tables), "--tables-case", "two"]) == 0
    assert "  west: node-4  (1 T4;" in capsys.readouterr().out
    regions.write_text("east: [node-0, node-7]\n")
    assert main(["convert", *map(str, two_regions), "-o", str(out), "--regions", str(regions)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown node 'node-7'" in err[0]
