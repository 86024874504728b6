"""`recommend(workload)`: which strategy, with which settings, for this workload on this GPU.

Evidence first: the best candidate the results directory offers (see evidence.py and rank.py).
Without usable evidence, the prior (prior.py). Either way the prior's path is computed, so the
output can say where the evidence and the practitioners' rules part ways.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specbench.core.engine_names import SPECBENCH
from specbench.core.errors import SpecbenchError
from specbench.methods.names import BASELINE
from specbench.plan.suites import SPEED_BENCH_CATEGORIES, load_suite
from specbench.recommender.evidence import (
    SOURCES,
    Candidate,
    Evidence,
    RunSetup,
    candidates_for,
    load_evidence,
    planned_strategies,
)
from specbench.recommender.prior import PriorOutcome, Step, evaluate
from specbench.recommender.rank import Assessed, rank, why_lost
from specbench.recommender.workload import CREATIVE_TASKS, HIGH_PRECISION_TASKS, Workload, check_task
from specbench.report.recommend_report import speedup_text


@dataclass(frozen=True)
class Runner:
    """A strategy that was not recommended, and why."""

    strategy: str
    source: str
    speedup: float | None
    ci: tuple[float, float] | None
    reason: str
    engine: str = SPECBENCH  # where its figure was measured

    def as_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "engine": self.engine, "source": self.source,
                "expected_speedup": _speedup_json(self.speedup, self.ci), "reason": self.reason}


@dataclass(frozen=True)
class Unmeasured:
    """A strategy the evidence behind the recommendation does not cover, though the prior or weaker
    evidence ranks it higher (or an interrupted tune meant to measure it): what they expect of it."""

    strategy: str
    expected: str

    def as_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "expected": self.expected}


@dataclass
class Recommendation:
    workload: Workload
    strategy: str
    source: str  # measured, modelled, projected or prior
    config: RunSetup
    speedup: float | None  # over `ar`; None from the prior, which has no figure
    ci: tuple[float, float] | None
    alternatives: list[Runner]
    path: list[Step]
    rests_on: tuple[str, ...]  # run directories and study files behind the figure
    prior: PriorOutcome
    ranking: list[Assessed]  # every candidate the evidence offered, best first
    unmatched: list[str]  # evidence that did not describe the workload, and why
    skipped: list[str]  # evidence that could not be read, and why
    unmeasured: list[Unmeasured] = field(default_factory=list)  # candidates the evidence cannot rank
    measure: str | None = None  # the command that would measure them beside the recommendation
    incomplete: list[str] = field(default_factory=list)  # why the evidence behind the answer is incomplete

    @property
    def prior_agrees(self) -> bool:
        return self.prior.strategy == self.strategy

    def as_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "engine": self.config.engine,
            "source": self.source,
            "config": self.config.as_json(),
            "expected_speedup": _speedup_json(self.speedup, self.ci),
            "alternatives": [a.as_json() for a in self.alternatives],
            "unmeasured": {"candidates": [u.as_json() for u in self.unmeasured], "command": self.measure},
            "incomplete": self.incomplete,
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
    return {"strategy": c.strategy, "engine": c.engine, "source": c.source,
            "expected_speedup": _speedup_json(c.speedup, c.ci),
            "config": c.config.as_json(), "prompts": c.prompts, "rests_on": list(c.rests_on),
            "need_gb": a.need_bytes / 1e9 if a.need_bytes is not None else None, "excluded": a.excluded,
            "note": c.note or None, "incomplete": c.incomplete or None}


def known_tasks(evidence: Evidence) -> set[str]:
    """Tasks `--task` accepts: the built-in suite's categories and SPEED-Bench's, the prior's words, the
    evidence's categories."""
    return set(load_suite("default").categories()) | set(SPEED_BENCH_CATEGORIES) | set(HIGH_PRECISION_TASKS) \
        | set(CREATIVE_TASKS) | evidence.categories()


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
        return Recommendation(workload, prior.strategy, "prior", RunSetup(prior.strategy, prior.knobs), None,
                              None, [Runner(a.strategy, "prior", None, None, a.reason) for a in prior.alternatives],
                              [found, *prior.path], (), prior, ranking, unmatched, evidence.skipped)
    winner = usable[0].candidate
    others = sorted((a for a in ranking if a.candidate is not winner), key=lambda a: -a.candidate.speedup)
    alternatives = [Runner(a.candidate.strategy, a.candidate.source, a.candidate.speedup, a.candidate.ci,
                           why_lost(a, winner), a.candidate.engine) for a in others[:2]]
    planned = planned_strategies(evidence, workload)
    unmeasured = unmeasured_candidates(winner, ranking, prior, planned)
    measure = measure_command([u.strategy for u in unmeasured], winner, workload) if unmeasured else None
    incomplete = [winner.incomplete] if winner.incomplete else []
    for record in dict.fromkeys(planned.values()):
        left = [s for s, path in planned.items() if path == record]
        incomplete.append(f"the tune that wrote {record} was also asked for {', '.join(left)} and stopped first")
    path = [found, *_evidence_steps(ranking, winner, workload, prior)]
    if unmeasured:
        path.append(Step("coverage", "Does the evidence cover what the prior or weaker evidence ranks higher?",
                         "; ".join(f"{u.strategy}: {u.expected}" for u in unmeasured),
                         f"no: {winner.strategy} is the best measured so far; measure the rest with: {measure}"))
    return Recommendation(workload, winner.strategy, winner.source, winner.config, winner.speedup, winner.ci,
                          alternatives, path, winner.rests_on, prior, ranking, unmatched, evidence.skipped,
                          unmeasured, measure, incomplete)


def unmeasured_candidates(winner: Candidate, ranking: list[Assessed], prior: PriorOutcome,
                          planned: dict[str, str]) -> list[Unmeasured]:
    """What the evidence behind `winner` leaves out: the prior's choices above it with no evidence at all,
    strategies weaker evidence puts above it, and strategies an interrupted tune planned but did not tune.
    Evidence outranks the prior only among the strategies it covers."""
    evidenced = {a.candidate.strategy for a in ranking}
    found: dict[str, str] = {}
    ranked = [(prior.strategy, "the prior's choice"),
              *((a.strategy, f"the prior's alternative: {a.reason}") for a in prior.alternatives)]
    names = [s for s, _ in ranked]
    # above the winner: what the prior puts before it; its choice alone when the prior does not name it
    for strategy, why in ranked[:names.index(winner.strategy) if winner.strategy in names else 1]:
        if strategy == BASELINE:
            continue
        if strategy not in evidenced:
            found[strategy] = f"{why}; no evidence"
    for a in ranking:
        c = a.candidate
        if a.excluded is None and SOURCES.index(c.source) > SOURCES.index(winner.source) \
                and c.speedup > winner.speedup and c.strategy != winner.strategy:
            found.setdefault(c.strategy, f"{c.source} {speedup_text(c.speedup, c.ci)}, above {winner.strategy}'s "
                                         f"{winner.speedup:.2f}x, but no {winner.source} evidence")
    for strategy in planned:
        if strategy not in evidenced:
            reason = "planned by the interrupted tune; no evidence"
            found[strategy] = f"{found[strategy]}; {reason}" if strategy in found else reason
    return [Unmeasured(s, why) for s, why in found.items()]


def measure_command(strategies: list[str], winner: Candidate, workload: Workload) -> str:
    """The command that gives `strategies` evidence of the kind behind `winner`, for this workload: a tune
    beside a tuned study, a run (with the winner, on the same prompts) beside runs."""
    tuned = any(path.endswith(".json") for path in winner.rests_on)
    names = strategies if tuned else [winner.strategy, *strategies]
    words = ["specbench", "tune" if tuned else "run", "--strategy", ",".join(names)]
    if workload.gpu.name != "cpu":
        words += ["--gpu", workload.gpu.name]
    if workload.task:
        words += ["--category", workload.task]
    if workload.model:
        words += ["--model", workload.model]
    if workload.temperature:
        words += ["--temperature", f"{workload.temperature:g}"]
    if workload.batch_size != 1 and not tuned:
        words += ["--batch-size", str(workload.batch_size)]
    return shlex.join(words)


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
