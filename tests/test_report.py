"""Report tables and plots against run directories written by a small fixture generator.

The fixture writes rows in the bench's layout and, for a finished run, the summaries of
analysis/stats.py: the report only renders, so every figure it shows must be the summaries' own.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from rich.console import Console

from specbench.analysis.stats import summarise_strategies
from specbench.cli.app import print_report
from specbench.core.errors import SpecbenchError
from specbench.core.records import EnginePair, EngineReport, RunMeta, RunResult
from specbench.plan.run_config import RunConfig
from specbench.report.comparison import comparison, load_runs, render
from specbench.report.plots import style, write_plots
from specbench.report.run_report import lossless_checks, start_and_notes

STRATEGIES = ("ar", "eagle", "dflash+eagle")
CATEGORIES = ("code", "creative writing", "math")
ACCEPT = {"eagle": [0.8, 0.7, 0.6, 0.5], "dflash+eagle": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]}


def make_rows(strategies=STRATEGIES, categories=CATEGORIES, prompts_per_category=3, seed=0,
              sampling: bool = False) -> list[dict]:
    """Per-prompt rows as the bench writes them."""
    rng = random.Random(seed)
    rows = []
    for strategy in strategies:
        for c, category in enumerate(categories):
            for p in range(prompts_per_category):
                new_tokens, accepted_at = 128, []
                steps, drafted = new_tokens, 0
                if strategy != "ar":
                    steps = 40 + rng.randint(0, 10)
                    reach = 1.0
                    for r in ACCEPT[strategy]:
                        reach *= min(1.0, r + 0.05 * c)
                        accepted_at.append(int(round(steps * reach)))
                    drafted = steps * 8
                verify = 0.010 * steps * (1.0 if strategy == "ar" else 1.2)
                draft = 0.0 if strategy == "ar" else 0.002 * steps * len(accepted_at)
                rows.append({
                    "strategy": strategy, "prompt_id": f"{category[:4]}-{p}", "category": category, "turn": 0,
                    "repeat": 0, "order": 0, "prompt_tokens": 50, "new_tokens": new_tokens,
                    "wall_s": 0.02 + verify + draft + 0.001 * steps, "ttft_s": 0.02, "steps": steps,
                    "tau": new_tokens / steps, "drafted": drafted, "accepted": sum(accepted_at),
                    "verified": steps + drafted, "budget": 0 if strategy == "ar" else 8 * steps, "tree_steps": 0,
                    "accept_by_position": accepted_at, "prefill_s": 0.02, "draft_s": draft, "verify_s": verify,
                    "other_s": 0.001 * steps, "memory_bytes": int(1.0e8 + 1e6 * strategies.index(strategy)),
                    "peak_mem_bytes": int(2.0e9), "mismatch": None if sampling else False,
                    "first_divergence": None, "divergence_margin": None,
                })
    return rows


def write_run(root: Path, name: str = "run-1", status: str = "complete", strategies=STRATEGIES,
              nvml: bool = True, truncate_rows: bool = False, mismatch: bool = False, model: str = "tiny",
              sampling: bool = False, noise: dict | None = None) -> Path:
    """Write a run directory with the bench's layout; returns its path."""
    run = root / name
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "status": status, "model": model, "suite": "default", "started": "2026-11-29T10:00:00+00:00",
        "finished": "2026-11-29T10:05:00+00:00" if status == "complete" else None,
        "strategies": list(strategies), "gpu_profile": None}))
    (run / "config.json").write_text(json.dumps({"max_new_tokens": 128, "temperature": 1.0 if sampling else 0.0}))
    (run / "environment.json").write_text(json.dumps({"python": "3.11", "torch": "2.13"}))
    rows = make_rows(strategies, sampling=sampling)
    if mismatch:
        rows[-1].update(mismatch=True, first_divergence=17, divergence_margin=0.02)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if truncate_rows:
        text = text[: len(text) - 40]  # the bench was killed mid-write
    (run / "rows.jsonl").write_text(text)
    if status == "complete":
        frame = pd.DataFrame(rows)
        (run / "summary.json").write_text(json.dumps({
            "results": [s.as_dict() for s in summarise_strategies(frame)],
            "by_category": [s.as_dict() for s in summarise_strategies(frame, by="category")],
            **({"noise": noise} if noise else {})}))
    if nvml:
        series = [{"strategy": s, "t_s": 0.1 * t, "metric": m, "value": 40 + 10 * i + 5 * ((t % 5) - 2)}
                  for i, s in enumerate(strategies) for t in range(30) for m in ("dram_bw_util_pct", "mem_util_pct")]
        pd.DataFrame(series).to_csv(run / "nvml_series.csv", index=False)
    return run


def printed(runs, fmt: str = "table", width: int = 80, **kwargs) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), force_terminal=fmt == "table")
    print_report(runs, fmt, console=console, **kwargs)
    return console.file.getvalue() if fmt != "table" else console.export_text()


# -- loading --------------------------------------------------------------------------------


def test_loads_complete_run(tmp_path):
    runs, warnings = load_runs([write_run(tmp_path)])
    assert warnings == []
    (run,) = runs
    assert run.complete and [s.strategy for s in run.summary] == list(STRATEGIES)
    assert len(run.rows) == len(STRATEGIES) * len(CATEGORIES) * 3
    written = pd.read_csv(tmp_path / "run-1" / "nvml_series.csv").to_dict("records")
    assert written and run.nvml_series == written


def test_a_run_without_nvml_has_no_series(tmp_path):
    (run,), _ = load_runs([write_run(tmp_path, nvml=False)])
    assert run.complete and run.nvml_series == []


@pytest.mark.parametrize("damage, needle", [
    (lambda run: (run / "run.json").write_text("{not json"), "run.json"),
    (lambda run: (run / "summary.json").unlink(), "complete but has no summary.json"),
    (lambda run: (run / "rows.jsonl").write_text((run / "rows.jsonl").read_text()[:-40]), "line"),
    (lambda run: (run / "rows.jsonl").write_text(json.dumps({"strategy": "ar", "wall_s": 1.0}) + "\n"), "lack key"),
])
def test_damaged_runs_are_one_clear_error(tmp_path, damage, needle):
    run = write_run(tmp_path)
    damage(run)
    with pytest.raises(SpecbenchError, match=needle):
        load_runs([run])


def test_not_a_run_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecbenchError, match="not a specbench run directory"):
        load_runs([tmp_path / "empty"])


def test_a_killed_run_is_reported_from_its_rows_and_marked_incomplete(tmp_path):
    """SIGKILL: no summary.json, the last row cut off, rows without speedups: report what they hold."""
    run = write_run(tmp_path, status="incomplete", truncate_rows=True)
    runs, warnings = load_runs([run])
    assert any("incomplete" in w for w in warnings) and any("cut-off" in w for w in warnings)
    rows = pd.DataFrame(make_rows())[:-1]
    assert runs[0].summary == summarise_strategies(rows)  # the same figures a finished run would have written
    assert "dflash+eagle" in printed(runs)


def test_incomplete_run_with_no_rows(tmp_path):
    run = write_run(tmp_path, status="incomplete", nvml=False)
    (run / "rows.jsonl").unlink()
    runs, _ = load_runs([run])
    assert runs[0].summary == [] and "no measurements yet" in printed(runs)


def test_mismatch_is_warned(tmp_path):
    _, warnings = load_runs([write_run(tmp_path, mismatch=True)])
    assert any("mismatch" in w and "dflash+eagle" in w and "token 17" in w and "logit margin there 0.02" in w
               for w in warnings)


# -- the comparison is the summaries' own figures ---------------------------------------------


def test_comparison_renders_the_summaries(tmp_path):
    runs, _ = load_runs([write_run(tmp_path)])
    df = comparison(runs)
    assert list(df["strategy"]) == list(STRATEGIES)
    for (_, row), summary in zip(df.iterrows(), runs[0].summary):
        assert row["speedup"] == summary.speedup and row["tau"] == summary.tau
        assert row["acceptance_rate_by_position"] == summary.acceptance_rate_by_position
        assert row["conditional_acceptance_by_position"] == summary.conditional_acceptance_by_position
        assert sum(row[f"share_{p}"] for p in ("prefill", "draft", "verify", "other")) == pytest.approx(1.0)
    by_category = comparison(runs, by="category")
    assert len(by_category) == len(STRATEGIES) * len(CATEGORIES)
    assert list(by_category["speedup"]) == [s.speedup for s in runs[0].by_category]
    with pytest.raises(SpecbenchError, match="grouping"):
        comparison(runs, by="prompt")


def test_runs_of_different_models_are_grouped_not_merged(tmp_path):
    a = write_run(tmp_path / "a", model="model-a")
    b = write_run(tmp_path / "b", model="model-b", strategies=("ar", "eagle"))
    runs, warnings = load_runs([a, b])
    assert any("separate groups" in w for w in warnings)
    df = comparison(runs)
    assert sorted(df.groupby("group")["model"].unique().map(tuple)) == [("model-a",), ("model-b",)]
    text = render(df, "markdown")
    assert text.count("| strategy |") == 2 and "model: model-a" in text and "model: model-b" in text


# -- what a person reads ------------------------------------------------------------------------


def test_the_default_table_fits_80_columns_with_a_legend(tmp_path):
    runs, _ = load_runs([write_run(tmp_path)])
    text = printed(runs, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text  # nothing truncated
    assert "speedup [95% CI]" in text and "tok/s" in text and "mismatch" in text
    assert "tau: tokens per target forward" in text  # the legend names each column and its unit
    assert "drafts accepting it / drafts" in text and "p1" in text and "0.85" in text  # its own table
    wide = printed(runs, width=200, wide=True)
    assert "prefill" in wide and "needs GB" in wide and "meas/pred" not in wide  # no cost model in this run


def test_sampling_runs_show_no_mismatch_count(tmp_path):
    runs, _ = load_runs([write_run(tmp_path, sampling=True)])
    assert all(s.mismatches is None for s in runs[0].summary)
    text = printed(runs, "markdown")
    assert "| n/a |" in text and "n/a when sampling" in text


def test_noisy_runs_are_marked(tmp_path):
    noise = {"noisy": True, "reasons": ["other processes used 40% of the CPUs"], "advice": ["rerun on a quiet machine"],
             "prompts": 6, "others_cpu_share": 0.4, "steal_share": 0.0, "clock_change": None, "ar_spread": None,
             "load_before": 1.0, "cpus": 2}
    runs, _ = load_runs([write_run(tmp_path, noise=noise)])
    text = printed(runs, "markdown")
    assert "| eagle | ~1.47x" in text and "| ar | 1.00x |" in text and "other processes used 40%" in text


def test_csv_and_json_parse_back_as_strict_json(tmp_path):
    runs, _ = load_runs([write_run(tmp_path)])
    for by in ("strategy", "category"):
        df = comparison(runs, by=by)
        back = pd.read_csv(io.StringIO(render(df, "csv")))
        assert list(back.columns) == list(df.columns) and len(back) == len(df)
        records = json.loads(render(df, "json"), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
        assert len(records) == len(df) and set(records[0]) == set(df.columns)
    ar = json.loads(render(comparison(runs), "json"))[0]
    assert ar["strategy"] == "ar" and ar["draft_efficiency"] is None  # undefined, written as null
    with pytest.raises(SpecbenchError, match="format"):
        render(comparison(runs), "html")


def test_two_runs_side_by_side(tmp_path):
    a = write_run(tmp_path / "a", name="run")
    b = write_run(tmp_path / "b", name="run", strategies=("ar", "eagle"), nvml=False)
    runs, _ = load_runs([a, b])
    df = comparison(runs)
    assert df["run"].nunique() == 2 and len(df) == 5
    md = render(df, "markdown").splitlines()
    assert md[0] == "model: tiny, suite: default"
    assert md[2].startswith("| run | strategy |")
    assert any(str(a) in line for line in md)  # same directory name twice: labelled by path


# -- plots ----------------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plots_are_valid_readable_pngs(tmp_path):
    run = write_run(tmp_path)
    paths = write_plots(load_runs([run])[0], tmp_path / "plots")
    names = {p.name for p in paths}
    assert names == {"speedup.png", "tau_by_category.png", "acceptance_by_position.png",
                     "time_breakdown.png", "throughput_vs_memory.png", "nvml_bandwidth.png"}
    for path in paths:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        with Image.open(path) as image:
            width, height = image.size
        assert 400 <= width <= 1600 and 250 <= height <= 1600, (path.name, image.size)


def test_every_strategy_has_its_own_colour_and_marker():
    from specbench.methods.names import all_strategies

    names = ["ar"] + [s.name for s in all_strategies()]
    assert len({style(n) for n in names}) == len(names)
    assert len({style(n)[0] for n in names}) == len(names)  # colours alone tell them apart too


def test_plots_of_several_runs(tmp_path):
    a = write_run(tmp_path / "a", name="gpu-run")
    b = write_run(tmp_path / "b", name="cpu-run", nvml=False)
    assert "nvml_bandwidth.png" not in {p.name for p in write_plots(load_runs([b])[0], tmp_path / "pb")}
    runs, _ = load_runs([a, b])
    assert len(write_plots(runs, tmp_path / "both")) == 6


def test_the_run_reports_start_up_notes_and_engine_agreement():
    meta = RunMeta("complete", "m", "s", None, None, None, [], None)
    result = RunResult(Path("run"), meta, {}, {}, [], [], notes=["batch size 8 is measured as 4"],
                       engines=[EngineReport("vllm", {"ngram": 41.6}, {"compile_s": {"ngram": 0.0}})],
                       engine_pairs=[EnginePair("specbench", "vllm", 3, 2, [5], {})])
    assert [line.text for line in start_and_notes(result)] == [
        "vllm engine for ngram started in 42 s (eager: nothing compiled)", "note: batch size 8 is measured as 4"]
    assert [line.text for line in lossless_checks(result, RunConfig())] == [
        "engines: vllm's ar and specbench's agree on 2 of 3 greedy outputs; earliest divergence at token 5"]
    assert lossless_checks(result, RunConfig(temperature=0.7)) == []  # sampled outputs are not compared
