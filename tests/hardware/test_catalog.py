"""The chip catalog: required entries, sources, aliases, look-up errors, device matching."""

import pytest

from argosy.core.errors import ConfigError, UnknownNameError
from argosy.hardware.catalog import default_catalog

REQUIRED = [
    "a100-40g", "a100-80g", "a800", "h100-sxm", "h100-pcie", "h800", "h20", "h200", "b200",
    "l40s", "mi250x", "mi300x", "910b", "p800", "k100-ai", "gaudi2", "gaudi3", "cpu",
]  # fmt: skip


@pytest.mark.parametrize("chip_id", REQUIRED)
def test_required_chip_is_present_with_a_source(chip_id: str) -> None:
    chip = default_catalog().get(chip_id)
    assert chip.id == chip_id
    assert chip.source.strip()
    assert chip.memory_gib > 0 and chip.memory_tbps > 0
    assert chip.link.domain_size >= 1


@pytest.mark.parametrize(
    ("alias", "want"),
    [("h100", "h100-sxm"), ("H100", "h100-sxm"), ("a100", "a100-80g"), ("ascend-910b", "910b")],
    ids=["h100", "upper-case", "a100", "ascend"],
)
def test_aliases_resolve(alias: str, want: str) -> None:
    assert default_catalog().canonical(alias) == want


def test_unknown_chip_lists_closest_first() -> None:
    with pytest.raises(UnknownNameError) as info:
        default_catalog().get("h1000")
    known = str(info.value).split("known: ", 1)[1].split(", ")
    assert known[0].startswith("h100")
    assert "mi300x" in known and "910b" in known


def test_peak_for_missing_dtype_is_an_error() -> None:
    catalog = default_catalog()
    assert catalog.get("h100").peak_tflops("fp8") == pytest.approx(2 * 989.5, rel=0.01)
    with pytest.raises(ConfigError, match="no fp8"):
        catalog.get("a100").peak_tflops("fp8")


def test_fp8_is_null_exactly_where_the_chip_lacks_it() -> None:
    catalog = default_catalog()
    without = {c.id for c in catalog.chips() if c.fp8_tflops is None}
    assert {"a100-40g", "a100-80g", "a800", "mi250x"} <= without
    assert not {"h100-sxm", "h200", "b200", "mi300x", "gaudi3"} & without


@pytest.mark.parametrize(
    ("reported", "vendor", "want"),
    [
        ("NVIDIA H100 80GB HBM3", "nvidia", "h100-sxm"),
        ("NVIDIA H100 PCIe", "nvidia", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "nvidia", "a100-80g"),
        ("NVIDIA A100-SXM4-40GB", "nvidia", "a100-40g"),
        ("NVIDIA H20", "nvidia", "h20"),
        ("NVIDIA H200", "nvidia", "h200"),
        ("AMD Instinct MI300X", "amd", "mi300x"),
        ("Ascend910B3", "huawei", "910b"),
        ("NVIDIA GeForce RTX 4090", "nvidia", None),
    ],
    ids=lambda v: str(v),
)
def test_driver_names_match_catalog_entries(reported: str, vendor: str, want: str | None) -> None:
    chip = default_catalog().match_device(reported, vendor=vendor)
    assert (chip.id if chip else None) == want
