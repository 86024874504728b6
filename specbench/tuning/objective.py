"""The objective of a trial: one configuration measured on the study's prompts, paired with `ar`.

Each prompt's value is the paired per-token speedup over `ar` on that prompt (or, projected onto a GPU
profile that is not the local device, the roofline speedup of the shape the prompt's run measured),
and the trial's value is their geometric mean. `ar`'s time on a prompt is measured once and measured
again once it is `AR_REFRESH_TRIALS` of this worker's trials old, because machine load drifts. Every
run is checked against `ar`'s greedy output; a difference fails the trial with the reason stored.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from specbench.analysis.hardware import GpuProfile
from specbench.analysis.lossless import first_divergence, mismatch_detail
from specbench.analysis.projection import memory_fit, project, workload_shape
from specbench.analysis.stats import geometric_mean, paired_speedups, tau
from specbench.bench.decode_groups import prompt_seed, run_one
from specbench.bench.measuring import make_row
from specbench.bench.prepare import PreparedRun
from specbench.core.errors import SpecbenchError
from specbench.core.records import Row, rows_frame
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import answer_text, encode_turn
from specbench.methods.build import Strategy
from specbench.methods.names import StrategyName
from specbench.plan.suites import SuiteItem
from specbench.tuning.study import FAIL_REASON, MEMORY_CONSTRAINT, PER_PROMPT
from specbench.tuning.study_space import StudySpace

AR_REFRESH_TRIALS = 4  # re-measure ar on a prompt once its time is this many trials old


class TrialFailure(Exception):
    """A configuration that cannot be measured or is not lossless; the trial fails with this reason."""


@dataclass
class Unit:
    """One prompt of the study: a suite item's turn, its token ids, its seed and `ar`'s latest run there."""

    id: str
    item: SuiteItem
    turn: int
    prompt: list[int]
    seed: int
    ar_row: Row | None = None
    ar_age: int = 0  # this worker's trial count when ar_row was measured
    greedy_reference: list[int] | None = None  # ar's greedy output, for the check of sampling studies


@dataclass
class Measured:
    """What one configuration did on some prompts."""

    values: dict[str, float]  # prompt id -> speedup (projected or measured)
    rows: list[Row]

    @property
    def value(self) -> float:
        return geometric_mean(list(self.values.values()))


class Evaluator:
    """Runs configurations of one strategy on a fixed list of prompts, paired with `ar`."""

    def __init__(self, bench: PreparedRun, items: list[SuiteItem], profile: GpuProfile | None):
        self.bench = bench
        self.ar = bench.strategies[0]
        self.engine = bench.backends[self.ar.engine]  # the engine the study measures in
        self.profile = profile  # set: the projected objective on this profile
        self.trials = 0
        self.units = self._encode(items)

    def _encode(self, items: list[SuiteItem]) -> list[Unit]:
        """Token ids of every turn; a later turn's context holds ar's own earlier answers, as in `run`."""
        tokenizer = self.bench.target.tokenizer
        units = []
        for item in items:
            answers: list[str] = []
            for turn in range(len(item.turns)):
                unit_id = f"{item.id}/{turn}"
                unit = Unit(unit_id, item, turn, encode_turn(tokenizer, item, turn, answers),
                            prompt_seed(self.bench.config.seed, item, turn))
                self.measure_ar(unit)
                answers.append(answer_text(tokenizer, unit.ar_row.output_ids))
                units.append(unit)
        return units

    def measure_ar(self, unit: Unit) -> float | None:
        """Run ar on the unit; the ratio of the new rate to the previous one, if there was one."""
        previous = unit.ar_row
        unit.ar_row = self._row(self.ar, unit, run_one(self.bench, self.ar, unit.prompt, unit.seed), None)
        unit.ar_age = self.trials
        if previous is None:
            return None
        return (unit.ar_row.new_tokens / unit.ar_row.wall_s) / (previous.new_tokens / previous.wall_s)

    def _row(self, strategy: Strategy, unit: Unit, gen, reference: list[int] | None) -> Row:
        # no process peak: on one long-lived process it is one high-water mark for the whole study
        return make_row(self.bench.target.model, strategy, unit.item, unit.turn, 0, unit.prompt, gen, reference, 0)

    def build(self, spec: StrategyName, knobs: dict[str, dict[str, Any]], controller: str | None) -> Strategy:
        """The configuration to measure, in the study's engine (with --engine vllm, a vLLM engine of its own)."""
        return self.engine.strategy(spec, knobs, controller)

    def release(self, strategy: Strategy) -> None:
        """Free what a configuration holds once it is measured (a vLLM engine's processes)."""
        self.engine.release(strategy)

    def run(self, strategy: Strategy, unit: Unit) -> Row:
        """One generation of `strategy` on `unit`, its row checked against ar's greedy output."""
        greedy = self.bench.sampling.greedy
        gen = run_one(self.bench, strategy, unit.prompt, unit.seed)
        row = self._row(strategy, unit, gen, unit.ar_row.output_ids if greedy else None)
        if row.mismatch:
            margins = [row.divergence_margin] if row.divergence_margin is not None else []
            raise TrialFailure(f"lossless check failed on prompt {unit.id}: the output differs from ar's"
                               + mismatch_detail([row.first_divergence], margins))
        return row

    def greedy_check(self, strategy: Strategy, unit: Unit) -> None:
        """A sampling study's losslessness check: the same configuration decoded greedily must equal ar."""
        greedy = dataclasses.replace(self.bench, sampling=Sampling())
        if unit.greedy_reference is None:
            unit.greedy_reference = run_one(greedy, self.ar, unit.prompt, unit.seed).tokens
        tokens = run_one(greedy, strategy, unit.prompt, unit.seed).tokens
        first = first_divergence(tokens, unit.greedy_reference)
        if first is not None:
            raise TrialFailure(f"lossless check failed on prompt {unit.id}: greedy decoding differs from ar's "
                               f"at token {first}")

    def value(self, strategy: Strategy, unit: Unit, row: Row) -> float:
        if self.profile is not None:
            shape = workload_shape(self.bench.target.model, strategy.drafter, rows_frame([row]))
            return float(project(shape, self.profile)["speedup"])
        return float(paired_speedups(rows_frame([unit.ar_row, row])).iloc[1])

    def memory(self, strategy: Strategy, rows: list[Row]) -> tuple[float, float | None]:
        """Bytes the configuration needs, and (projected) its constraint: GB needed beyond the profile's."""
        if self.profile is None:
            return float(max(r.memory_bytes for r in rows)), None
        fits, need_gb, have_gb = memory_fit(workload_shape(self.bench.target.model, strategy.drafter,
                                                           rows_frame(rows)), self.profile)
        return need_gb * 1e9, need_gb - have_gb

    def objective(self, trial: optuna.Trial, space: StudySpace) -> float | tuple[float, float]:
        """Optuna's objective: sample a point, measure it prompt by prompt in a shuffled order, prune early."""
        started = time.perf_counter()
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        knobs, controller = space.run_settings(space.space.suggest(trial))
        try:
            try:
                strategy = self.build(space.spec, knobs, controller)
            except SpecbenchError as exc:
                raise TrialFailure(str(exc)) from None
            try:
                return self._measure_trial(trial, strategy, started)
            finally:
                self.release(strategy)
        except TrialFailure as exc:
            trial.set_user_attr(FAIL_REASON, str(exc))
            raise
        finally:
            self.trials += 1

    def _measure_trial(self, trial: optuna.Trial, strategy: Strategy, started: float) -> float | tuple[float, float]:
        steps = list(range(len(self.units)))
        random.Random(f"{self.bench.config.seed}/{trial.number}").shuffle(steps)
        single = len(trial.study.directions) == 1
        if not self.bench.sampling.greedy:
            self.greedy_check(strategy, self.units[steps[0]])
        measured = Measured({}, [])
        drift: list[float] = []
        for step in steps:
            unit = self.units[step]
            if self.profile is None and self.trials - unit.ar_age >= AR_REFRESH_TRIALS:
                drift.append(self.measure_ar(unit))
            row = self.run(strategy, unit)
            measured.rows.append(row)
            measured.values[unit.id] = self.value(strategy, unit, row)
            if single:
                trial.report(measured.values[unit.id], step)
                if len(measured.values) < len(steps) and trial.should_prune():  # a finished trial completes
                    self._record(trial, strategy, measured, drift, started)
                    raise optuna.TrialPruned(f"clearly worse than the best after {len(measured.values)} prompts")
        memory = self._record(trial, strategy, measured, drift, started)
        return measured.value if single else (measured.value, memory)

    def _record(self, trial: optuna.Trial, strategy: Strategy, measured: Measured, drift: list[float],
                started: float) -> float:
        memory, constraint = self.memory(strategy, measured.rows)
        rows = rows_frame(measured.rows)
        attrs = {PER_PROMPT: measured.values, "prompts": len(measured.values), "memory_bytes": memory,
                 "tau": tau(rows), "wall_s": time.perf_counter() - started}
        if drift:
            attrs["ar_remeasured"] = len(drift)
            attrs["ar_drift"] = float(np.median(drift))  # ar's new tokens/s over its previous, on those prompts
        if constraint is not None:
            trial.set_constraint(MEMORY_CONSTRAINT, constraint)  # Optuna's constraint API: feasible when <= 0
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return memory
