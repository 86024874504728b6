"""A study at a load: `specbench tune --concurrency N` (or `--request-rate R`) searches a strategy's vLLM
knobs on real servers.

Each trial starts `vllm serve` with the trial's knobs (the translation `specbench serve` uses), measures one
level of serve's load with serve's requests, and stops the server. The value is the goodput at --slo
(requests/s meeting every limit; maximised) or, without an SLO, the level's TPOT p50 in milliseconds
(minimised). `ar` at the same load is measured once, when the study first runs, and kept in the study (its
request log is a study attribute), so a resumed study is compared with the same baseline; at temperature 0
every trial's answers are checked against ar's, request by request, and a difference fails the trial.
The storage, the resumption by name, the identity check and the defaults' first trial are those of every
`specbench tune` study (tuning/study.py). The records go to <out>/tuned/serve/, apart from the studies of
one request at a time that `recommend` reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import optuna

from specbench.core.errors import SpecbenchError
from specbench.core.files import write_atomic, write_json
from specbench.core.records import ServedStudy
from specbench.core.records.serve_records import LevelFigures, RequestRecord, Speculation
from specbench.core.records.study_records import ServedBest, ServedFigures, ServedTrial
from specbench.methods.build import drafter_knobs
from specbench.methods.names import BASELINE, StrategyName
from specbench.serving.greedy_check import greedy_agreement
from specbench.serving.level_stats import against_baseline, level_summary
from specbench.serving.load import Workload
from specbench.serving.serve_config import Level, ServeConfig, ServeLoad
from specbench.serving.server import Server
from specbench.serving.sweep import load_target_for, measure, workload
from specbench.serving.vllm_args import server_arguments
from specbench.tuning import study as studies
from specbench.tuning.objective import TrialFailure
from specbench.tuning.outputs import tuned_toml
from specbench.tuning.storage import display_url
from specbench.tuning.study_config import TuneConfig
from specbench.tuning.study_space import StudySpace, study_space
from specbench.tuning.trials import Progress, TuneReport, new_record, optimize, set_best

BASELINE_LEVEL = "ar_level"  # study attribute: ar's level at the study's load
UNITS = {"goodput_req_s": "req/s", "tpot_p50_ms": "ms"}


@dataclass
class ServedPlan:
    """What one study at a load measures, the same for every trial."""

    spec: StrategyName
    serve: ServeConfig  # the load, the SLO and the workload (its strategies: ar and the one tuned)
    work: Workload
    space: StudySpace
    identity: dict[str, Any]
    target_loader: Any  # the loaded target, for a drafter's conversion to vLLM's layout (once, cached)

    @property
    def level(self) -> Level:
        return self.serve.levels[0]

    @property
    def requests(self) -> int:
        return self.serve.requests_at(self.level)

    @property
    def objective(self) -> str:
        return "goodput_req_s" if self.serve.slo else "tpot_p50_ms"

    @property
    def label(self) -> str:
        what = "goodput at the SLO" if self.serve.slo else "TPOT p50"
        return f"{what} on vLLM servers at {self.level.label}"

    def arguments(self, knobs: dict[str, dict[str, Any]], controller: str | None) -> dict[str, dict[str, Any]]:
        """`vllm serve`'s engine arguments of ar and of the strategy with these knobs; a knob vLLM has no
        counterpart for, or a strategy vLLM cannot run, is refused."""
        run = dataclasses.replace(self.serve.run, knobs=knobs, controller=controller)
        return server_arguments(dataclasses.replace(self.serve.plan, config=run), self.target_loader)

    def on_server(self, name: str, arguments: dict[str, Any],
                  log: Path) -> tuple[list[RequestRecord], float, Speculation | None]:
        """One level on a server started for it and stopped after: the records, the duration, the speculation."""
        with Server(name, arguments, log, self.serve.start_timeout) as server:
            measured = measure(server.url, self.level, self.work, self.serve, self.requests)
        return measured.records, measured.duration_s, measured.speculation


def plan_served(config: TuneConfig, spec: StrategyName) -> ServedPlan:
    """The study's load, prompts, space and identity; a strategy vLLM cannot run is refused here."""
    load = ServeLoad(concurrency=[config.load.concurrency] if config.load.concurrency is not None else [],
                     request_rates=[config.load.request_rate] if config.load.request_rate is not None else [],
                     slo=config.slo)
    run = dataclasses.replace(config.measured_plan.config, strategies=[spec.name])
    load.validate(run.engine_args)
    serve = ServeConfig.planned(load, run)
    work = workload(serve)
    # each measured request a prompt of its own where the tuning prompts suffice; a trial's level repeats
    # them only where --limit holds fewer than the level's requests
    serve = dataclasses.replace(serve, repeat_prompts=len(work.prompts) < serve.prompts_needed)
    target_loader = cache(lambda: load_target_for(serve.plan))
    # a strategy vLLM cannot run is refused before any study is touched
    served = server_arguments(serve.plan, target_loader)[spec.name].get("speculative_config") or {}
    # with a drafter (loaded for its conversion) the first trial is the shape it carries, as a server runs it
    drafting = ({name: drafter_knobs(name, target_loader(), serve.plan.drafter_sources.get(name))
                 for name in spec.members} if "model" in served else {})
    space = study_space(spec, None, serve.run.knobs, serve.run.controller, "vllm", drafting)
    identity = {**studies.question(config, spec), "space": space.space.fingerprint(),
                "space_text": space.space.describe(), "model": str(serve.plan.model),
                "prompts": [prompt.id for prompt in work.prompts]}
    return ServedPlan(spec, serve, work, space, identity, target_loader)


def study_name(config: TuneConfig, plan: ServedPlan) -> str:
    """--study, else strategy, model, load and a hash of the workload."""
    names = studies.study_names(config)
    if names:
        return names[plan.spec.name]
    asked = {k: v for k, v in plan.identity.items() if k not in ("strategy", "space", "space_text")}
    digest = hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:6]
    model = re.sub(r"[^A-Za-z0-9._+-]+", "-", Path(plan.identity["model"]).name).strip("-") or "model"
    return f"{plan.spec.name}-{model}-serve-{plan.level.key}-{digest}"


def tune_at_load(config: TuneConfig, progress: Progress | None = None) -> TuneReport:
    """Tune every requested strategy at the load, each in its own study (see the module docstring)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = studies.open_checked(config)
    plans = [plan_served(config, spec) for spec in config.specs()]
    return TuneReport([served_study(config, plan, url, config.share(i), progress) for i, plan in enumerate(plans)],
                      [])


def served_study(config: TuneConfig, plan: ServedPlan, url: str, trials: int,
                 progress: Progress | None) -> ServedStudy:
    """Create or resume the study, measure ar once, run the trials it lacks, then record the best."""
    name = study_name(config, plan)
    storage = studies.create_storage(url, config.heartbeat_s)
    study, _ = studies.open_study(storage, name, plan.identity, display_url(url),
                                  studies.make_sampler(config.workload.seed, trials),
                                  studies.make_pruner(config.directions))
    studies.enqueue_defaults(study, plan.space.defaults())
    remaining = trials - len(studies.counted_trials(study))
    if remaining > 0:
        evaluator = ServedEvaluator(plan, baseline(study, plan, logs_dir(config, name)), logs_dir(config, name))
        optimize(study, evaluator, plan.space, remaining, trials, config.timeout, progress)
    return finish(config, plan, study, url, trials)


def logs_dir(config: TuneConfig, name: str) -> Path:
    return Path(config.workload.out) / "tuning" / name / "servers"


def baseline(study: optuna.Study, plan: ServedPlan, logs: Path) -> dict[str, Any]:
    """ar's level at the study's load: measured the first time, kept in the study for every later trial."""
    stored = study.user_attrs.get(BASELINE_LEVEL)
    if stored is not None:
        return stored
    arguments = plan.arguments(*plan.space.run_settings(plan.space.defaults()))[BASELINE]
    records, duration, _ = plan.on_server(BASELINE, arguments, logs / "ar.log")
    failed = [r for r in records if r.error is not None]
    if failed or not records:
        raise SpecbenchError(f"ar at {plan.level.label}: {len(failed)} of {len(records)} requests failed "
                             f"({failed[0].error if failed else 'none was sent'}); log: {logs / 'ar.log'}")
    stored = {"records": [r.as_dict() for r in records], "duration_s": duration,
              "summary": level_summary(records, duration, plan.serve.slo).as_dict()}
    study.set_user_attr(BASELINE_LEVEL, stored)
    return stored


def level_figures(summary: LevelFigures) -> ServedFigures:
    """The figures a trial keeps of its level (and the study of ar's)."""
    return ServedFigures(summary.goodput_req_s, summary.tpot_ms.p50, summary.ttft_ms.p50, summary.e2e_ms.p50,
                         summary.tpot_ms.p99, summary.output_tok_s, summary.req_s)


class ServedEvaluator:
    """Optuna's objective for a study at a load: a server per trial, one level, paired with ar's."""

    def __init__(self, plan: ServedPlan, ar_level: dict[str, Any], logs: Path):
        self.plan, self.logs = plan, logs
        self.ar_records = [RequestRecord.from_dict(r, "ar's level") for r in ar_level["records"]]
        self.ar_summary = LevelFigures.from_dict(ar_level["summary"], "ar's level")

    def objective(self, trial: optuna.Trial, space: StudySpace) -> float:
        started = time.perf_counter()
        knobs, controller = space.run_settings(space.space.suggest(trial))
        name = self.plan.spec.name
        try:
            try:
                arguments = self.plan.arguments(knobs, controller)[name]
                records, duration, speculation = self.plan.on_server(name, arguments,
                                                                   self.logs / f"trial-{trial.number}.log")
            except SpecbenchError as exc:
                raise TrialFailure(str(exc)) from None
            return self.value(trial, records, duration, speculation, arguments, started)
        except TrialFailure as exc:
            trial.set_user_attr(studies.FAIL_REASON, str(exc))
            raise

    def value(self, trial: optuna.Trial, records: list[RequestRecord], duration: float,
              speculation: Speculation | None, arguments: dict[str, Any], started: float) -> float:
        """The trial's value; a failed request, an answer that differs from ar's or no value fails it."""
        failed = [r for r in records if r.error is not None]
        if failed or not records:
            raise TrialFailure(f"{len(failed)} of {len(records)} requests failed: "
                               f"{failed[0].error if failed else 'none was sent'}")
        if self.plan.serve.run.temperature == 0:
            check = greedy_agreement(records, self.ar_records)
            if check.mismatches:
                raise TrialFailure(f"lossless check failed: {check.mismatches} of {check.compared} answers "
                                   f"differ from ar's (request: first differing {check.unit}: "
                                   f"{check.first_divergence})")
        summary = level_summary(records, duration, self.plan.serve.slo)
        versus = against_baseline(records, self.ar_records, summary, self.ar_summary, self.plan.serve.run.seed)
        attrs = {**level_figures(summary).as_dict(), "tpot_speedup": versus.tpot_speedup,
                 "tau": speculation.tau if speculation else None,
                 "speculative_config": arguments.get("speculative_config"),
                 "wall_s": time.perf_counter() - started}
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        if attrs[self.plan.objective] is None:
            raise TrialFailure(f"no {self.plan.objective} measured (answers of one token?)")
        return float(attrs[self.plan.objective])


def finish(config: TuneConfig, plan: ServedPlan, study: optuna.Study, url: str, trials: int) -> ServedStudy:
    """The study's record (<out>/tuned/serve/<study>.json), the best knobs as a run config (.toml) and as
    `vllm serve --speculative-config` takes them (.vllm.json)."""
    tuned_dir = Path(config.workload.out) / "tuned" / "serve"
    tuned_dir.mkdir(parents=True, exist_ok=True)
    name, run, level = study.study_name, plan.serve.run, plan.level
    best, defaults = studies.best_trial(study), studies.defaults_trial(study)
    ar_level = study.user_attrs.get(BASELINE_LEVEL)
    record = new_record(
        ServedStudy, study, url, trials, plan.requests, strategy=plan.spec.name, model=plan.identity["model"],
        engine="vllm", label=plan.label, objective=plan.objective, unit=UNITS[plan.objective],
        direction=config.directions[0],
        load={"concurrency": level.concurrency, "request_rate": level.request_rate},
        slo=plan.serve.slo, suite=run.suite, categories=list(run.categories), temperature=run.temperature,
        max_new_tokens=run.max_new_tokens, requests=plan.requests, engine_args=run.engine_args,
        logs=str(logs_dir(config, name)),
        baseline=level_figures(LevelFigures.from_dict(ar_level["summary"], name)) if ar_level else None,
        measured=[ServedTrial.from_dict({"number": t.number, "params": t.params, "value": t.value, **t.user_attrs},
                                        f"trial {t.number}")
                  for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))])
    if best is None:
        record.note = "no trial completed"
        write_json(tuned_dir / f"{name}.json", record.as_dict())
        return record
    knobs, controller = set_best(record, study, best, plan.space)
    record.best = ServedBest.from_dict(best.user_attrs, f"trial {best.number}")
    record.toml, record.vllm_config = str(tuned_dir / f"{name}.toml"), str(tuned_dir / f"{name}.vllm.json")
    unit = UNITS[plan.objective]
    figures = (f"# {plan.objective} {best.values[0]:.4g} {unit} at {level.label}; ar "
               f"{getattr(record.baseline, plan.objective):.4g} {unit}, the defaults "
               + (f"{defaults.values[0]:.4g} {unit}" if defaults is not None else "not measured"))
    write_atomic(Path(record.toml), tuned_toml(record, knobs, controller, run, figures))
    write_json(Path(record.vllm_config), best.user_attrs["speculative_config"])
    write_json(tuned_dir / f"{name}.json", record.as_dict())
    return record
