"""`recommend(workload)`: which strategy, with which settings, for this workload on this GPU.

Evidence first: the best candidate the results directory offers (see evidence.py and rank.py).
Without usable evidence, the prior (prior.py). Either way the prior's path is computed, so the
output can say where the evidence and the source article's rules part ways.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbench.errors import SpecbenchError
from specbench.measure.stats import BASELINE
from specbench.recommend.evidence import Candidate, Evidence, StrategyConfig, candidates_for, load_evidence
from specbench.recommend.prior import PriorOutcome, Step, evaluate
from specbench.recommend.rank import Assessed, rank, speedup_text, why_lost
from specbench.recommend.workload import CREATIVE_TASKS, HIGH_PRECISION_TASKS, Workload, check_task
from specbench.suites import load_suite


@dataclass(frozen=True)
class Runner:
    """A strategy that was not recommended, and why."""

    strategy: str
    source: str
    speedup: float | None
    ci: tuple[float, float] | None
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "source": self.source, "expected_speedup": _speedup_json(self.speedup,
                                                                                                     self.ci),
                "reason": self.reason}


@dataclass
class Recommendation:
    workload: Workload
    strategy: str
    source: str  # measured, modelled, projected or prior
    config: StrategyConfig
    speedup: float | None  # over `ar`; None from the prior, which has no figure
    ci: tuple[float, float] | None
    alternatives: list[Runner]
    path: list[Step]
    rests_on: tuple[str, ...]  # run directories and study files behind the figure
    prior: PriorOutcome
    ranking: list[Assessed]  # every candidate the evidence offered, best first
    unmatched: list[str]  # evidence that did not describe the workload, and why
    skipped: list[str]  # evidence that could not be read, and why

    @property
    def prior_agrees(self) -> bool:
        return self.prior.strategy == self.strategy

    def as_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "source": self.source,
            "config": self.config.as_json(),
            "expected_speedup": _speedup_json(self.speedup, self.ci),
            "alternatives": [a.as_json() for a in self.alternatives],
            "path": [s.as_json() for s in self.path],
            "evidence": {
                "rests_on": list(self.rests_on),
                "candidates": [_assessed_json(a) for a in self.ranking],
                "unmatched": self.unmatched,
                "skipped": self.skipped,
            },
            "prior": {"strategy": self.prior.strategy, "knobs": self.prior.knobs, "agrees": self.prior_agrees,
                      "path": [s.as_json() for s in self.prior.path]},
            "workload": {**{k: v for k, v in asdict(self.workload).items() if k != "gpu"},
                         "gpu": self.workload.gpu.name},
        }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _speedup_json(speedup: float | None, ci: tuple[float, float] | None) -> dict[str, Any] | None:
    if _finite(speedup) is None:
        return None
    return {"value": speedup, "ci": [_finite(ci[0]), _finite(ci[1])] if ci else None}


def _assessed_json(a: Assessed) -> dict[str, Any]:
    c = a.candidate
    return {"strategy": c.strategy, "source": c.source, "expected_speedup": _speedup_json(c.speedup, c.ci),
            "config": c.config.as_json(), "prompts": c.prompts, "rests_on": list(c.rests_on),
            "need_gb": a.need_bytes / 1e9 if a.need_bytes is not None else None, "excluded": a.excluded,
            "note": c.note or None}


def known_tasks(evidence: Evidence) -> set[str]:
    """Tasks `--task` accepts: the built-in suite's categories, the prior's words, the evidence's categories."""
    return set(load_suite("default").categories()) | set(HIGH_PRECISION_TASKS) | set(CREATIVE_TASKS) \
        | evidence.categories()


def recommend(workload: Workload, results: Path = Path("results"), evidence: Evidence | None = None) -> Recommendation:
    """The strategy for `workload`, from the evidence under `results` where it matches, else from the prior."""
    evidence = load_evidence(results) if evidence is None else evidence
    check_task(workload, known_tasks(evidence))
    prior = evaluate(workload)
    candidates, unmatched = candidates_for(evidence, workload)
    ranking = rank([c for c in candidates if math.isfinite(c.speedup)], workload, prior.avoid)
    matched = {path for c in candidates for path in c.rests_on}
    found = Step("evidence", "Which results describe this workload?",
                 f"{len(matched)} of {len(evidence)} runs and studies" if len(evidence) else "no results",
                 f"{len(ranking)} strategies" if ranking else "none: the prior decides")
    usable = [a for a in ranking if a.excluded is None]
    baseline = next((a for a in ranking if a.candidate.strategy == BASELINE), None)
    if baseline is not None and baseline.excluded:
        raise SpecbenchError(f"nothing fits on {workload.gpu.name}: even plain decoding {baseline.excluded} "
                             f"({', '.join(baseline.candidate.rests_on)})")
    if not usable:
        if ranking:
            found = Step(found.node, found.question, found.answer, "none usable: the prior decides")
        return Recommendation(workload, prior.strategy, "prior", StrategyConfig(prior.strategy, prior.knobs), None,
                              None, [Runner(a.strategy, "prior", None, None, a.reason) for a in prior.alternatives],
                              [found, *prior.path], (), prior, ranking, unmatched, evidence.skipped)
    winner = usable[0].candidate
    others = sorted((a for a in ranking if a.candidate is not winner), key=lambda a: -a.candidate.speedup)
    alternatives = [Runner(a.candidate.strategy, a.candidate.source, a.candidate.speedup, a.candidate.ci,
                           why_lost(a, winner)) for a in others[:2]]
    path = [found, *_evidence_steps(ranking, winner, workload, prior)]
    return Recommendation(workload, winner.strategy, winner.source, winner.config, winner.speedup, winner.ci,
                          alternatives, path, winner.rests_on, prior, ranking, unmatched, evidence.skipped)


def _evidence_steps(ranking: list[Assessed], winner: Candidate, workload: Workload, prior: PriorOutcome) -> list[Step]:
    excluded = [a for a in ranking if a.excluded]
    too_big = [a.candidate.strategy for a in excluded if a.excluded.startswith("does not fit")]
    ruled_out = [a.candidate.strategy for a in excluded if a.excluded.startswith("excluded by the prior")]
    used = f"{workload.vram_used_gb:g} GB in use" if workload.vram_used_gb is not None else "the evidence's own needs"
    steps = [Step("memory", f"What fits in {workload.gpu.memory_gb:g} GB?", used,
                  f"left out: {', '.join(too_big)}" if too_big else "everything measured fits")]
    if prior.avoid:
        steps.append(Step("rules", "Which rules of the prior bind the evidence?", "; ".join(prior.avoid.values()),
                          f"left out: {', '.join(ruled_out)}" if ruled_out else "nothing left out"))
    steps.append(Step("rank", "Which is fastest on the best evidence?",
                      f"{winner.source}: {winner.strategy} {speedup_text(winner.speedup, winner.ci)}",
                      winner.strategy + ("" if prior.strategy == winner.strategy
                                         else f" (the prior would say {prior.strategy})")))
    return steps
