"""The held-out check: the tuned configuration and the defaults on prompts the study never saw, paired.

Prompts are split by the seed before the study starts; the tuning part is what trials see. Afterwards
`ar`, the tuned configuration and the defaults run on each held-out prompt back to back (the two
configurations in alternating order), and both speedups are reported with their per-prompt intervals:
a setting that only fits the tuning prompts shows up as a gain that vanishes here.
"""

from __future__ import annotations

import random

import numpy as np

from specbench.analysis.stats import geometric_mean_ci
from specbench.core.records.study_records import Gain, Holdout, Speedups
from specbench.methods.build import Strategy
from specbench.plan.suites import SuiteItem
from specbench.tuning.objective import Evaluator, TrialFailure
from specbench.tuning.study_config import check_splittable


def split_items(items: tuple[SuiteItem, ...], fraction: float, seed: int) -> tuple[list[SuiteItem], list[SuiteItem]]:
    """(tuning, held-out) suite items, chosen by the seed; each part keeps the suite's order."""
    check_splittable(len(items))  # prepare may have dropped prompts that do not fit the context
    count = min(len(items) - 1, max(1, round(fraction * len(items))))
    held = set(random.Random(seed).sample(range(len(items)), count))
    return ([item for i, item in enumerate(items) if i not in held],
            [item for i, item in enumerate(items) if i in held])


def interval(values: dict[str, float], seed: int) -> Speedups:
    """Geometric mean of per-prompt values and its 95% bootstrap interval."""
    centre, low, high = geometric_mean_ci(np.array(list(values.values())), seed)
    return Speedups(centre, [low, high], len(values))


def paired_gain(tuned: dict[str, float], defaults: dict[str, float], seed: int) -> Gain:
    """The tuned configuration over the defaults, prompt by prompt: geometric mean and interval."""
    common = [k for k in tuned if k in defaults]
    if not common:
        return Gain(None, [None, None], 0)
    centre, low, high = geometric_mean_ci(np.array([tuned[k] / defaults[k] for k in common]), seed)
    return Gain(centre, [low, high], len(common))


def holdout_check(evaluator: Evaluator, tuned: Strategy, defaults: Strategy, seed: int) -> tuple[Holdout, Gain]:
    """Both configurations on the evaluator's (held-out) prompts, with ar measured afresh before each; and the
    tuned one's gain over the defaults there."""
    values: dict[str, dict[str, float]] = {"tuned": {}, "defaults": {}}
    failures: list[str] = []
    for i, unit in enumerate(evaluator.units):
        if evaluator.profile is None:
            evaluator.measure_ar(unit)
        order = [("tuned", tuned), ("defaults", defaults)]
        for label, strategy in order if i % 2 == 0 else order[::-1]:
            try:
                values[label][unit.id] = evaluator.value(strategy, unit, evaluator.run(strategy, unit))
            except TrialFailure as exc:
                failures.append(f"{label}: {exc}")
    measured = {label: interval(v, seed) for label, v in values.items() if v}
    return Holdout(**measured, failures=failures), paired_gain(values["tuned"], values["defaults"], seed)
