"""GPU profiles, user TOML profiles, NVML name matching and local detection (fake NVML)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from specbench.analysis.hardware import (
    BUILTIN_PROFILES,
    detect_local_gpu,
    get_profile,
    hardware_listing,
    hardware_table,
    load_profiles,
    match_profile,
)
from specbench.core.errors import SpecbenchError
from tests.helpers import FakeNvml, NVMLError_LibraryNotFound

EXPECTED = {"rtx3090", "rtx4090", "rtx5090", "l4", "l40s", "a10g", "a100-40g", "a100-80g",
            "h100-pcie", "h100-sxm", "h200", "b200", "cpu"}


def test_builtin_profiles():
    assert set(BUILTIN_PROFILES) == EXPECTED
    rtx4090, h200 = BUILTIN_PROFILES["rtx4090"], BUILTIN_PROFILES["h200"]
    assert (rtx4090.memory_gb, rtx4090.bandwidth_gbs, rtx4090.pcie_gen) == (24, 1008, 4)
    assert (h200.memory_gb, h200.bandwidth_gbs, h200.pcie_gen) == (141, 4800, 5)
    assert h200.bf16_tflops == 989  # dense, not the 1979 sparse figure
    for p in BUILTIN_PROFILES.values():
        assert p.source and p.memory_gb > 0 and p.bandwidth_gbs > 0 and p.bf16_tflops > 0
    assert "estimate" in BUILTIN_PROFILES["cpu"].source


def test_user_profiles_merge(tmp_path):
    path = tmp_path / "gpus.toml"
    path.write_text(
        '[profiles.MI300X]\nmemory_gb = 192\nbandwidth_gbs = 5300\nbf16_tflops = 1307.4\npcie_gen = 5\n'
        'source = "AMD Instinct MI300X datasheet"\n\n'
        '[profiles.rtx4090]\nmemory_gb = 24\nbandwidth_gbs = 1000\nbf16_tflops = 165\npcie_gen = 4\n'
    )
    profiles = load_profiles(path)
    assert EXPECTED < set(profiles)
    mi = get_profile("mi300x", profiles)
    assert (mi.name, mi.memory_gb, mi.bandwidth_gbs, mi.pcie_gen) == ("mi300x", 192.0, 5300.0, 5)
    assert mi.source == "AMD Instinct MI300X datasheet"
    overridden = profiles["rtx4090"]
    assert overridden.bandwidth_gbs == 1000 and str(path) in overridden.source
    assert load_profiles(None) == BUILTIN_PROFILES


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[profiles.x]\nmemory_gb = 24\nbandwidth_gbs = 900\npcie_gen = 4\n", "profiles.x.bf16_tflops is missing"),
        ("[profiles.x]\nmemory_gb = 'lots'\nbandwidth_gbs = 900\nbf16_tflops = 1\npcie_gen = 4\n",
         "profiles.x.memory_gb must be a number"),
        ("[profiles.x]\nmemory_gb = 24\nbandwidth_gbs = -1\nbf16_tflops = 1\npcie_gen = 4\n",
         "profiles.x.bandwidth_gbs must be a number > 0"),
        ("[profiles.x]\nmemory_gb = 24\nbandwidth_gbs = 9\nbf16_tflops = 1\npcie_gen = 4.0\n",
         "profiles.x.pcie_gen must be a non-negative integer"),
        ("[profiles.x]\nmemory_gb = 24\nbandwidth_gbs = 9\nbf16_tflops = 1\npcie_gen = 4\nbandwith = 3\n",
         "profiles.x.bandwith is not a profile key"),
        ("[profiles]\nx = 3\n", "profiles.x must be a table"),
        ("[gpus.x]\nmemory_gb = 24\n", "expected one or more [profiles.NAME] tables"),
        ("[profiles.x\nmemory_gb = 24\n", "is not valid TOML"),
    ],
)
def test_malformed_toml_names_file_and_key(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecbenchError) as err:
        load_profiles(path)
    assert needle in str(err.value)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_profile_file(tmp_path):
    with pytest.raises(SpecbenchError, match="does not exist"):
        load_profiles(tmp_path / "nope.toml")


def test_unknown_profile_lists_known_ones():
    with pytest.raises(SpecbenchError) as err:
        get_profile("rtx9090", BUILTIN_PROFILES)
    message = str(err.value)
    assert "unknown GPU profile 'rtx9090'" in message
    assert "h200" in message and "rtx4090" in message and "cpu" in message
    assert get_profile(" RTX4090 ", BUILTIN_PROFILES).name == "rtx4090"


@pytest.mark.parametrize(
    ("nvml_name", "profile"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA GeForce RTX 5090", "rtx5090"),
        ("NVIDIA A100-SXM4-80GB", "a100-80g"),
        ("NVIDIA A100-PCIE-40GB", "a100-40g"),
        ("NVIDIA A100 80GB PCIe", "a100-80g"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA B200", "b200"),
        # different figures from any profile: no match rather than a wrong one
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA A10", None),
        ("NVIDIA L40", None),
        ("Tesla T4", None),
    ],
)
def test_match_profile(nvml_name, profile):
    assert match_profile(nvml_name) == profile


def test_match_a100_by_memory_when_name_has_no_size():
    assert match_profile("NVIDIA A100-PCIE", memory_gb=85.0) == "a100-80g"
    assert match_profile("NVIDIA A100-PCIE", memory_gb=42.5) == "a100-40g"
    assert match_profile("NVIDIA A100-PCIE") is None


def test_detect_local_gpu_with_fake_nvml():
    fake = FakeNvml()
    local = detect_local_gpu(fake)
    assert local is not None
    assert local.name == "NVIDIA H200" and local.profile == "h200"
    assert local.memory_gb == pytest.approx(150.0)
    assert local.bandwidth_gbs == pytest.approx(6144 * 3201 * 2 / 8 / 1000)
    assert (local.pcie_gen, local.pcie_width) == (5, 16)
    assert fake.shutdowns == fake.inits == 1


def test_detect_local_gpu_partial_and_absent():
    local = detect_local_gpu(FakeNvml(unsupported=("bus_width",), name="NVIDIA GeForce RTX 4090"))
    assert local.bandwidth_gbs is None and local.profile == "rtx4090"
    assert detect_local_gpu(FakeNvml(init_error=NVMLError_LibraryNotFound)) is None


def test_listing_and_table():
    local = detect_local_gpu(FakeNvml())
    listing = hardware_listing(BUILTIN_PROFILES, local)
    json.dumps(listing)
    assert {p["name"] for p in listing["profiles"]} == EXPECTED
    assert listing["local"]["profile"] == "h200"
    assert hardware_listing(BUILTIN_PROFILES, None)["local"] is None
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(hardware_table(BUILTIN_PROFILES, local))
    text = console.export_text()
    assert "h200 (local)" in text and "NVIDIA H200" in text
    console.print(hardware_table(BUILTIN_PROFILES, None))
    assert "no local NVIDIA GPU" in console.export_text()
