"""NvmlSampler against a fake pynvml module (no GPU needed), and the host sampler."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from specbench.analysis.host import HostSampler
from specbench.analysis.nvml import MIN_PERIOD_S, NvmlSampler, peak_bandwidth_gbs
from specbench.core.errors import SpecbenchError
from tests.helpers import FakeNvml, NVMLError_DriverNotLoaded, NVMLError_LibraryNotFound

H200_PEAK_GBS = 6144 * 3201e6 * 2 / 8 / 1e9


def no_sampler_threads() -> bool:
    return not any(t.name == "specbench-nvml" for t in threading.enumerate())


def sample_until(sampler: NvmlSampler, samples: int, timeout_s: float = 30.0) -> None:
    """Stay in the sampled region until the sampler has taken `samples` samples: on a loaded machine its
    thread may start late, so a fixed sleep could end before the samples an assertion needs."""
    deadline = time.monotonic() + timeout_s
    while sampler.summary()["samples"] < samples:
        assert time.monotonic() < deadline, "the sampler took too few samples"
        time.sleep(0.01)


def test_gpm_supported_reports_bandwidth_and_energy():
    fake = FakeNvml()
    with NvmlSampler(nvml=fake, period_s=0.1) as s:
        sample_until(s, 3)
    out = s.summary()
    assert out["available"] and out["device"] == "NVIDIA H200"
    assert out["dram_bw_util_pct_mean"] == pytest.approx(42.0)
    assert out["peak_bandwidth_gbs"] == pytest.approx(H200_PEAK_GBS)
    assert out["dram_bw_gbs_mean"] == pytest.approx(0.42 * H200_PEAK_GBS)
    assert out["dram_bw_gbs_p95"] == pytest.approx(0.42 * H200_PEAK_GBS)
    assert out["mem_util_pct_mean"] == 70 and out["gpu_util_pct_p95"] == 90
    assert out["mem_used_gb_mean"] == pytest.approx(40.0)
    assert out["power_w_mean"] == pytest.approx(450.0)
    assert out["sm_clock_mhz_mean"] == 1980
    assert out["pcie_tx_mbs_mean"] == pytest.approx(2.0) and out["pcie_rx_mbs_mean"] == pytest.approx(0.5)
    assert out["energy_j"] == pytest.approx(1.5)
    assert out["unavailable"] == {}
    assert out["samples"] >= 3
    assert fake.gpm_frees == 2 and fake.inits == fake.shutdowns == 1
    rows = s.series_rows()
    assert {r["metric"] for r in rows} >= {"dram_bw_util_pct", "mem_util_pct", "power_w"}
    assert all(r["t_s"] >= 0 for r in rows)
    assert no_sampler_threads()


def test_peak_bandwidth_can_be_given():
    with NvmlSampler(nvml=FakeNvml(unsupported=("bus_width",)), peak_bandwidth_gbs=4800.0) as s:
        sample_until(s, 2)  # bandwidth is read between two GPM samples
    assert s.summary()["dram_bw_gbs_mean"] == pytest.approx(0.42 * 4800.0)


def test_gpm_not_supported_error():
    with NvmlSampler(nvml=FakeNvml(gpm="raise")) as s:
        sample_until(s, 1)
    out = s.summary()
    assert out["available"]
    assert out["unavailable"]["dram_bw_util_pct"] == "Not Supported"
    assert "Not Supported" in out["unavailable"]["dram_bw_gbs"]
    assert "dram_bw_util_pct_mean" not in out
    assert out["mem_util_pct_mean"] == 70  # the other metrics still sampled


def test_gpm_absent_on_pre_hopper_gpu():
    with NvmlSampler(nvml=FakeNvml(gpm=False, name="NVIDIA GeForce RTX 4090")) as s:
        pass
    assert "Hopper" in s.summary()["unavailable"]["dram_bw_util_pct"]


def test_region_shorter_than_two_gpm_samples():
    with NvmlSampler(nvml=FakeNvml()) as s:
        pass
    assert "shorter" in s.summary()["unavailable"]["dram_bw_util_pct"]


def test_unsupported_metrics_reported_with_reason():
    with NvmlSampler(nvml=FakeNvml(unsupported=("power", "energy", "pcie"))) as s:
        sample_until(s, 1)
    out = s.summary()
    assert out["unavailable"]["power_w"] == "Not Supported"
    assert out["unavailable"]["energy_j"] == "Not Supported"
    assert out["unavailable"]["pcie_tx_mbs"] == "Not Supported"
    assert out["energy_j"] is None and "power_w_mean" not in out
    assert out["mem_util_pct_mean"] == 70


@pytest.mark.parametrize("error", [NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded])
def test_no_gpu_disables_sampler_and_run_goes_on(error):
    ran = False
    with NvmlSampler(nvml=FakeNvml(init_error=error)) as s:
        ran = True
    assert ran
    out = s.summary()
    assert out["available"] is False
    assert out["reason"].startswith("no NVIDIA GPU (")
    assert no_sampler_threads()


def test_pynvml_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with NvmlSampler() as s:
        pass
    assert s.summary()["reason"].startswith("no NVIDIA GPU (pynvml not importable")


def test_short_period_raised_to_100ms():
    s = NvmlSampler(nvml=FakeNvml(), period_s=0.01)
    assert s.period_s == MIN_PERIOD_S and s.period_raised
    with s:
        time.sleep(0.35)
    assert s.summary()["period_s"] == MIN_PERIOD_S
    assert s.summary()["samples"] <= 6  # ~4 at 100 ms, not ~35 at 10 ms
    assert not NvmlSampler(nvml=FakeNvml(), period_s=0.5).period_raised


def test_thread_stops_when_body_raises():
    fake = FakeNvml()
    with pytest.raises(RuntimeError, match="boom"):
        with NvmlSampler(nvml=fake, period_s=0.1):
            time.sleep(0.05)
            raise RuntimeError("boom")
    assert no_sampler_threads()
    assert fake.shutdowns == 1


def test_bad_arguments():
    with pytest.raises(SpecbenchError, match="period"):
        NvmlSampler(period_s=0)
    with pytest.raises(SpecbenchError, match="index"):
        NvmlSampler(device_index=-1)
    with pytest.raises(SpecbenchError, match="does not exist"):
        with NvmlSampler(device_index=3, nvml=FakeNvml()):
            pass


def test_peak_bandwidth_formula():
    fake = FakeNvml()
    assert peak_bandwidth_gbs(fake, "h") == pytest.approx(4917.0, abs=1.0)


def test_host_sampler():
    with HostSampler() as h:
        started = time.process_time()
        while time.process_time() - started < 0.1:  # 0.1 s of this process's CPU time
            pass
    out = h.summary()
    assert out["wall_s"] >= 0.1 and out["cpu_s"] >= 0.08  # the CPU clock ticks every 10 ms
    assert 0 <= out["cpu_util_pct"] <= 100 * (out["cpu_count"] or 1) + 50
    assert out["peak_rss_bytes"] > 10_000_000  # a Python process with numpy and pandas loaded
    assert out["cpu_source"] in {"psutil", "os.times"}
