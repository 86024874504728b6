"""Ranking candidates: what fits and what the rules allow, then the best evidence, then the speedup.

Evidence ranks by source first (measured over modelled over projected: a roofline is a model, a
measurement is not), then by speedup; one candidate per strategy, its best configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.recommender.evidence import SOURCES, Candidate
from specbench.recommender.prior import members
from specbench.recommender.workload import Workload
from specbench.report.recommend_report import speedup_text


@dataclass(frozen=True)
class Assessed:
    candidate: Candidate
    need_bytes: float | None  # memory the workload needs with this strategy, None when unknown
    excluded: str | None  # why it cannot be recommended; None when it can


def assess(candidate: Candidate, workload: Workload, avoid: dict[frozenset[str], str]) -> Assessed:
    """Memory fit and the prior's hard constraints for one candidate.

    With --vram-used (what the deployment uses with plain decoding) the need is that plus what the
    strategy adds over `ar` in the same evidence; without it, the strategy's own need.
    """
    need = candidate.need_bytes
    if need is not None and workload.vram_used_gb is not None and candidate.baseline_bytes is not None:
        need = workload.vram_used_gb * 1e9 + max(need - candidate.baseline_bytes, 0.0)
    capacity = workload.gpu.memory_gb * 1e9
    for pair, reason in avoid.items():
        if pair <= members(candidate.strategy):
            return Assessed(candidate, need, f"excluded by the prior: {reason}")
    if need is not None and need > capacity:
        return Assessed(candidate, need, f"does not fit: needs {need / 1e9:.1f} GB of {capacity / 1e9:g} GB")
    return Assessed(candidate, need, None)


def rank(candidates: list[Candidate], workload: Workload, avoid: dict[frozenset[str], str]) -> list[Assessed]:
    """Best first: recommendable before excluded, then by source, then by speedup; one per strategy."""
    # for a deployment on one engine, that engine's figures first: vLLM's speedups are not specbench's
    assessed = sorted((assess(c, workload, avoid) for c in candidates),
                      key=lambda a: (a.excluded is not None,
                                     workload.engine is not None and a.candidate.engine != workload.engine,
                                     SOURCES.index(a.candidate.source), -a.candidate.speedup))
    best: dict[str, Assessed] = {}
    for a in assessed:
        best.setdefault(a.candidate.strategy, a)
    return list(best.values())


def why_lost(loser: Assessed, winner: Candidate) -> str:
    """One line on why `loser` was not recommended over `winner`."""
    c = loser.candidate
    figure = f"{c.source} {speedup_text(c.speedup, c.ci)}"
    if loser.excluded:
        return f"{figure}, but {loser.excluded}"
    if c.engine != winner.engine:
        return f"{figure} in {c.engine}; the deployment's engine ({winner.engine}) ranks first"
    if SOURCES.index(c.source) > SOURCES.index(winner.source):
        return f"{figure}; {winner.source} evidence ranks first"
    text = f"{figure}, below {winner.strategy}'s {winner.speedup:.2f}x"
    if c.ci and winner.ci and c.ci[1] >= winner.ci[0]:
        text += " (the intervals overlap: not a clear loss)"
    return text
