import pytest

from helix.errors import SpecError
from helix.helix_ini import parse_quantity, read_helix_ini
from helix.plan import COORDINATOR

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
    assert spec.link(COORDINATOR, "node-2") is not None  # via sink
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
