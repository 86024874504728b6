"""`specbench tune` as a library call: one study per strategy, its worker processes, the held-out check, outputs.

The target and the prompts are loaded once; each strategy is tuned in its own study (the trials split
between them), on the tuning part of the prompts. `workers` processes share the study through its
storage: this process is one of them, the others are spawned and load their own copy of the model.
Several machines join the same study by running the same command against the same RDB storage; each
worker stops once the study has its trials, so together they run about `trials` (a few more when
several finish at once).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch

from specbench.analysis.hardware import GpuProfile
from specbench.bench.prepare import PreparedRun, prepare
from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic, write_json
from specbench.core.records import TunedStudy
from specbench.core.records.study_records import Gains
from specbench.decoding.target import fingerprint
from specbench.engines.protocol import Deploys
from specbench.methods.knobs import make_options
from specbench.methods.names import StrategyName
from specbench.methods.registry import definition
from specbench.methods.serving import engines_markdown
from specbench.plan.run_config import RunPlan
from specbench.plan.suites import SuiteItem
from specbench.tuning.holdout import holdout_check, interval, paired_gain, split_items
from specbench.tuning.objective import Evaluator
from specbench.tuning.outputs import speedup_figures, tuned_toml, write_plots
from specbench.tuning.serve_study import tune_at_load
from specbench.tuning.storage import display_url, open_storage
from specbench.tuning.study import (
    PER_PROMPT,
    best_trial,
    check_identity,
    counted_trials,
    create_storage,
    defaults_trial,
    enqueue_defaults,
    make_pruner,
    make_sampler,
    open_checked,
    open_study,
    question,
    study_names,
)
from specbench.tuning.study_config import TuneConfig
from specbench.tuning.study_space import StudySpace, study_space
from specbench.tuning.trials import Progress, TuneReport, new_record, optimize, set_best


@dataclass
class StudyPlan:
    """What one strategy's study measures, the same in every worker."""

    spec: StrategyName
    bench: PreparedRun  # ar and the strategy with its default (or fixed) knobs
    space: StudySpace
    profile: GpuProfile | None  # set: the objective is projected onto this profile
    tuning: list[SuiteItem]
    holdout: list[SuiteItem]
    identity: dict[str, Any]

    @property
    def label(self) -> str:
        if self.profile is not None:
            return f"projected on {self.profile.name}"
        gpu = self.bench.config.gpu
        return f"measured on {gpu} (the local GPU)" if gpu else "measured on this machine"


def plan_study(config: TuneConfig, spec: StrategyName, bench: PreparedRun) -> StudyPlan:
    workload = config.workload
    space = study_space(spec, bench.strategies[1], workload.knobs, workload.controller, bench.plan.reference)
    tuning, holdout = split_items(bench.suite.items, config.holdout, workload.seed)
    identity = {
        **question(config, spec), "space": space.space.fingerprint(), "space_text": space.space.describe(),
        "model": f"{bench.target.name}@{fingerprint(bench.target.model)}",
        "prompts": [f"{item.id}/{turn}" for item in tuning for turn in range(len(item.turns))],
    }
    profile = bench.profile if identity["projected"] else None  # the local GPU's figures are measured
    return StudyPlan(spec, bench, space, profile, tuning, holdout, identity)


def study_name(config: TuneConfig, plan: StudyPlan) -> str:
    """--study (suffixed by the strategy when several are tuned), else strategy, model, GPU and a workload hash."""
    names = study_names(config)
    if names:
        return names[plan.spec.name]
    workload = {k: v for k, v in plan.identity.items() if k not in ("strategy", "space", "space_text")}
    digest = hashlib.sha256(json.dumps(workload, sort_keys=True).encode()).hexdigest()[:6]
    model = re.sub(r"[^A-Za-z0-9._+-]+", "-", Path(plan.bench.target.name).name).strip("-") or "model"
    return f"{plan.spec.name}-{model}-{config.workload.gpu or 'local'}-{digest}"


def tune(config: TuneConfig, progress: Progress | None = None) -> TuneReport:
    """Tune every requested strategy in its own study and rank them (see the module docstring)."""
    config.validate()
    if config.load is not None:
        return tune_at_load(config, progress)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    specs = config.specs()
    url = open_checked(config)
    bench = prepare(measured(config.measured_plan))
    records = []
    try:
        for index, spec in enumerate(specs):
            one = dataclasses.replace(bench, strategies=[bench.strategies[0], bench.strategies[index + 1]])
            plan = plan_study(config, spec, one)
            records.append(tune_study(config, plan, study_name(config, plan), url,
                                      config.share(index), progress))
    finally:
        bench.close()
    return TuneReport(records, rank(records) if len(records) > 1 else [])


def measured(plan: RunPlan, spec: StrategyName | None = None) -> RunPlan:
    """The plan a study measures: its one engine is the reference, whose `ar` every trial is paired with. With
    `spec`, `ar` and that strategy alone, with its drafters only (a spawned worker's, not planned again)."""
    (engine,) = plan.engines
    if spec is not None:
        specs = (plan.strategies[0], spec)
        sources = {name: source for name, source in plan.drafter_sources.items() if name in spec.members}
        plan = dataclasses.replace(plan, strategies=specs, drafter_sources=sources,
                                   engine=dataclasses.replace(plan.engine, specs=specs, drafter_sources=sources))
    return dataclasses.replace(plan, reference=engine)


def tune_study(config: TuneConfig, plan: StudyPlan, name: str, url: str, trials: int,
               progress: Progress | None) -> TunedStudy:
    """Create or resume the study, run its workers until it has `trials`, then check and record the best."""
    storage = create_storage(url, config.heartbeat_s)
    study, _ = open_study(storage, name, plan.identity, display_url(url),
                          make_sampler(config.workload.seed, trials),
                          make_pruner(config.directions))
    enqueue_defaults(study, plan.space.defaults())
    remaining = trials - len(counted_trials(study))
    if remaining > 0:
        evaluator = Evaluator(plan.bench, plan.tuning, plan.profile)
        _run_workers(config, plan, study, evaluator, name, url, trials, remaining, progress)
    return finish_study(config, plan, study, url, trials)


def _run_workers(config: TuneConfig, plan: StudyPlan, study: optuna.Study, evaluator: Evaluator, name: str,
                 url: str, trials: int, remaining: int, progress: Progress | None) -> None:
    """This process and `workers - 1` spawned ones, the remaining trials split between them."""
    workers = min(config.workers, remaining)
    quotas = [remaining // workers + (i < remaining % workers) for i in range(workers)]
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=_spawned_worker, name=f"specbench-tune-{i}",
                                args=(config, plan.spec, plan.identity, name, url, trials, quotas[i], i))
                for i in range(1, workers)]
    threads = torch.get_num_threads()
    if workers > 1:
        torch.set_num_threads(_threads_per_worker(workers))
    for child in children:
        child.start()
    try:
        optimize(study, evaluator, plan.space, quotas[0], trials, config.timeout, progress)
    except BaseException:
        for child in children:
            child.terminate()
        raise
    finally:
        for child in children:
            child.join()
        torch.set_num_threads(threads)
    failed = [f"{child.name} (exit code {child.exitcode})" for child in children if child.exitcode]
    if failed:
        raise SpecbenchError(f"worker process {', '.join(failed)} failed; the trials measured are kept in "
                             f"study {name}, run the same command to resume")


def _threads_per_worker(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def _spawned_worker(config: TuneConfig, spec: StrategyName, identity: dict[str, Any], name: str, url: str,
                    trials: int, quota: int, index: int) -> None:
    """A worker process: its own model, prompts and ar times, the same study."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(_threads_per_worker(config.workers))
    try:
        bench = prepare(measured(config.measured_plan, spec))
        plan = plan_study(config, spec, bench)
        study = optuna.load_study(study_name=name, storage=open_storage(url, config.heartbeat_s),
                                  sampler=make_sampler(config.workload.seed + index, trials),
                                  pruner=make_pruner(config.directions))
        check_identity(study, identity, display_url(url))
        try:
            optimize(study, Evaluator(plan.bench, plan.tuning, plan.profile), plan.space, quota, trials,
                      config.timeout, None)
        finally:
            bench.close()
    except SpecbenchError as exc:
        print(f"error: worker {index}: {exc}", file=sys.stderr)
        sys.exit(2)


def _engines(plan: StudyPlan, knobs: dict[str, dict[str, Any]], controller: str | None) -> dict[str, Any] | None:
    if len(plan.spec.members) != 1:
        return None
    name = plan.spec.members[0]
    options = make_options(name, knobs.get(name, {}))
    dirs = plan.bench.plan.drafter_sources
    drafter = dirs[name].checkpoint.name if name in dirs else None
    serving = definition(name).serving
    return serving(options, controller or definition(name).default_controller, drafter).as_json() if serving else None


def finish_study(config: TuneConfig, plan: StudyPlan, study: optuna.Study, url: str, trials: int) -> TunedStudy:
    """The held-out check of the best trial and the outputs: TOML, JSON record, engines, plots."""
    out = Path(config.workload.out)
    tuned_dir = out / "tuned"
    tuned_dir.mkdir(parents=True, exist_ok=True)
    name = study.study_name
    workload = config.workload
    best, defaults = best_trial(study), defaults_trial(study)
    record = new_record(
        TunedStudy, study, url, trials, len(plan.identity["prompts"]), strategy=plan.spec.name,
        model=plan.bench.target.name, gpu=workload.gpu, projected=plan.profile is not None, label=plan.label,
        objectives=config.objectives.split(","), suite=plan.bench.suite.name,
        categories=list(workload.categories), temperature=workload.temperature,
        max_new_tokens=workload.max_new_tokens, batch_size=1,
        prompts={"tuning": len(plan.identity["prompts"]), "holdout": sum(len(item.turns) for item in plan.holdout)},
        session=[spec.name for spec in config.specs()])
    if best is None:
        record.note = ("no trial completed" if not record.trials.complete else
                       f"no configuration fits {plan.profile.name}'s memory" if plan.profile else "no best trial")
        write_json(tuned_dir / f"{name}.json", record.as_dict())
        return record
    knobs, controller = set_best(record, study, best, plan.space)
    record.memory_bytes = best.user_attrs.get("memory_bytes")
    record.tuning = dataclasses.replace(interval(best.user_attrs[PER_PROMPT], workload.seed), speedup=best.values[0])
    if len(study.directions) > 1:
        record.pareto = [{"trial": t.number, "params": t.params, "speedup": t.values[0], "memory_bytes": t.values[1]}
                         for t in sorted(study.best_trials, key=lambda t: -t.values[0])]
    holdout = Evaluator(plan.bench, plan.holdout, plan.profile)
    tuned = holdout.build(plan.spec, knobs, controller)
    try:
        record.holdout, held_out_gain = holdout_check(holdout, tuned, plan.bench.strategies[1], workload.seed)
    finally:
        holdout.release(tuned)
    record.gain = Gains(held_out_gain, paired_gain(best.user_attrs[PER_PROMPT], defaults.user_attrs[PER_PROMPT],
                                                   workload.seed) if defaults is not None else None)
    record.toml = str(tuned_dir / f"{name}.toml")
    write_atomic(Path(record.toml), tuned_toml(record, knobs, controller, workload, speedup_figures(record)))
    engine = plan.bench.backends[tuned.engine]
    deployed = engine.deployed_config(tuned) if isinstance(engine, Deploys) else None
    if deployed is not None:  # what was measured, as the engine's users configure it
        deployed_file = tuned_dir / f"{name}.{tuned.engine}.json"
        write_json(deployed_file, deployed)
        record = dataclasses.replace(record, **{f"{tuned.engine}_config": str(deployed_file)})
    engines = _engines(plan, knobs, controller)
    if engines is not None:
        record.engines = engines
        record.engines_file = str(tuned_dir / f"{name}.engines.md")
        model = workload.model or "MODEL"
        write_atomic(Path(record.engines_file), engines_markdown(name, model, engines))
    record.plots = write_plots(study, out / "tuning" / name, plan.label)
    write_json(tuned_dir / f"{name}.json", record.as_dict())
    return record


def rank(records: list[TunedStudy]) -> list[dict[str, Any]]:
    """The tuned strategies ordered by their held-out speedup, beside their defaults there."""
    rows = []
    for r in records:
        rows.append({"strategy": r.strategy, "study": r.study, "label": r.label,
                     "tuned": r.held_out("tuned"), "defaults": r.held_out("defaults"),
                     "gain": r.gain.holdout.gain if r.gain else None,
                     "tuning": r.tuning.speedup if r.tuning else None})
    return sorted(rows, key=lambda row: -(row["tuned"] or 0.0))
