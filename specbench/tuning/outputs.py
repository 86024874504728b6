"""What a finished study leaves behind: the tuned run config, its JSON record, plots and engine translations.

results/tuned/<study>.toml is a run config `specbench run --config FILE` reads as it is; <study>.json
beside it records the study (a `TunedStudy`, what `recommend` reads); <study>.engines.md translates the setting
for vLLM and SGLang where the method has a counterpart. Plots land in results/tuning/<study>/.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import tomli_w

from specbench.core.files import atomic_path
from specbench.core.records import StudyRecord, TunedStudy
from specbench.plan.run_config import RunConfig


def _x(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}x"


def speedup_figures(record: TunedStudy) -> str:
    """A study's speedups as a comment line of its tuned TOML."""
    return (f"# speedup over ar on the tuning prompts {_x(record.tuning.speedup)}; held out: tuned "
            f"{_x(record.held_out('tuned'))}, defaults {_x(record.held_out('defaults'))}")


def tuned_toml(record: StudyRecord, knobs: dict[str, dict[str, Any]], controller: str | None,
               workload: RunConfig, figures: str) -> str:
    """The best configuration as a run config, with the workload keys the study used; comments say where
    it came from and, `figures` (a comment line), what it measured (the figures stay in the JSON record:
    `run --config` accepts only run-config keys)."""
    data: dict[str, Any] = {"strategy": [record.strategy]}
    if controller is not None:
        data["controller"] = controller
    optional = {"model": workload.model, "drafters": workload.drafters, "categories": workload.categories,
                "gpu": workload.gpu, "profiles": workload.profiles}
    data.update({k: v for k, v in optional.items() if v})
    data.update(max_new_tokens=workload.max_new_tokens, temperature=workload.temperature)
    if workload.top_p != 1.0:
        data["top_p"] = workload.top_p
    if workload.top_k:
        data["top_k"] = workload.top_k
    if workload.dtype != "auto":
        data["dtype"] = workload.dtype
    if workload.engine != "specbench":  # measured in another engine: the config reruns it there
        data["engine"] = workload.engine
        if workload.engine_args:
            data["engine_args"] = workload.engine_args
    data["knobs"] = {name: dict(values) for name, values in knobs.items() if values}
    header = [
        f"# specbench tune: study {record.study} ({record.strategy}, {record.trials.counted} trials, "
        f"objective {record.label})",
        figures,
        f"# run it: specbench run --config {record.toml}",
    ]
    return "\n".join(header) + "\n" + tomli_w.dumps(data)


def importances(study: optuna.Study) -> dict[str, float]:
    """Optuna's parameter importances (fANOVA) of the first objective; empty when too few trials vary."""
    target = None if len(study.directions) == 1 else (lambda t: t.values[0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {k: float(v) for k, v in optuna.importance.get_param_importances(study, target=target).items()}
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}


def write_plots(study: optuna.Study, directory: Path, label: str) -> list[str]:
    """Optimisation history, parameter importances and (multi-objective) the Pareto front, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as views

    multi = len(study.directions) > 1
    first = (lambda t: t.values[0]) if multi else None
    makers = {
        "history": lambda: views.plot_optimization_history(study, target=first, target_name="speedup over ar"),
        "importances": lambda: views.plot_param_importances(study, target=first, target_name="speedup over ar"),
    }
    if multi:
        makers["pareto"] = lambda: views.plot_pareto_front(study, target_names=["speedup over ar", "memory bytes"])
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in makers.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = make()
        except (ValueError, RuntimeError, ZeroDivisionError):  # too few trials, or nothing varies
            continue
        figure = np.ravel(axes)[0].figure
        figure.set_size_inches(8, 5)
        figure.suptitle(f"{study.study_name} ({label})", fontsize=9, y=0.99)
        figure.tight_layout(rect=(0, 0, 1, 0.95))
        path = directory / f"{name}.png"
        with atomic_path(path) as tmp:
            figure.savefig(tmp, dpi=110)
        plt.close(figure)
        paths.append(str(path))
    return paths
