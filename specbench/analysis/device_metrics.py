"""Per-strategy device measurements over a run's interleaved generations.

On an NVIDIA GPU each generation runs inside an NVML sampler and the samples are pooled per
strategy (mean, p95, energy, tokens per joule); elsewhere the host's CPU utilisation and the
process's peak resident memory are recorded instead, and the summary says why NVML is absent.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import pandas as pd
import torch

from specbench.analysis.host import HostSampler, peak_rss_bytes
from specbench.analysis.nvml import NvmlSampler, open_nvml
from specbench.core.records import HostFigures


class RunMetrics:
    def __init__(self, device: torch.device):
        self.gpu = False
        self.reason = "no NVIDIA GPU (running on CPU)"
        if device.type == "cuda":
            nvml, reason = open_nvml()
            self.gpu, self.reason = nvml is not None, reason
        self.series: list[dict[str, Any]] = []
        self.elapsed: dict[str, float] = defaultdict(float)
        self.energy_j: dict[str, float] = defaultdict(float)
        self.cpu_s: dict[str, float] = defaultdict(float)
        self.unavailable: dict[str, str] = {}

    @contextmanager
    def measure(self, strategy: str) -> Iterator[None]:
        sampler = NvmlSampler(device_index=torch.cuda.current_device()) if self.gpu else HostSampler()
        with sampler:
            yield
        if not self.gpu:
            self.cpu_s[strategy] += sampler.cpu_s
            self.elapsed[strategy] += sampler.wall_s
            return
        summary = sampler.summary()
        self.series += [{"strategy": strategy, **row, "t_s": row["t_s"] + self.elapsed[strategy]}
                        for row in sampler.series_rows()]
        self.elapsed[strategy] += summary.get("duration_s", 0.0)
        self.energy_j[strategy] += summary.get("energy_j") or 0.0
        self.unavailable.update(summary.get("unavailable", {}))

    def summary(self, strategy: str, new_tokens: int) -> dict[str, Any]:
        if not self.gpu:
            wall = self.elapsed[strategy]
            return {"nvml": {"available": False, "reason": self.reason},
                    "host": HostFigures(100 * self.cpu_s[strategy] / wall if wall else None, peak_rss_bytes())}
        out: dict[str, Any] = {"available": True, "energy_j": self.energy_j[strategy],
                               "tokens_per_j": (new_tokens / self.energy_j[strategy]
                                                if self.energy_j[strategy] else None),
                               "unavailable": self.unavailable}
        frame = pd.DataFrame([r for r in self.series if r["strategy"] == strategy])
        for metric, values in frame.groupby("metric").value if len(frame) else []:
            out[f"{metric}_mean"] = float(values.mean())
            out[f"{metric}_p95"] = float(np.percentile(values, 95))
        return {"nvml": out}

    def series_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.series, columns=["strategy", "t_s", "metric", "value"])
