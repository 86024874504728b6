"""What every `specbench tune` study does with its trials, in process (study_runner.py) or at a load
(serve_study.py): run them with a progress callback, count them, and record the study and its best."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

import optuna
from optuna.trial import TrialState

from specbench.core.records import StudyRecord
from specbench.core.records.study_records import DefaultsTrial, FailedTrial, PruningSaved, TrialCounts, TrialWalls
from specbench.tuning.objective import Evaluator, TrialFailure
from specbench.tuning.outputs import importances
from specbench.tuning.storage import display_url
from specbench.tuning.study import FAIL_REASON, MEMORY_CONSTRAINT, best_trial, counted_trials, defaults_trial
from specbench.tuning.study_space import StudySpace

# study, trials with an outcome, the study's total, the best value so far, the trial that just finished
Progress = Callable[[str, int, int, "float | None", optuna.trial.FrozenTrial], None]


@dataclass
class TuneReport:
    studies: list[StudyRecord]  # each study's record, as written under results/tuned/
    ranking: list[dict[str, Any]]  # several strategies: ordered by the tuned held-out speedup

    def as_json(self) -> dict[str, Any]:
        if len(self.studies) == 1:
            return self.studies[0].as_dict()
        return {"studies": [s.as_dict() for s in self.studies], "ranking": self.ranking}


def optimize(study: optuna.Study, evaluator: Evaluator, space: StudySpace, quota: int, trials: int,
              timeout: float | None, progress: Progress | None) -> None:
    def after_trial(study: optuna.Study, trial) -> None:
        done = len(counted_trials(study))
        if progress:
            best = best_trial(study)
            progress(study.study_name, done, trials, best.values[0] if best else None, trial)
        if done >= trials:
            study.stop()

    study.optimize(lambda trial: evaluator.objective(trial, space), n_trials=quota, timeout=timeout,
                   catch=(TrialFailure,), callbacks=[after_trial])


Record = TypeVar("Record", bound=StudyRecord)


def new_record(kind: type[Record], study: optuna.Study, url: str, trials: int, per_trial: int,
               **fields: Any) -> Record:
    """A study's record of `kind`: what every study records of itself (its name and storage, its trials
    counted with `per_trial` prompts or requests each, when, the defaults' trial) and `fields`, the rest of
    its kind's; no best trial yet (set_best)."""
    defaults = defaults_trial(study)
    return kind(study=study.study_name, storage=display_url(url), trials=trial_counts(study, per_trial),
                target_trials=trials, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                best_params=None, best_value=None, toml=None, plots=[],
                defaults=None if defaults is None else DefaultsTrial(defaults.number, defaults.params,
                                                                     defaults.values[0]), **fields)


def set_best(record: StudyRecord, study: optuna.Study, best: optuna.trial.FrozenTrial,
             space: StudySpace) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The best trial's entries of `record`, which every study records; its knobs and controller."""
    knobs, controller = space.run_settings(best.params)
    record.best_trial, record.best_params, record.best_value = best.number, best.params, best.values[0]
    record.knobs, record.controller, record.importances = knobs, controller, importances(study)
    return knobs, controller


def trial_counts(study: optuna.Study, prompts: int) -> TrialCounts:
    counted = counted_trials(study)
    by_state = {state: [t for t in counted if t.state == state]
                for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    complete, pruned = by_state[TrialState.COMPLETE], by_state[TrialState.PRUNED]

    def mean_wall(trials: list) -> float | None:
        walls = [t.user_attrs["wall_s"] for t in trials if "wall_s" in t.user_attrs]
        return sum(walls) / len(walls) if walls else None

    run = sum(t.user_attrs.get("prompts", 0) for t in pruned)
    return TrialCounts(
        len(counted), len(complete), len(pruned), len(by_state[TrialState.FAIL]),
        sum(1 for t in complete if t.constraints.get(MEMORY_CONSTRAINT, 0.0) > 0),
        TrialWalls(mean_wall(complete), mean_wall(pruned)),
        PruningSaved(len(pruned) * prompts - run, len(pruned) * prompts),
        [FailedTrial(t.number, t.user_attrs[FAIL_REASON]) for t in by_state[TrialState.FAIL]])
