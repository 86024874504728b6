"""GPU profiles (`--gpu NAME`), user profiles from TOML, and detection of the local GPU via NVML.

A profile holds the figures the roofline projection needs: memory size, peak memory bandwidth,
dense (non-sparse) bf16 tensor rate, PCIe generation, and the public source of those figures.
Units are decimal: GB = 1e9 bytes, GB/s = 1e9 bytes/s, TFLOPS = 1e12 FLOP/s.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.table import Table

from specbench.analysis.nvml import device_handle, device_name, open_nvml, peak_bandwidth_gbs
from specbench.core.errors import SpecbenchError
from specbench.core.files import read_toml


@dataclass(frozen=True)
class GpuProfile:
    name: str
    memory_gb: float
    bandwidth_gbs: float
    bf16_tflops: float  # dense tensor-core rate (bf16 in, fp32 accumulate), no 2:4 sparsity
    pcie_gen: int | None  # None: no PCIe-attached accelerator (the cpu profile)
    source: str


BUILTIN_PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in [
        GpuProfile("rtx3090", 24, 936, 71, 4,
                   "NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 3090): 24 GB GDDR6X, "
                   "936 GB/s, peak BF16 tensor 71 TFLOPS dense with FP32 accumulate, PCIe 4.0"),
        GpuProfile("rtx4090", 24, 1008, 165.2, 4,
                   "NVIDIA Ada Lovelace GPU architecture whitepaper (GeForce RTX 4090): 24 GB GDDR6X, "
                   "1008 GB/s, peak BF16 tensor 165.2 TFLOPS dense with FP32 accumulate, PCIe 4.0"),
        GpuProfile("rtx5090", 32, 1792, 209.5, 5,
                   "NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090): 32 GB GDDR7, "
                   "1792 GB/s, peak BF16 tensor 209.5 TFLOPS dense with FP32 accumulate, PCIe 5.0"),
        GpuProfile("l4", 24, 300, 121, 4,
                   "NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6, 300 GB/s, "
                   "BF16 242 TFLOPS with sparsity (121 dense), PCIe 4.0 x16"),
        GpuProfile("l40s", 48, 864, 362.05, 4,
                   "NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, "
                   "BF16 tensor 362.05 TFLOPS dense (733 with sparsity), PCIe 4.0 x16"),
        GpuProfile("a10g", 24, 600, 70, 4,
                   "AWS EC2 G5 (NVIDIA A10G, no NVIDIA datasheet): 24 GB GDDR6, 600 GB/s, PCIe 4.0; "
                   "~70 TFLOPS dense bf16 tensor as commonly reported for the A10G (the A10 datasheet "
                   "gives 125); treat the compute figure as an estimate"),
        GpuProfile("a100-40g", 40, 1555, 312, 4,
                   "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM): 40 GB HBM2, 1555 GB/s, "
                   "BF16 tensor 312 TFLOPS dense (624 with sparsity), PCIe 4.0"),
        GpuProfile("a100-80g", 80, 2039, 312, 4,
                   "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 80 GB HBM2e, 2039 GB/s, "
                   "BF16 tensor 312 TFLOPS dense (624 with sparsity), PCIe 4.0"),
        GpuProfile("h100-pcie", 80, 2000, 756, 5,
                   "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe): 80 GB HBM2e, 2 TB/s, "
                   "BF16 tensor 1513 TFLOPS with sparsity (756 dense), PCIe 5.0"),
        GpuProfile("h100-sxm", 80, 3350, 989, 5,
                   "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): 80 GB HBM3, 3.35 TB/s, "
                   "BF16 tensor 1979 TFLOPS with sparsity (989 dense), PCIe 5.0"),
        GpuProfile("h200", 141, 4800, 989, 5,
                   "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141 GB HBM3e, 4.8 TB/s, "
                   "BF16 tensor 1979 TFLOPS with sparsity (989 dense), PCIe 5.0"),
        GpuProfile("b200", 180, 7700, 2250, 5,
                   "NVIDIA HGX B200 specifications (per GPU): 180 GB HBM3e, 7.7 TB/s, "
                   "FP16/BF16 tensor 4.5 PFLOPS with sparsity (2250 TFLOPS dense), PCIe 5.0"),
        GpuProfile("cpu", 8, 20, 0.1, None,
                   "estimate, not a datasheet: a generic 2-core x86 host (CI-runner class) with ~8 GB "
                   "RAM, ~20 GB/s achievable DRAM bandwidth, ~0.1 TFLOPS bf16 matmul via AVX2/FMA"),
    ]
}

_REQUIRED_KEYS = ("memory_gb", "bandwidth_gbs", "bf16_tflops", "pcie_gen")


@dataclass(frozen=True)
class LocalGpu:
    """The GPU NVML reports on this machine; bandwidth_gbs is None where NVML does not report it."""

    index: int
    name: str
    memory_gb: float
    bandwidth_gbs: float | None
    pcie_gen: int | None
    pcie_width: int | None
    profile: str | None  # the built-in profile this GPU matches, if any


def load_profiles(user_toml: Path | None = None) -> dict[str, GpuProfile]:
    """Built-in profiles, merged with (and overridden by) `[profiles.NAME]` tables from a TOML file.

    Each table needs memory_gb, bandwidth_gbs, bf16_tflops (numbers > 0) and pcie_gen (an integer,
    or 0 for none); `source` is optional. Names are case-insensitive.
    """
    profiles = dict(BUILTIN_PROFILES)
    if user_toml is None:
        return profiles
    path = Path(user_toml)
    data = read_toml(path, "GPU profile file")
    tables = data.get("profiles")
    if not isinstance(tables, dict) or not tables:
        raise SpecbenchError(f"GPU profile file {path}: expected one or more [profiles.NAME] tables")
    for raw_name, table in tables.items():
        name = raw_name.strip().lower()
        profiles[name] = _profile_from_table(path, raw_name, name, table)
    return profiles


def _profile_from_table(path: Path, raw_name: str, name: str, table: Any) -> GpuProfile:
    where = f"GPU profile file {path}: profiles.{raw_name}"
    if not isinstance(table, dict):
        raise SpecbenchError(f"{where} must be a table, got {type(table).__name__}")
    unknown = sorted(set(table) - set(_REQUIRED_KEYS) - {"source"})
    if unknown:
        raise SpecbenchError(
            f"{where}.{unknown[0]} is not a profile key (expected {', '.join(_REQUIRED_KEYS)}, source)"
        )
    values: dict[str, Any] = {}
    for key in _REQUIRED_KEYS:
        if key not in table:
            raise SpecbenchError(f"{where}.{key} is missing")
        value = table[key]
        if key == "pcie_gen":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecbenchError(f"{where}.{key} must be a non-negative integer, got {value!r}")
            values[key] = value or None
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise SpecbenchError(f"{where}.{key} must be a number > 0, got {value!r}")
            values[key] = float(value)
    source = table.get("source", f"user profile from {path}")
    if not isinstance(source, str):
        raise SpecbenchError(f"{where}.source must be a string, got {source!r}")
    return GpuProfile(name=name, source=source, **values)


def get_profile(name: str, profiles: dict[str, GpuProfile]) -> GpuProfile:
    """The profile called `name` (case-insensitive); an unknown name lists the known ones."""
    key = name.strip().lower()
    if key not in profiles:
        raise SpecbenchError(f"unknown GPU profile '{name}'; known: {', '.join(sorted(profiles))}")
    return profiles[key]


# NVML names look like "NVIDIA H200", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB",
# "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe". Each rule: (profile, tokens required, tokens that
# rule it out). Variants with different figures (RTX 4090 D, laptop parts, H100/H200 NVL, A10
# without the G, 3090 Ti) deliberately match nothing rather than the wrong profile.
_NAME_RULES: list[tuple[str, frozenset[str], frozenset[str]]] = [
    (profile, frozenset(need.split()), frozenset(veto.split()))
    for profile, need, veto in [
        ("rtx3090", "rtx 3090", "ti laptop"),
        ("rtx4090", "rtx 4090", "d laptop"),
        ("rtx5090", "rtx 5090", "d laptop"),
        ("l4", "l4", ""),
        ("l40s", "l40s", ""),
        ("a10g", "a10g", ""),
        ("a100-40g", "a100 40gb", ""),
        ("a100-80g", "a100 80gb", ""),
        ("h100-pcie", "h100 pcie", "nvl"),
        ("h100-sxm", "h100", "pcie nvl"),
        ("h200", "h200", "nvl"),
        ("b200", "b200", ""),
    ]
]


def match_profile(nvml_name: str, memory_gb: float | None = None) -> str | None:
    """Map an NVML device name to a built-in profile name, or None when none fits.

    An A100 whose name omits its size ("NVIDIA A100-PCIE") is told apart by `memory_gb`.
    """
    tokens = set(re.split(r"[^a-z0-9]+", nvml_name.lower())) - {"", "nvidia", "geforce", "tesla"}
    for profile, need, veto in _NAME_RULES:
        if need <= tokens and not veto & tokens:
            return profile
    if "a100" in tokens and memory_gb is not None:
        return "a100-80g" if memory_gb > 60 else "a100-40g"
    return None


def detect_local_gpu(pynvml_module: ModuleType | None = None, device_index: int = 0) -> LocalGpu | None:
    """Describe GPU `device_index` through NVML; None when there is no NVIDIA GPU or driver."""
    nvml, _reason = open_nvml(pynvml_module)
    if nvml is None:
        return None
    try:
        handle = device_handle(nvml, device_index)
        name = device_name(nvml, handle)
        memory_gb = nvml.nvmlDeviceGetMemoryInfo(handle).total / 1e9

        def optional(call: Any) -> Any:
            try:
                return call()
            except nvml.NVMLError:
                return None

        return LocalGpu(
            index=device_index,
            name=name,
            memory_gb=memory_gb,
            bandwidth_gbs=optional(lambda: peak_bandwidth_gbs(nvml, handle)),
            pcie_gen=optional(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
            pcie_width=optional(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
            profile=match_profile(name, memory_gb),
        )
    except nvml.NVMLError:
        return None
    finally:
        nvml.nvmlShutdown()


def is_local_gpu(profile_name: str) -> bool:
    """Whether the GPU profile `profile_name` is the local GPU (then its figures are measured, not projected)."""
    local = detect_local_gpu()
    return local is not None and local.profile == profile_name.strip().lower()


def hardware_listing(profiles: dict[str, GpuProfile], local: LocalGpu | None) -> dict[str, Any]:
    """JSON-ready view for `specbench hardware --json`: every profile and the local GPU (or null)."""
    return {
        "profiles": [asdict(profiles[name]) for name in sorted(profiles)],
        "local": asdict(local) if local is not None else None,
    }


def hardware_table(profiles: dict[str, GpuProfile], local: LocalGpu | None) -> Table:
    """Terminal table of the profiles; the one matching the local GPU is marked."""
    title = "GPU profiles"
    if local is not None:
        bw = f"{local.bandwidth_gbs:.0f} GB/s" if local.bandwidth_gbs is not None else "bandwidth n/a"
        gen = f"PCIe {local.pcie_gen}.0" if local.pcie_gen else "PCIe n/a"
        gen += f" x{local.pcie_width}" if local.pcie_width else ""
        title += f"  (local: {local.name}, {local.memory_gb:.0f} GB, {bw}, {gen})"
    else:
        title += "  (no local NVIDIA GPU)"
    table = Table(title=title)
    table.add_column("profile")
    table.add_column("memory GB", justify="right")
    table.add_column("bandwidth GB/s", justify="right")
    table.add_column("bf16 TFLOPS (dense)", justify="right")
    table.add_column("PCIe", justify="right")
    table.add_column("source (full text in --json)", overflow="fold")
    for name in sorted(profiles):
        p = profiles[name]
        label = f"{name} (local)" if local is not None and local.profile == name else name
        table.add_row(
            label,
            f"{p.memory_gb:g}",
            f"{p.bandwidth_gbs:g}",
            f"{p.bf16_tflops:g}",
            f"{p.pcie_gen}.0" if p.pcie_gen else "-",
            p.source.split(":")[0],
        )
    return table
