"""specbench: benchmark and autotune lossless speculative-decoding strategies.

The library behind each command, one call each, returning the record the command prints (docs/api.md):

    import specbench
    result = specbench.run(strategies="ngram,draft", limit=2)       # a RunResult, its run directory written
    report = specbench.tune(strategies="dspark", trials=20)          # a TuneReport of Optuna studies
    levels = specbench.serve(strategies="ngram", concurrency=[1, 4])  # a ServeResult, measured on vLLM servers
    choice = specbench.recommend(gpu="rtx4090", task="code")         # a Recommendation
    page = specbench.report_page(["results/runs/RUN"], "report.html")  # one self-contained HTML page

Importing specbench loads no model library: each call imports what it runs.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specbench.core.errors import SpecbenchError
from specbench.core.version import __version__

if TYPE_CHECKING:
    from specbench.bench.pipeline import Estimate
    from specbench.bench.pipeline import Progress as RunProgress
    from specbench.core.records import RunResult
    from specbench.core.records.serve_records import ServeResult
    from specbench.recommender import Recommendation
    from specbench.report.html_page import Page
    from specbench.report.html_sweeps import StudyView
    from specbench.serving.sweep import Progress as ServeProgress
    from specbench.tuning.trials import Progress as TuneProgress
    from specbench.tuning.trials import TuneReport

__all__ = ["__version__", "recommend", "report_page", "run", "serve", "tune"]


def run(config: str | Path | None = None, resume: str | Path | None = None, progress: RunProgress | None = None,
        on_estimate: Estimate | None = None, **settings: Any) -> RunResult:
    """`specbench run`: every strategy against plain decoding (`ar`) on a prompt suite, its run directory
    written under `out`. `settings` are a run configuration's, named as in a `--config` TOML file
    (docs/configuration.md): strategies, model, drafters, limit, max_new_tokens, engine, ...; over the
    values of the TOML file `config` where one is given. `resume` finishes an interrupted run directory with
    its saved configuration (a setting may repeat it, not change it). `progress(prompt_id, done, total)`
    hears each prompt measured, `on_estimate(figures)` how long measuring should take, after the warm-up."""
    from specbench.plan.run_config import load_config_file, resolve
    from specbench.report.run_dir import RunDir

    # every check before torch is imported: bad input is refused at once
    run_dir, saved = RunDir.resume(resume) if resume is not None else (None, None)
    file_values = load_config_file(Path(config)) if config is not None else {}
    plan = resolve(file_values, _settings(settings, "specbench.run"), saved)
    from specbench.bench.pipeline import run_benchmark

    return run_benchmark(plan, progress, run_dir, on_estimate)


def tune(strategies: str | list[str] = (), config: str | Path | None = None, progress: TuneProgress | None = None,
         on_loading: Callable[[], None] | None = None, **settings: Any) -> TuneReport:
    """`specbench tune`: one Optuna study of each strategy's knobs, its best checked on held-out prompts. The
    study's settings are TuneConfig's (trials, workers, storage, objectives, concurrency, slo, ...); the others
    the workload's, as `run` takes them, over the TOML file `config` where one is given (its strategies are
    tuned where `strategies` names none). `on_loading()` hears that the settings passed their checks and the
    model loads, `progress(study, done, total, best, trial)` each trial; the same call again resumes the
    studies."""
    from specbench.plan.run_config import layered, load_config_file
    from specbench.tuning.study import open_checked
    from specbench.tuning.study_config import TuneConfig

    study, workload = _split(settings, TuneConfig, "workload")
    file_values = load_config_file(Path(config)) if config is not None else {}
    names = [strategies] if isinstance(strategies, str) else list(strategies)
    names = names or list(file_values.get("strategies", ()))
    given = _settings({**workload, **({"strategies": names} if names else {})}, "specbench.tune")
    session = TuneConfig(layered(file_values, given), tuple(names), **study).validate()
    open_checked(session)  # the storage and named studies, checked before torch is imported
    if on_loading:
        on_loading()
    from specbench.tuning.study_runner import tune as tune_studies

    return tune_studies(session, progress)


def serve(resume: str | Path | None = None, api_key: str | None = None, progress: ServeProgress | None = None,
          **settings: Any) -> ServeResult:
    """`specbench serve`: each strategy on its own `vllm serve` (or the running `endpoints`) at each load level
    (`concurrency`, `request_rates`), against plain decoding at the same load. The load's settings are
    ServeLoad's (`headers` and `api_key` sent to the endpoints); the others the run's, as `run` takes them.
    `resume` continues an interrupted serve run with its saved settings; `progress(strategy, level, answered,
    requests)` is told the requests of every level to measure."""
    from specbench.serving.serve_config import ServeLoad, serve_config
    from specbench.serving.sweep import resume as resume_run
    from specbench.serving.sweep import serve as serve_run

    load, run_settings = _split(settings, ServeLoad)
    if resume is not None:
        given = sorted(name for name in settings if name != "headers")
        if given:
            raise SpecbenchError(f"a resumed serve run keeps its saved settings: drop {', '.join(given)}")
        return resume_run(Path(resume), api_key, load.get("headers"), progress)
    return serve_run(serve_config(_settings(run_settings, "specbench.serve"), api_key, **load), progress)


def recommend(results: str | Path = "results", **workload: Any) -> Recommendation:
    """`specbench recommend`: the strategy and its settings for a workload (gpu, task, batch_size,
    context_len, ...: recommend.make_workload's arguments), from the runs and studies under `results`
    where they match it, else from the published rules."""
    from specbench.recommender import make_workload
    from specbench.recommender import recommend as recommend_for

    return recommend_for(make_workload(**workload), Path(results))


def report_page(paths: list[str | Path], html: str | Path, recommendation: Recommendation | None = None) -> Page:
    """`specbench report --html`: one self-contained HTML page, written atomically to `html`, of the run
    directories, serve run directories and tune studies' JSON records (<out>/tuned/<study>.json) in `paths`,
    and of a `recommendation` (`recommend --html`); returns what the page shows."""
    from specbench.core.paths import check_output_file

    if not Path(html).expanduser().parent.is_dir():
        raise SpecbenchError(f"--html {html}: its folder {Path(html).parent} does not exist")
    check_output_file(html, "--html")
    from specbench.report.html_page import Page, write_page

    page = Page(recommendation=recommendation)
    runs = []
    for path in map(Path, paths):
        if path.is_file() and path.suffix == ".json":
            page.studies.append(_study_view(path))
        elif (path / "serve.json").is_file():
            from specbench.serving.sweep import read_result

            page.serves.append(read_result(path))
        else:
            runs.append(path)
    if runs:
        from specbench.report.comparison import load_runs

        page.runs, page.notes = load_runs(runs)
    if not (page.runs or page.serves or page.studies or recommendation):
        raise SpecbenchError("nothing to report: give run directories, serve run directories or studies' JSON files")
    write_page(page, html)
    return page


def _study_view(path: Path) -> StudyView:
    """A study's JSON record, and its trials where its storage is a local SQLite file (a server's URL is kept
    without its password, and contacting a server is not a report's business)."""
    from specbench.core.files import read_json_object
    from specbench.core.records import ServedStudy, TunedStudy
    from specbench.report.html_sweeps import StudyView, TrialValue

    data = read_json_object(path, "tuned study")
    if "objective" in data:
        record = ServedStudy.from_dict(data, f"the entries of study {path}")
        return StudyView(record, [TrialValue(t.number, t.value) for t in record.measured if t.value is not None])
    record = TunedStudy.from_dict(data, f"the entries of tuned study {path}")
    database = Path(record.storage.removeprefix("sqlite:///"))
    if not record.storage.startswith("sqlite:///") or not database.is_file():
        return StudyView(record)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name=record.study, storage=record.storage).get_trials(deepcopy=False)
    return StudyView(record, [TrialValue(t.number, t.values[0]) for t in trials if t.values])


def _settings(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """RunConfig's fields from settings named as a TOML config names them, paths given as Path objects too."""
    from specbench.plan.run_config import checked_settings

    def text(value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        return [text(v) for v in value] if isinstance(value, (list, tuple)) else value

    return checked_settings({key: text(value) for key, value in settings.items()}, where)


def _split(settings: dict[str, Any], kind: type, inner: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """`settings` split into the fields of `kind` (but its `inner` configuration) and the rest."""
    own = {f.name for f in dataclasses.fields(kind)} - {inner}
    return ({k: v for k, v in settings.items() if k in own}, {k: v for k, v in settings.items() if k not in own})
