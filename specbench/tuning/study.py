"""Studies: created once with their identity, resumed by name, refused when asked to change what they measure.

A study's identity (strategy, search space, objectives, GPU profile, model and workload) is stored
as a study attribute when it is created. Opening the same name again resumes it only when every part
matches, so trials measured for one question are never mixed with another's; a mismatch is refused
before anything is written.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from specbench.analysis.hardware import is_local_gpu
from specbench.core.errors import SpecbenchError
from specbench.methods.names import StrategyName
from specbench.tuning.storage import default_storage, display_url, local_file, open_storage
from specbench.tuning.study_config import TuneConfig

IDENTITY = "specbench"  # study attribute: what the study measures
DEFAULTS = "defaults"  # trial attribute: the defaults' trial
FAIL_REASON = "fail_reason"  # trial attribute: why a trial failed
PER_PROMPT = "per_prompt"  # trial attribute: {prompt id: its value}
MEMORY_CONSTRAINT = "memory_gb"  # trial constraint: GB needed beyond the profile's memory, feasible when <= 0
IDENTITY_WAIT_S = 10.0  # another machine may have created the study and not yet written its identity


def open_study(storage: BaseStorage, name: str, identity: dict[str, Any], where: str,
               sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner) -> tuple[optuna.Study, bool]:
    """The study `name`, created with `identity` or resumed when its identity matches; (study, created)."""
    directions = [StudyDirection.MAXIMIZE if d == "maximize" else StudyDirection.MINIMIZE
                  for d in identity["directions"]]
    try:
        storage.create_new_study(directions, name)
        created = True
    except DuplicatedStudyError:
        created = False
    study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    if created:
        study.set_user_attr(IDENTITY, identity)
    else:
        check_identity(study, identity, where)
    return study, created


def projects(gpu: str | None) -> bool:
    """Whether the objective on --gpu `gpu` is projected: a profile that is not the local GPU."""
    return gpu is not None and not is_local_gpu(gpu)


def question(config: TuneConfig, spec: StrategyName) -> dict[str, Any]:
    """The part of a study's identity known before anything is loaded: what is asked of it."""
    workload = config.workload
    asked = {
        "strategy": spec.name, "fixed": {"knobs": workload.knobs, "controller": workload.controller},
        "objectives": config.objectives, "directions": list(config.directions),
        "gpu": workload.gpu, "projected": projects(workload.gpu),
        "workload": {"suite": workload.suite, "categories": list(workload.categories), "limit": workload.limit,
                     "max_new_tokens": workload.max_new_tokens, "temperature": workload.temperature,
                     "top_p": workload.top_p, "top_k": workload.top_k, "dtype": workload.dtype,
                     "seed": workload.seed, "holdout": config.holdout},
    }
    if workload.dataset is not None:  # studies of a suite keep the names they had before --dataset
        asked["workload"].update(dataset=workload.dataset, multi_turn=workload.multi_turn)
    if config.load is not None:  # a study on servers: its load, its SLO and the servers' own arguments
        asked["serve"] = {"load": config.load.key, "slo": config.slo, "engine_args": workload.engine_args}
    return asked


def study_names(config: TuneConfig) -> dict[str, str] | None:
    """--study's name of each strategy's study (suffixed by the strategy when several); None without --study."""
    specs = config.specs()
    if not config.study:
        return None
    return {s.name: f"{config.study}-{s.name}" if len(specs) > 1 else config.study for s in specs}


def open_checked(config: TuneConfig) -> str:
    """The storage's URL, with every named study in it that was created for another question refused: the
    checks that need no model, done before any is loaded. A storage file that does not exist yet holds no
    study and is not created here (a refused command writes nothing)."""
    url = config.storage or default_storage(config.workload.out)
    file = local_file(url)
    if file is not None and not file.exists():
        if config.storage is not None and not file.parent.is_dir():
            raise SpecbenchError(f"cannot open storage {display_url(url)}: its directory {file.parent} does not "
                                 "exist")
        return url
    storage = open_storage(url, config.heartbeat_s)
    names = study_names(config) or {}
    existing = {s.study_name for s in storage.get_all_studies()}
    for spec in config.specs():
        if names.get(spec.name) in existing:
            study = optuna.load_study(study_name=names[spec.name], storage=storage)
            check_identity(study, question(config, spec), display_url(url))
    return url


def create_storage(url: str, heartbeat_s: int) -> BaseStorage:
    """open_storage, with the directory of a local storage file made first (the default's OUT/tuning/)."""
    file = local_file(url)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
    return open_storage(url, heartbeat_s)


def _stored_identity(study: optuna.Study) -> dict[str, Any] | None:
    deadline = time.monotonic() + IDENTITY_WAIT_S
    while True:
        stored = study.user_attrs.get(IDENTITY)
        if stored is not None or study.get_trials(deepcopy=False) or time.monotonic() > deadline:
            return stored
        time.sleep(0.5)


def check_identity(study: optuna.Study, identity: dict[str, Any], where: str) -> None:
    """Refuse, naming the first difference, a study created for another question (`identity` may hold
    only some of the keys: those known so far)."""
    name = study.study_name
    stored = _stored_identity(study)
    again = "give another --study name"
    if stored is None:
        raise SpecbenchError(f"study {name} in {where} was not created by specbench tune; {again}")
    if stored.get("strategy") != identity["strategy"]:
        raise SpecbenchError(f"study {name} in {where} tunes {stored.get('strategy')}, not {identity['strategy']}; "
                             f"{again}")
    if "space" in identity and stored.get("space") != identity["space"]:
        old, new = stored.get("space_text", {}), identity["space_text"]
        diff = next((f"{k}: {old.get(k, 'absent')} here {new.get(k, 'absent')}" for k in {**old, **new}
                     if old.get(k) != new.get(k)), "")
        raise SpecbenchError(f"study {name} in {where} was created with another search space for "
                             f"{identity['strategy']} (was {diff}); {again}")
    if "fixed" in identity and stored.get("fixed") != identity["fixed"]:
        raise SpecbenchError(f"study {name} in {where} was created with another search space for "
                             f"{identity['strategy']} (held fixed: {stored.get('fixed')} here {identity['fixed']}); "
                             f"{again}")
    for key in identity:
        if key not in ("space_text", "fixed") and stored.get(key) != identity[key]:
            raise SpecbenchError(f"study {name} in {where} was created for {key} {stored.get(key)!r}, "
                                 f"not {identity[key]!r}; {again}")


def counted_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Trials with an outcome: a value, a pruning, or a failure with its reason. A trial whose worker died
    or was interrupted has none and is not counted (an RDB storage retries it with the same parameters)."""
    return [t for t in study.get_trials(deepcopy=False)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            or (t.state == TrialState.FAIL and FAIL_REASON in t.user_attrs)]


def enqueue_defaults(study: optuna.Study, point: dict[str, Any]) -> None:
    """Queue the defaults unless they have run, are running or are waiting: the first trial is the
    defaults, so the study's best is never worse than them on its own measurements."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(DEFAULTS) and (t.state != TrialState.FAIL or FAIL_REASON in t.user_attrs):
            return
    study.enqueue_trial(point, user_attrs={DEFAULTS: True})


def make_sampler(seed: int, trials: int) -> optuna.samplers.TPESampler:
    """Multivariate TPE over the conditional space (it honours the trials' constraints); the random start
    shrinks for short studies."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(2, trials // 3)),
                                          multivariate=True, group=True)


def make_pruner(directions: tuple[str, ...]) -> optuna.pruners.BasePruner:
    """WilcoxonPruner on the per-prompt values; Optuna prunes single-objective studies only."""
    if len(directions) > 1:
        return optuna.pruners.NopPruner()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.pruners.WilcoxonPruner(p_threshold=0.1)


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best feasible trial; multi-objective: the Pareto-front trial with the highest speedup."""
    try:
        if len(study.directions) == 1:
            return study.best_trial
        front = study.best_trials
    except ValueError:  # nothing completed, or nothing feasible
        return None
    return max(front, key=lambda t: t.values[0], default=None)


def defaults_trial(study: optuna.Study) -> FrozenTrial | None:
    return next((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.user_attrs.get(DEFAULTS)), None)
