"""Host-side measurement over a timed region: this process's CPU use and peak resident memory.

Same shape as the NVML sampler (`with HostSampler() as h: ...; h.summary()`), but nothing runs in
the background: CPU time is read at both ends, and peak RSS is the kernel's high-water mark.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

try:
    import psutil
except ImportError:  # optional: os.times and resource cover Linux and macOS
    psutil = None

try:
    import resource
except ImportError:  # Windows
    resource = None


def cpu_seconds() -> tuple[float, str]:
    """User + system CPU seconds used by this process so far, and which source measured it."""
    if psutil is not None:
        times = psutil.Process().cpu_times()
        return times.user + times.system, "psutil"
    times = os.times()
    return times.user + times.system, "os.times"


def cpu_name() -> str:
    """The processor's model name (Linux /proc/cpuinfo), else what the platform module reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_rss_bytes() -> int | None:
    """Peak resident memory of this process since it started (None where no source reports it)."""
    if resource is not None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS bytes, Linux KiB
    if psutil is not None:
        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))
    return None


class HostSampler:
    """CPU utilisation of this process over a `with` block, and its peak resident memory.

    summary(): wall_s, cpu_s, cpu_util_pct (100 = one core busy for the whole region; can exceed
    100 with several threads), cpu_count, cpu_source, peak_rss_bytes (the process's high-water
    mark since start, which includes anything before the region).
    """

    def __init__(self) -> None:
        self._t0 = 0.0
        self._cpu0 = 0.0
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.cpu_source = ""
        self.peak_rss_bytes: int | None = None

    def __enter__(self) -> HostSampler:
        self._cpu0, self.cpu_source = cpu_seconds()
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self.cpu_s = cpu_seconds()[0] - self._cpu0
        self.peak_rss_bytes = peak_rss_bytes()

    def summary(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "cpu_util_pct": 100.0 * self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0,
            "cpu_count": os.cpu_count(),
            "cpu_source": self.cpu_source,
            "peak_rss_bytes": self.peak_rss_bytes,
        }
