"""GPU telemetry over a timed region through NVML (the `pynvml` module of nvidia-ml-py).

`NvmlSampler` runs a background thread while its `with` block runs and samples memory-controller
utilisation (a share of time, not bandwidth), DRAM bandwidth utilisation through GPM (Hopper and
newer), memory used, power, SM clock and PCIe throughput; it also takes the energy counter's delta
over the region. A metric the GPU or driver refuses is reported as unavailable with NVML's reason;
without NVML at all the sampler is disabled, says why, and the run goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any

import numpy as np

from specbench.core.errors import SpecbenchError

MIN_PERIOD_S = 0.1
"""Shortest sampling period: GPM samples must be at least 100 ms apart (NVML GPM docs)."""

UNITS = {
    "gpu_util_pct": "%",
    "mem_util_pct": "%",
    "dram_bw_util_pct": "%",
    "dram_bw_gbs": "GB/s",
    "mem_used_gb": "GB",
    "power_w": "W",
    "sm_clock_mhz": "MHz",
    "pcie_tx_mbs": "MB/s",
    "pcie_rx_mbs": "MB/s",
}
"""Every series the sampler can record, with its unit."""


def open_nvml(nvml: ModuleType | None = None) -> tuple[ModuleType | None, str | None]:
    """Import (unless given) and initialise NVML.

    Returns (module, None) when NVML is up (the caller owes one `nvmlShutdown()`), else
    (None, reason) with a one-line reason such as "no NVIDIA GPU (NVML Shared Library Not Found)".
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as err:
            return None, f"no NVIDIA GPU (pynvml not importable: {err})"
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded) as err:
        return None, f"no NVIDIA GPU ({err})"
    except nvml.NVMLError as err:
        return None, f"NVML unavailable ({err})"
    return nvml, None


def device_handle(nvml: ModuleType, device_index: int) -> Any:
    """NVML handle of GPU `device_index`; an index NVML does not see is a SpecbenchError."""
    count = nvml.nvmlDeviceGetCount()
    if not 0 <= device_index < count:
        raise SpecbenchError(f"GPU index {device_index} does not exist: NVML sees {count} GPU(s)")
    return nvml.nvmlDeviceGetHandleByIndex(device_index)


def device_name(nvml: ModuleType, handle: Any) -> str:
    """The GPU's marketing name, e.g. "NVIDIA H200" (old bindings return bytes)."""
    name = nvml.nvmlDeviceGetName(handle)
    return name.decode() if isinstance(name, bytes) else str(name)


def peak_bandwidth_gbs(nvml: ModuleType, handle: Any) -> float:
    """Theoretical DRAM bandwidth in GB/s: bus width x max memory clock x 2 (DDR) / 8.

    Raises NVMLError where the driver does not report bus width or memory clock.
    """
    bus_bits = nvml.nvmlDeviceGetMemoryBusWidth(handle)
    mem_clock_mhz = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)
    return bus_bits * mem_clock_mhz * 1e6 * 2 / 8 / 1e9


class NvmlSampler:
    """Sample one GPU in a background thread for the duration of a `with` block.

        with NvmlSampler(device_index=0, period_s=0.1) as s:
            run_the_timed_region()
        s.summary()      # mean / p95 per series, energy_j, unavailable metrics and why
        s.series_rows()  # [{"t_s", "metric", "value"}] for nvml_series.csv

    `nvml` injects a pynvml-compatible module (tests pass a fake); `peak_bandwidth_gbs` overrides
    the bandwidth NVML reports, which turns GPM's utilisation into achieved GB/s. One sampler
    measures one region: make a new one for the next.
    """

    def __init__(
        self,
        device_index: int = 0,
        period_s: float = MIN_PERIOD_S,
        nvml: ModuleType | None = None,
        peak_bandwidth_gbs: float | None = None,
    ) -> None:
        if device_index < 0:
            raise SpecbenchError(f"GPU index must be >= 0, got {device_index}")
        if not period_s > 0:
            raise SpecbenchError(f"NVML sampling period must be > 0 s, got {period_s}")
        if peak_bandwidth_gbs is not None and not peak_bandwidth_gbs > 0:
            raise SpecbenchError(f"peak bandwidth must be > 0 GB/s, got {peak_bandwidth_gbs}")
        self.device_index = device_index
        self.period_s = max(period_s, MIN_PERIOD_S)
        self.period_raised = period_s < MIN_PERIOD_S
        self.peak_bandwidth_gbs = peak_bandwidth_gbs
        self.disabled_reason: str | None = None
        self.unavailable: dict[str, str] = {}
        self.device: str | None = None
        self._nvml_arg = nvml
        self._nvml: ModuleType | None = None
        self._handle: Any = None
        self._samples: list[tuple[float, str, float]] = []
        self._ticks = 0
        self._readers: dict[str, Callable[[], float]] = {}
        self._gpm_samples: list[Any] = []
        self._energy_start_mj: int | None = None
        self.energy_j: float | None = None
        self.duration_s = 0.0
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.thread_error: str | None = None

    # -- context manager -------------------------------------------------------------------

    def __enter__(self) -> NvmlSampler:
        self._nvml, self.disabled_reason = open_nvml(self._nvml_arg)
        if self._nvml is None:
            return self
        nvml = self._nvml
        try:
            self._handle = device_handle(nvml, self.device_index)
            self.device = device_name(nvml, self._handle)
        except nvml.NVMLError as err:
            self.disabled_reason = f"NVML unavailable ({err})"
            nvml.nvmlShutdown()
            self._nvml = None
            return self
        except SpecbenchError:
            nvml.nvmlShutdown()
            raise
        self._readers = self._plain_readers()
        self._start_gpm()
        self._energy_start_mj = self._try("energy_j", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="specbench-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._nvml is None:
            return
        nvml = self._nvml
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.duration_s = time.perf_counter() - self._t0
        try:
            if self._energy_start_mj is not None:
                end = self._try("energy_j", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
                if end is not None:
                    self.energy_j = (end - self._energy_start_mj) / 1000.0
            for sample in self._gpm_samples:
                self._try("dram_bw_util_pct", lambda s=sample: nvml.nvmlGpmSampleFree(s))
            if "dram_bw_util_pct" not in self.unavailable and not self._has("dram_bw_util_pct"):
                self.unavailable["dram_bw_util_pct"] = "region shorter than two GPM samples (100 ms apart)"
        finally:
            nvml.nvmlShutdown()

    # -- results ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Flat dict: `<series>_mean`, `<series>_p95` per recorded series, energy_j, and what was
        unavailable with NVML's reason. Disabled: {"available": False, "reason": ...}."""
        if self.disabled_reason is not None:
            return {"available": False, "reason": self.disabled_reason}
        out: dict[str, Any] = {
            "available": True,
            "device": self.device,
            "device_index": self.device_index,
            "period_s": self.period_s,
            "duration_s": self.duration_s,
            "samples": self._ticks,
            "peak_bandwidth_gbs": self.peak_bandwidth_gbs,
            "energy_j": self.energy_j,
        }
        for metric in UNITS:
            values = [v for _, m, v in self._samples if m == metric]
            if values:
                out[f"{metric}_mean"] = float(np.mean(values))
                out[f"{metric}_p95"] = float(np.percentile(values, 95))
        unavailable = dict(self.unavailable)
        if "dram_bw_gbs_mean" not in out and "dram_bw_gbs" not in unavailable:
            why = unavailable.get("dram_bw_util_pct", "no samples")
            unavailable["dram_bw_gbs"] = f"needs GPM DRAM utilisation: {why}"
        out["unavailable"] = unavailable
        if self.thread_error is not None:
            out["sampler_error"] = self.thread_error
        return out

    def series_rows(self) -> list[dict[str, Any]]:
        """Every sample as {"t_s", "metric", "value"}, t_s from the start of the region."""
        return [{"t_s": t, "metric": m, "value": v} for t, m, v in self._samples]

    # -- sampling --------------------------------------------------------------------------

    def _plain_readers(self) -> dict[str, Callable[[], float]]:
        nvml, h = self._nvml, self._handle
        assert nvml is not None
        return {
            "gpu_util_pct": lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_util_pct": lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).memory),
            "mem_used_gb": lambda: nvml.nvmlDeviceGetMemoryInfo(h).used / 1e9,
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            # nvmlDeviceGetPcieThroughput reports KB/s over a 20 ms window
            "pcie_tx_mbs": lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES) / 1000.0,
            "pcie_rx_mbs": lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES) / 1000.0,
        }

    def _start_gpm(self) -> None:
        nvml, h = self._nvml, self._handle
        assert nvml is not None
        support = self._try("dram_bw_util_pct", lambda: nvml.nvmlGpmQueryDeviceSupport(h))
        if support is None:
            return
        if not support.isSupportedDevice:
            self.unavailable["dram_bw_util_pct"] = "GPM not supported on this GPU (needs Hopper or newer)"
            return
        samples = self._try("dram_bw_util_pct", lambda: [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()])
        if samples is None:
            return
        self._gpm_samples = samples
        if self._try("dram_bw_util_pct", lambda: nvml.nvmlGpmSampleGet(h, samples[0])) is None:
            return
        if self.peak_bandwidth_gbs is None:
            self.peak_bandwidth_gbs = self._try("dram_bw_gbs", lambda: peak_bandwidth_gbs(nvml, h))

    def _gpm_dram_util(self) -> float:
        """DRAM bandwidth utilisation (%) between the previous GPM sample and a new one."""
        nvml = self._nvml
        assert nvml is not None
        previous, current = self._gpm_samples
        nvml.nvmlGpmSampleGet(self._handle, current)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = previous
        request.sample2 = current
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        nvml.nvmlGpmMetricsGet(request)
        self._gpm_samples = [current, previous]
        metric = request.metrics[0]
        if metric.nvmlReturn != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(metric.nvmlReturn)
        return float(metric.value)

    def _run(self) -> None:
        try:
            self._sample(first=True)
            while not self._stop.wait(self.period_s):
                self._sample(first=False)
        except Exception as err:  # telemetry must never take the benchmark down
            self.thread_error = f"{type(err).__name__}: {err}"

    def _sample(self, first: bool) -> None:
        t = time.perf_counter() - self._t0
        self._ticks += 1
        for metric, read in self._readers.items():
            if metric not in self.unavailable:
                value = self._try(metric, read)
                if value is not None:
                    self._samples.append((t, metric, value))
        if first or not self._gpm_samples or "dram_bw_util_pct" in self.unavailable:
            return
        util = self._try("dram_bw_util_pct", self._gpm_dram_util)
        if util is None:
            return
        self._samples.append((t, "dram_bw_util_pct", util))
        if self.peak_bandwidth_gbs is not None:
            self._samples.append((t, "dram_bw_gbs", util / 100.0 * self.peak_bandwidth_gbs))

    def _try(self, metric: str, call: Callable[[], Any]) -> Any:
        """Run one NVML call; on NVMLError mark `metric` unavailable with the reason, return None."""
        assert self._nvml is not None
        try:
            return call()
        except self._nvml.NVMLError as err:
            self.unavailable.setdefault(metric, str(err) or type(err).__name__)
            return None

    def _has(self, metric: str) -> bool:
        return any(m == metric for _, m, _ in self._samples)
