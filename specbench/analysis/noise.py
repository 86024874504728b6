"""Is the machine quiet enough for a run's timings to mean something?

What a benchmark tool such as pyperf checks, over the whole measured part of a run: the CPU time
other processes took (all CPUs' busy time minus this process's own and its children's, an engine's
own server or worker process among them), time stolen by a hypervisor,
a change of the CPU clock where it can be read, and the spread of `ar`'s repeated measurements of
the same prompt. Ratios measured in one run survive a steady background load better than absolute
times, but not a load that comes and goes, so a noisy run is flagged, not refused.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import psutil

from specbench.core.records import Noise
from specbench.methods.names import BASELINE

OTHERS_LIMIT = 0.10  # share of all CPUs' time other processes may take
STEAL_LIMIT = 0.05  # share of CPU time a hypervisor may steal
CLOCK_LIMIT = 0.10  # relative change of the CPU clock
SPREAD_LIMIT = 0.05  # coefficient of variation of ar's per-token time over repeats of one prompt
FEW_PROMPTS = 5  # below this, a bootstrap interval says little


@dataclass(frozen=True)
class Sample:
    wall: float
    busy: float  # CPU-seconds all CPUs spent busy (idle and iowait excluded), steal excluded
    steal: float
    own: float  # CPU-seconds of this process and its children, living or ended
    clock_mhz: float | None


def others_share(first: Sample, last: Sample, cpus: int | None = None) -> float:
    """The share of all CPUs' time between two samples that other processes took."""
    capacity = max(last.wall - first.wall, 1e-9) * (cpus or psutil.cpu_count() or 1)
    return max(0.0, (last.busy - first.busy) - (last.own - first.own)) / capacity


def sample() -> Sample:
    cpu = psutil.cpu_times()
    busy = sum(getattr(cpu, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))
    freq = psutil.cpu_freq()
    return Sample(time.monotonic(), busy, getattr(cpu, "steal", 0.0), own_cpu_seconds(),
                  freq.current if freq and freq.current else None)


def own_cpu_seconds() -> float:
    """CPU-seconds of this process, of its living descendants (vLLM's engine core, a server it started)
    and of the children it has waited for: none of them is another load."""
    me = psutil.Process()
    times = me.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # ended between the listing and the read
            continue
        total += times.user + times.system
    return total


class Window:
    """The share of the CPUs other processes took while a `with` block ran; None when the block was too
    short for the CPU counters (they tick every 10 ms) to tell."""

    SHORTEST_S = 1.0

    def __enter__(self) -> Window:
        self.first, self.share = sample(), None
        return self

    def __exit__(self, *exc: object) -> None:
        last = sample()
        if last.wall - self.first.wall >= self.SHORTEST_S:
            self.share = others_share(self.first, last)


class NoiseMonitor:
    """Started before the measured prompts, sampled after each of them, summarised at the end."""

    def __init__(self) -> None:
        self.load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self.cpus = psutil.cpu_count() or 1
        self.samples = [sample()]

    def restart(self) -> None:
        """Measure from now (the measured prompts), keeping the load seen before the run."""
        self.samples = [sample()]

    def busy_before(self) -> bool:
        return self.load_before is not None and self.load_before > 0.5 * self.cpus

    def tick(self) -> None:
        self.samples.append(sample())

    def summary(self, rows: pd.DataFrame) -> Noise:
        first, last = self.samples[0], self.samples[-1]
        cpus = self.cpus
        capacity = max(last.wall - first.wall, 1e-9) * cpus
        others = others_share(first, last, cpus)
        steal = (last.steal - first.steal) / capacity
        clocks = [s.clock_mhz for s in self.samples if s.clock_mhz]
        clock_change = (max(clocks) - min(clocks)) / max(clocks) if clocks else None
        spread = ar_spread(rows)
        prompts = int(rows.groupby(["prompt_id", "turn"]).ngroups) if len(rows) else 0
        reasons = []
        if others > OTHERS_LIMIT:
            reasons.append(f"other processes used {others:.0%} of the CPUs")
        if steal > STEAL_LIMIT:
            reasons.append(f"{steal:.0%} of CPU time was stolen by the hypervisor")
        if clock_change is not None and clock_change > CLOCK_LIMIT:
            reasons.append(f"the CPU clock changed by {clock_change:.0%}")
        if spread is not None and spread > SPREAD_LIMIT:
            reasons.append(f"ar's repeated timings of one prompt vary by {spread:.0%}")
        advice = []
        if reasons:
            advice.append("rerun on a quiet machine")
        if spread is None:
            advice.append("--repeats 3 measures the spread of repeated timings")
        if 0 < prompts < FEW_PROMPTS:
            advice.append(f"{prompts} prompt(s) are too few for the interval to mean much")
        return Noise(noisy=bool(reasons), reasons=reasons, advice=advice, prompts=prompts, others_cpu_share=others,
                     steal_share=steal, clock_change=clock_change, ar_spread=spread, load_before=self.load_before,
                     cpus=cpus)


def ar_spread(rows: pd.DataFrame) -> float | None:
    """Median over prompts of the coefficient of variation of ar's time per token across repeats."""
    ar = rows[rows.strategy == BASELINE] if len(rows) else rows
    if not len(ar) or ar.groupby(["prompt_id", "turn"]).size().max() < 2:
        return None
    per_token = ar.wall_s / ar.new_tokens.clip(lower=1)
    cv = per_token.groupby([ar.prompt_id, ar.turn]).agg(lambda v: v.std(ddof=1) / v.mean() if len(v) > 1 else np.nan)
    return float(cv.dropna().median())
