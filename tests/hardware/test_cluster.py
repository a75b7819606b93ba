"""Cluster loading from shorthand and YAML, validation errors, and the topology tree."""

from pathlib import Path

import pytest

from argosy.core.errors import ConfigError
from argosy.hardware.loader import load_cluster


@pytest.mark.parametrize(
    ("shorthand", "want_devices", "want_by_chip"),
    [
        ("h100:1024", 1024, {"h100-sxm": 1024}),
        ("a100-80g:512+910b:512", 1024, {"a100-80g": 512, "910b": 512}),
        ("h100:8 + mi300x:16 + gaudi3:8", 32, {"h100-sxm": 8, "mi300x": 16, "gaudi3": 8}),
        ("cpu:2", 2, {"cpu": 2}),
    ],
    ids=["homogeneous", "nvidia-plus-ascend", "three-vendors-spaces", "cpu"],
)
def test_shorthand(shorthand: str, want_devices: int, want_by_chip: dict[str, int]) -> None:
    cluster = load_cluster(shorthand)
    assert cluster.num_devices == want_devices
    assert cluster.devices_by_chip() == want_by_chip
    assert cluster.is_mixed == (len(want_by_chip) > 1)
    assert sum(node.num_devices for node in cluster.nodes) == want_devices


@pytest.mark.parametrize(
    ("shorthand", "want"),
    [
        ("h100", "is not CHIP:COUNT"),
        ("h100:abc", "is not CHIP:COUNT"),
        ("h100:0", "at least 1 device"),
        ("h100:8+", "part 2"),
        ("h1000:8", "unknown chip 'h1000'"),
        ("h100:12", "devices per node do not divide 12"),
    ],
    ids=["no-count", "non-numeric", "zero", "empty-part", "unknown-chip", "indivisible"],
)
def test_bad_shorthand_is_pointed(shorthand: str, want: str) -> None:
    with pytest.raises(ConfigError, match=want):
        load_cluster(shorthand)


YAML = """name: lab
groups:
  - chip: h100
    count: 64
  - chip: gb200-like
    count: 16
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "want_line", "want_text"),
    [
        (YAML, 5, "unknown chip 'gb200-like'; known:"),
        ("groups:\n  - chip: h100\n    count: 0\n", 3, "greater than 0"),
        (
            "groups:\n  - chip: h100\n    count: 24\n    devices_per_node: 16\n",
            4,
            "do not divide 24",
        ),
        (
            "groups:\n  - chip: h100\n    count: 8\ntopology:\n  levels:\n    - name: rack\n",
            6,
            "leaf",
        ),
        ("groups:\n  - chip: h100\n    count: 8\n    colour: red\n", 4, "unknown key"),
        ("groups: []\n", 1, "at least 1"),
    ],
    ids=["unknown-chip", "zero-count", "indivisible", "unknown-level", "unknown-key", "no-groups"],
)
def test_bad_yaml_points_at_line(tmp_path: Path, text: str, want_line: int, want_text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    assert info.value.source == path
    assert info.value.line == want_line
    assert want_text in str(info.value)


def test_yaml_cluster_with_levels_and_overrides(tmp_path: Path) -> None:
    text = """name: nvl
groups:
  - chip: b200
    count: 144
    devices_per_node: 4
    domain_size: 72
  - chip: 910b
    count: 64
    nic_gbps: 100
topology:
  levels:
    - {name: leaf, fanout: 2}
    - {name: spine, fanout: 2}
"""
    cluster = load_cluster(write(tmp_path, text))
    b200, ascend = cluster.groups
    assert (b200.num_nodes, b200.nodes_per_domain) == (36, 18)
    assert ascend.nic_gbps == 100 and b200.nic_gbps == b200.chip.nic_gbps
    domains = {n.domain for n in cluster.nodes if n.chip == "b200"}
    assert len(domains) == 2  # 144 devices in NVL72 domains
    leaves_b200 = {n.path[0] for n in cluster.nodes if n.chip == "b200"}
    leaves_910b = {n.path[0] for n in cluster.nodes if n.chip == "910b"}
    assert leaves_b200.isdisjoint(leaves_910b)  # chip types never share a leaf
    assert len(leaves_910b) == 4  # 8 domains of 1 node, 2 per leaf


def test_nodes_fill_leaves_in_order() -> None:
    cluster = load_cluster(
        "h100:1024"
    )  # 128 nodes, default 32 domains per leaf, 16 leaves per spine
    per_leaf: dict[int, int] = {}
    for node in cluster.nodes:
        per_leaf[node.path[0]] = per_leaf.get(node.path[0], 0) + 1
    assert per_leaf == {0: 32, 1: 32, 2: 32, 3: 32}
    assert {node.path[1] for node in cluster.nodes} == {0}


def test_nic_override_applies_to_every_group() -> None:
    cluster = load_cluster("a100:16+910b:16", nic_gbps=100)
    assert [g.nic_gbps for g in cluster.groups] == [100, 100]
    with pytest.raises(ConfigError, match="positive"):
        load_cluster("a100:16", nic_gbps=0)
