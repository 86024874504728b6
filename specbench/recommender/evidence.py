"""Evidence under a results directory, and the candidates it offers a workload.

Readers: run directories (anywhere below the results directory, read with `report.run_dir.read_run`) and
tuned studies (results/tuned/<study>.json with the run config <study>.toml beside it). Whatever
cannot be read is skipped and named; recommend goes on without it.

A run offers `measured` candidates when it ran on the workload's GPU at the workload's batch size,
`modelled` ones when it ran on that GPU at another batch size and its load axis (summary.json's
`load`: its measured acceptance and draft shape priced by the cost table it names, timed on the
same device) models the workload's batch size, and `projected` ones when its summary holds a
roofline projection onto that GPU (`specbench run --gpu NAME`). Runs of the same
model and strategy configuration pool their prompts: the speedup and its interval come from
`measure.stats` over all of them. A strategy whose greedy output ever differed from `ar` in a run
is not offered from that run: a recommendation is lossless or it is not one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specbench.analysis.hardware import match_profile
from specbench.analysis.stats import paired_speedups, summarise_strategy
from specbench.core.engine_names import SPECBENCH, label
from specbench.core.errors import SpecbenchError
from specbench.core.files import read_json_object, read_toml
from specbench.core.records import LoadPoint, Projection, RunResult, TunedStudy
from specbench.methods.names import BASELINE
from specbench.recommender.prior import members
from specbench.recommender.workload import Workload
from specbench.report.run_dir import read_run, saved_config

SOURCES = ("measured", "modelled", "projected", "prior")
"""Every recommendation names one; evidence ranks in this order (the prior only speaks without it)."""


@dataclass(frozen=True)
class RunSetup:
    """A strategy as `specbench run` takes it: the name, its members' knobs, the controller, a TOML file."""

    strategy: str
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    controller: str | None = None
    toml: str | None = None  # a tuned configuration file `specbench run --config` reads
    engine: str = SPECBENCH  # the engine its figures were measured in (engines/)

    def key(self) -> str:
        return json.dumps([self.strategy, self.knobs, self.controller, self.engine], sort_keys=True, default=str)

    def command(self) -> str:
        if self.toml:
            return f"specbench run --config {self.toml}"
        sets = [f" --set {m}.{k}={v}" for m, values in sorted(self.knobs.items()) for k, v in sorted(values.items())]
        controller = f" --controller {self.controller}" if self.controller else ""
        engine = f" --engine {self.engine}" if self.engine != SPECBENCH else ""
        return f"specbench run --strategy {self.strategy}{engine}{controller}{''.join(sets)}"

    def as_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "engine": self.engine, "knobs": self.knobs, "controller": self.controller,
                "toml": self.toml, "command": self.command()}


@dataclass(frozen=True)
class Candidate:
    """One strategy configuration with a speedup over `ar` for the workload, and what it rests on."""

    config: RunSetup
    source: str  # one of SOURCES
    speedup: float
    ci: tuple[float, float] | None
    rests_on: tuple[str, ...]  # run directories and study files
    prompts: int | None
    need_bytes: float | None  # target + drafter weights + KV (+ drafter state) at the workload's context
    baseline_bytes: float | None  # the same for `ar` in the same evidence
    note: str = ""
    incomplete: str = ""  # why the evidence behind it is incomplete: an interrupted run, a study short of trials

    @property
    def strategy(self) -> str:
        return self.config.strategy

    @property
    def engine(self) -> str:
        return self.config.engine


@dataclass
class RunRecord:
    """A readable run directory and the workload it measured."""

    run: RunResult
    device: str | None  # the GPU profile it ran on ("cpu" without a GPU); None when no profile matches
    model: str
    temperature: float
    rows: pd.DataFrame  # with their paired speedup and batch size (the run's, 1 before batched runs)

    @property
    def path(self) -> str:
        return str(self.run.path)


@dataclass
class Study:
    """A tuned configuration: results/tuned/<study>.json and the run config beside it (None when the
    study found no best configuration)."""

    path: Path
    record: TunedStudy
    config: RunSetup | None


@dataclass
class Evidence:
    runs: list[RunRecord] = field(default_factory=list)
    studies: list[Study] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "PATH: why", for whatever could not be read

    def categories(self) -> set[str]:
        return {c for r in self.runs for c in r.rows["category"].unique()}

    def __len__(self) -> int:
        return len(self.runs) + len(self.studies)


# -- reading ---------------------------------------------------------------------------------

UNREADABLE = (SpecbenchError, OSError, ValueError)
"""What a damaged file raises through json, tomllib, pandas and pyarrow (the records name a missing or
mistyped entry as a SpecbenchError): the item is skipped. Anything else is a bug in the reading and surfaces."""


def run_dirs(results: Path) -> list[Path]:
    """Directories holding run.json anywhere below `results`, and every directory in results/runs/."""
    found = {p.parent for p in results.rglob("run.json")}
    if (results / "runs").is_dir():
        found |= {p for p in (results / "runs").iterdir() if p.is_dir()}
    return sorted(found)


def _named(path: Path, exc: Exception) -> str:
    text = str(exc)
    return text if str(path) in text else f"{path}: {text}"


def read_runs(results: Path, evidence: Evidence) -> None:
    for path in run_dirs(results):
        try:
            evidence.runs.append(_run_record(path))
        except UNREADABLE as exc:
            evidence.skipped.append(_named(path, exc))


def _run_record(path: Path) -> RunRecord:
    run = read_run(path)  # mismatches are handled per strategy in `run_candidates`
    rows = run.frame()
    if len(rows):
        if BASELINE not in set(rows["strategy"]):
            raise SpecbenchError(f"{path}: no ar rows to pair the speedups with")
        if rows["speedup"].isna().all():  # a run that never finished
            rows["speedup"] = paired_speedups(rows)
    return RunRecord(run=run, device=run_device(run), model=str(run.model),
                     temperature=float(saved_config(run).temperature), rows=rows)


def run_device(run: RunResult) -> str | None:
    """The profile of the device a run measured on: its CUDA GPU, or `cpu`."""
    cuda = run.environment.cuda
    if saved_config(run).device == "cpu" or not cuda:
        return "cpu"
    return match_profile(str(cuda))


def read_studies(results: Path, evidence: Evidence) -> None:
    for path in sorted((results / "tuned").glob("*.json")):
        try:
            evidence.studies.append(_study(path))
        except UNREADABLE as exc:
            evidence.skipped.append(_named(path, exc))


def _study(path: Path) -> Study:
    record = TunedStudy.from_dict(read_json_object(path, "tuned study"), f"the entries of tuned study {path}")
    if record.best_params is None and record.toml is None:
        return Study(path, record, None)
    toml_path = path.with_suffix(".toml")  # beside the record, wherever the results directory moved
    if not toml_path.is_file():
        raise SpecbenchError(f"{path}: no tuned configuration {toml_path.name} beside it")
    toml = read_toml(toml_path, "tuned configuration")
    knobs = toml.get("knobs", {})
    if not isinstance(knobs, dict) or not all(isinstance(v, dict) for v in knobs.values()):
        raise SpecbenchError(f"{toml_path}: [knobs] must hold one table per strategy")
    strategy = record.strategy
    return Study(path, record, RunSetup(strategy, _own_knobs(knobs, strategy), toml.get("controller"),
                                    str(toml_path), toml.get("engine", SPECBENCH)))


READERS: tuple[Callable[[Path, Evidence], None], ...] = (read_runs, read_studies)


def load_evidence(results: Path) -> Evidence:
    """Everything readable under `results`; an absent directory is no evidence."""
    evidence = Evidence()
    if results.is_dir():
        for reader in READERS:
            reader(results, evidence)
    return evidence


# -- matching --------------------------------------------------------------------------------


def _mismatch(record: RunRecord, workload: Workload) -> str | None:
    """Why a run does not describe the workload, or None when it does."""
    if workload.model is not None and record.model != workload.model:
        return f"model {record.model}, not {workload.model}"
    if not math.isclose(record.temperature, workload.temperature):
        return f"temperature {record.temperature:g}, not {workload.temperature:g}"
    if not len(record.rows):
        return "no rows measured yet"
    sizes = sorted(set(record.rows["batch_size"]))
    if workload.batch_size not in sizes and not (record.device == workload.gpu.name and _modelled(record, workload)):
        return f"batch size {', '.join(map(str, sizes))}, not {workload.batch_size} (nor modelled at it)"
    if workload.task is not None and workload.task not in set(record.rows["category"]):
        return f"no {workload.task} prompts"
    return None


def _mismatched(rows: pd.DataFrame) -> bool:
    """Whether any greedy output differed from `ar` (null under sampling: no check ran)."""
    return bool(rows["mismatch"].fillna(False).astype(bool).any())


def _own_knobs(knobs: dict[str, dict], strategy: str) -> dict[str, dict]:
    """The knob tables of `strategy`'s members, out of a run's or a study's."""
    return {m: dict(v) for m, v in knobs.items() if m in members(strategy)}


def _config_of(record: RunRecord, strategy: str, engine: str = SPECBENCH) -> RunSetup:
    config = saved_config(record.run)
    return RunSetup(strategy, _own_knobs(config.knobs, strategy), config.controller if strategy != BASELINE else None,
                    engine=engine)


def _kv_bytes_per_token(ar_rows: pd.DataFrame) -> float | None:
    """Slope of `ar`'s needed memory over its context (prompt + answer): the KV cache per token."""
    context = (ar_rows["prompt_tokens"] + ar_rows["new_tokens"]).to_numpy(dtype=float)
    if len(np.unique(context)) < 2:
        return None
    return float(np.polyfit(context, ar_rows["memory_bytes"].to_numpy(dtype=float), 1)[0])


def _need_bytes(rows: pd.DataFrame, kv_per_token: float | None, context_len: int | None) -> float:
    """The most memory a prompt needed, moved to `context_len` tokens where the KV slope is known."""
    if context_len is None or kv_per_token is None:
        return float(rows["memory_bytes"].max())
    context = rows["prompt_tokens"] + rows["new_tokens"]
    return float((rows["memory_bytes"] + kv_per_token * (context_len - context)).max())


@dataclass
class _Pool:
    config: RunSetup
    frames: list[pd.DataFrame] = field(default_factory=list)
    paths: set[str] = field(default_factory=set)
    interrupted: set[str] = field(default_factory=set)  # the paths of runs that did not finish


def _interrupted(paths: set[str] | list[str]) -> str:
    return f"interrupted run{'s' if len(paths) > 1 else ''} {', '.join(sorted(paths))}" if paths else ""


def run_candidates(evidence: Evidence, workload: Workload) -> tuple[list[Candidate], list[str]]:
    """Measured candidates pooled over the matching runs on the workload's GPU, and projected ones.

    Returns the candidates and a note for every run that did not match (and why).
    """
    notes: list[str] = []
    pools: dict[tuple[str, str], _Pool] = {}
    baselines: dict[str, list[pd.DataFrame]] = {}  # model -> ar rows of the measured runs
    projected: list[Candidate] = []
    modelled: list[Candidate] = []
    for record in evidence.runs:
        why = _mismatch(record, workload)
        on_gpu = record.device == workload.gpu.name
        if why is None and not on_gpu and not _projections(record, workload):
            why = f"measured on {record.device or 'an unprofiled GPU'}, with no projection to {workload.gpu.name}"
        if why is not None:
            notes.append(f"{record.path}: {why}")
            continue
        rows = record.rows[record.rows["batch_size"] == workload.batch_size]
        rows = rows if workload.task is None else rows[rows["category"] == workload.task]
        rows = rows.assign(prompt_id=record.path + "/" + rows["prompt_id"].astype(str))
        lossless: list[tuple[str, str]] = []  # (engine, strategy)
        for (engine, strategy), part in (rows if len(rows) else record.rows).groupby(["engine", "strategy"],
                                                                                      sort=False):
            if _mismatched(part):
                notes.append(f"{record.path}: {label(strategy, engine)} left out: its greedy output differed from ar")
            else:
                lossless.append((str(engine), str(strategy)))
        # the projection and the load axis model specbench's own engine
        own = [strategy for engine, strategy in lossless if engine == SPECBENCH]
        if not on_gpu:
            projected += _projected_candidates(record, workload, rows[rows["engine"] == SPECBENCH], own, notes)
            continue
        if not len(rows):  # measured at other batch sizes only: what its load axis models at this one
            modelled += _modelled_candidates(record, workload, own, notes)
            continue
        baselines.setdefault(record.model, []).append(rows[(rows["strategy"] == BASELINE)
                                                           & (rows["engine"] == SPECBENCH)])
        for engine, strategy in lossless:
            config = _config_of(record, strategy, engine)
            pool = pools.setdefault((record.model, config.key()), _Pool(config))
            pool.frames.append(rows[(rows["strategy"] == strategy) & (rows["engine"] == engine)])
            pool.paths.add(record.path)
            if not record.run.complete:
                pool.interrupted.add(record.path)
    measured = [_pooled_candidate(pool, pd.concat(baselines[model], ignore_index=True), workload)
                for (model, _key), pool in pools.items()]
    return measured + modelled + projected, notes


def _modelled(record: RunRecord, workload: Workload) -> dict[str, LoadPoint]:
    """strategy -> its point on the run's load axis at the workload's batch size."""
    points = record.run.load.points if record.run.load else []
    return {p.strategy: p for p in points if p.batch_size == workload.batch_size and p.modelled_speedup}


def _modelled_candidates(record: RunRecord, workload: Workload, lossless: list[str],
                         notes: list[str]) -> list[Candidate]:
    if workload.task is not None and set(record.rows["category"]) != {workload.task}:
        notes.append(f"{record.path}: its load axis models every category of the run, not {workload.task} alone")
        return []
    measured_at = int(record.rows["batch_size"].min())
    rows = record.rows[record.rows["batch_size"] == measured_at]
    ar_rows = rows[rows["strategy"] == BASELINE]
    kv = _kv_bytes_per_token(ar_rows)

    def need(strategy: str) -> float | None:
        """What one sequence needed, plus the KV cache of the batch's other sequences."""
        part = rows[rows["strategy"] == strategy]
        if kv is None or not len(part):
            return None
        context = workload.context_len or float((part["prompt_tokens"] + part["new_tokens"]).max())
        return _need_bytes(part, kv, workload.context_len) + (workload.batch_size - 1) * kv * context

    speedups = {BASELINE: 1.0} | {s: float(p.modelled_speedup) for s, p in _modelled(record, workload).items()}
    return [Candidate(_config_of(record, strategy), "modelled", speedup, None, (record.path,),
                      int(rows[rows["strategy"] == strategy]["prompt_id"].nunique()), need(strategy), need(BASELINE),
                      f"modelled at batch {workload.batch_size} from batch {measured_at}'s acceptance and the cost "
                      "table timed on this device", _interrupted([] if record.run.complete else [record.path]))
            for strategy, speedup in speedups.items() if strategy in lossless]


def _pooled_candidate(pool: _Pool, ar_rows: pd.DataFrame, workload: Workload) -> Candidate:
    rows = pd.concat(pool.frames, ignore_index=True)
    summary = summarise_strategy(rows)
    low, high = summary.speedup_ci
    kv = _kv_bytes_per_token(ar_rows)
    ci = (float(low), float(high)) if summary.prompts > 1 else None  # one prompt has no interval
    return Candidate(pool.config, "measured", float(summary.speedup), ci,
                     tuple(sorted(pool.paths)), summary.prompts,
                     _need_bytes(rows, kv, workload.context_len), _need_bytes(ar_rows, kv, workload.context_len),
                     incomplete=_interrupted(pool.interrupted))


def _projections(record: RunRecord, workload: Workload) -> dict[str, Projection]:
    """strategy -> its projection onto the workload's GPU, from the run's summary."""
    found = {}
    for result in record.run.summary:
        projection = result.projection
        if projection and projection.projected and projection.gpu == workload.gpu.name \
                and result.batch_size == workload.batch_size:
            found[result.strategy] = projection
    return found


def _projected_candidates(record: RunRecord, workload: Workload, rows: pd.DataFrame, lossless: list[str],
                          notes: list[str]) -> list[Candidate]:
    if workload.task is not None and set(record.rows["category"]) != {workload.task}:
        notes.append(f"{record.path}: its projection onto {workload.gpu.name} covers every category of the run, "
                     f"not {workload.task} alone")
        return []
    projections = _projections(record, workload)

    def need(strategy: str) -> float | None:
        projection = projections.get(strategy)
        return projection.memory_fit["need_gb"] * 1e9 if projection else None

    return [Candidate(_config_of(record, strategy), "projected", p.speedup, None, (record.path,),
                      int(rows[rows["strategy"] == strategy]["prompt_id"].nunique()), need(strategy), need(BASELINE),
                      f"roofline projection of what {record.device or 'an unprofiled device'} measured",
                      _interrupted([] if record.run.complete else [record.path]))
            for strategy, p in projections.items() if strategy in lossless]


def _study_mismatch(study: Study, workload: Workload) -> str | None:
    record = study.record
    if workload.model is not None and record.model != workload.model:
        return f"model {record.model}, not {workload.model}"
    if not math.isclose(record.temperature, workload.temperature):
        return f"temperature {record.temperature:g}, not {workload.temperature:g}"
    if record.batch_size != workload.batch_size:
        return f"batch size {record.batch_size}, not {workload.batch_size}"
    if workload.task is not None and record.categories and workload.task not in record.categories:
        return f"tuned on {', '.join(record.categories)}, not {workload.task}"
    if record.gpu is None and workload.gpu_origin == "given":
        return "tuned without --gpu (on its own machine): it speaks only for the GPU detected here"
    if record.gpu is not None and record.gpu != workload.gpu.name:
        return f"tuned for {record.gpu}, not {workload.gpu.name}"
    return None


def study_candidates(evidence: Evidence, workload: Workload) -> tuple[list[Candidate], list[str]]:
    """A tuned configuration per matching study, at its held-out speedup where it has one."""
    candidates, notes = [], []
    for study in evidence.studies:
        why = _study_mismatch(study, workload)
        if why is not None:
            notes.append(f"{study.path}: {why}")
            continue
        record = study.record
        held_out = record.holdout.tuned if record.holdout else None
        figures = held_out or record.tuning
        if study.config is None or figures is None or figures.speedup is None:
            notes.append(f"{study.path}: {record.note or 'no tuned configuration'}")
            continue
        ci = figures.speedup_ci
        note = f"tuned; speedup on {'held-out' if held_out else 'the tuning'} prompts" + \
            ("" if record.categories else " of every category")
        counted = record.trials.counted
        short = f"study short of its trials: {counted} of {record.target_trials}" \
            if counted < record.target_trials else ""
        candidates.append(Candidate(study.config, "projected" if record.projected else "measured",
                                    float(figures.speedup),
                                    (float(ci[0]), float(ci[1])) if None not in ci else None, (str(study.path),),
                                    figures.prompts, record.memory_bytes, None, note, short))
    return candidates, notes


def planned_strategies(evidence: Evidence, workload: Workload) -> dict[str, str]:
    """strategy -> a study record of the tune that was also asked for it but left no record of it (interrupted
    first), over the tunes matching the workload: every record names the strategies its tune was asked for."""
    matching = [study for study in evidence.studies if _study_mismatch(study, workload) is None]
    recorded = {study.record.strategy for study in matching}
    planned: dict[str, str] = {}
    for study in matching:
        for strategy in study.record.session:
            if strategy not in recorded:
                planned.setdefault(str(strategy), str(study.path))
    return planned


def candidates_for(evidence: Evidence, workload: Workload) -> tuple[list[Candidate], list[str]]:
    """Every candidate the evidence offers the workload, and why the rest did not match."""
    runs, run_notes = run_candidates(evidence, workload)
    studies, study_notes = study_candidates(evidence, workload)
    return runs + studies, run_notes + study_notes
