"""Report tables and plots against run directories written by a small fixture generator."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from rich.console import Console
from rich.table import Table

from specbench.errors import SpecbenchError
from specbench.measure.stats import geometric_mean
from specbench.plots import write_plots
from specbench.report import ROW_KEYS, comparison, load_runs, render

STRATEGIES = ("ar", "eagle", "dflash+eagle")
CATEGORIES = ("code", "creative writing", "math")
ACCEPT = {"eagle": [0.8, 0.7, 0.6, 0.5], "dflash+eagle": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]}


def make_rows(strategies=STRATEGIES, categories=CATEGORIES, prompts_per_category=3, seed=0) -> list[dict]:
    """Per-prompt rows as the bench writes them: ar first, speedups paired on prompt/turn/repeat."""
    rng = random.Random(seed)
    rows, ar_wall = [], {}
    for strategy in strategies:
        for c, category in enumerate(categories):
            for p in range(prompts_per_category):
                prompt_id = f"{category[:4]}-{p}"
                new_tokens = 128
                if strategy == "ar":
                    steps, drafted, accepted, acc_pos, drf_pos = new_tokens, 0, 0, [], []
                else:
                    rates = [min(1.0, r + 0.05 * c) for r in ACCEPT[strategy]]
                    steps = 40 + rng.randint(0, 10)
                    drf_pos = [steps] * len(rates)
                    reach, acc_pos = 1.0, []
                    for r in rates:
                        reach *= r
                        acc_pos.append(int(round(steps * reach)))
                    drafted, accepted = sum(drf_pos), sum(acc_pos)
                verify = 0.010 * steps * (1.0 if strategy == "ar" else 1.2)
                draft = 0.0 if strategy == "ar" else 0.002 * steps * len(drf_pos)
                other = 0.001 * steps
                wall = verify + draft + other
                if strategy == "ar":
                    ar_wall[prompt_id] = wall
                rows.append({
                    "strategy": strategy, "prompt_id": prompt_id, "category": category, "turn": 0,
                    "repeat": 0, "prompt_tokens": 50, "new_tokens": new_tokens, "wall_s": wall,
                    "ttft_s": 0.02, "tpot_s": wall / new_tokens, "steps": steps,
                    "tau": new_tokens / steps, "drafted": drafted, "accepted": accepted,
                    "accept_by_position": acc_pos,
                    "draft_s": draft, "verify_s": verify, "other_s": other,
                    "memory_bytes": int(1.0e9), "peak_mem_bytes": int(2.0e9 + 0.3e9 * strategies.index(strategy)),
                    "mismatch": False, "first_divergence": None,
                    "speedup": None if strategy == "ar" else ar_wall[prompt_id] / wall,
                })
    return rows


def summarise(rows: list[dict], with_extras: bool = True) -> dict:
    df = pd.DataFrame(rows)
    results = []
    for strategy, g in df.groupby("strategy", sort=False):
        speed = 1.0 if strategy == "ar" else geometric_mean(g["speedup"])
        total = g[["draft_s", "verify_s", "other_s"]].to_numpy().sum()
        result = {
            "strategy": strategy, "prompts": int(g["prompt_id"].nunique()),
            "new_tokens": int(g["new_tokens"].sum()), "wall_s": float(g["wall_s"].sum()),
            "tokens_per_s": float(g["new_tokens"].sum() / g["wall_s"].sum()), "speedup": speed,
            "speedup_ci": [speed * 0.93, speed * 1.06], "tau": float(g["new_tokens"].sum() / g["steps"].sum()),
            "draft_efficiency": float(g["accepted"].sum() / g["drafted"].sum()) if g["drafted"].sum() else None,
            "acceptance_by_position": ACCEPT.get(strategy, []), "mismatches": 0,
            "draft_frac": float(g["draft_s"].sum() / total), "verify_frac": float(g["verify_s"].sum() / total),
            "other_frac": float(g["other_s"].sum() / total), "peak_mem_bytes": int(g["peak_mem_bytes"].max()),
        }
        if with_extras and strategy != "ar":
            result["cost_model"] = {"predicted_tau": result["tau"] * 1.05, "predicted_speedup": speed * 1.1}
            result["nvml"] = {"available": True, "mem_util_pct_mean": 61.0, "dram_bw_gbs_mean": 2900.0,
                              "energy_j": 120.5}
            result["projection"] = {"projected": True, "gpu": "rtx4090", "tokens_per_s": 95.0,
                                    "speedup": 2.1, "memory_fit": {"projected": True, "fits": True}}
        results.append(result)
    return {"results": results}


def write_run(
    root: Path,
    name: str = "run-1",
    status: str = "complete",
    strategies=STRATEGIES,
    nvml: bool = True,
    summary: bool = True,
    truncate_rows: bool = False,
    mismatch: bool = False,
) -> Path:
    """Write a run directory with the bench's layout; returns its path."""
    run = root / name
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "status": status, "model": "specbench/tiny-default", "suite": "default",
        "started": "2026-11-29T10:00:00+00:00",
        "finished": "2026-11-29T10:05:00+00:00" if status == "complete" else None,
        "specbench_version": "0.1.0", "strategies": list(strategies), "gpu_profile": None,
    }))
    (run / "config.json").write_text(json.dumps({"max_new_tokens": 128, "temperature": 0.0}))
    (run / "environment.json").write_text(json.dumps({"python": "3.11", "torch": "2.13"}))
    rows = make_rows(strategies)
    if mismatch:
        rows[-1].update(mismatch=True, first_divergence=17, divergence_margin=0.02)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if truncate_rows:
        text = text[: len(text) - 40]  # the bench was killed mid-write
    (run / "rows.jsonl").write_text(text)
    if summary:
        (run / "summary.json").write_text(json.dumps(summarise(rows)))
    if nvml:
        series = []
        for s_i, strategy in enumerate(strategies):
            for t in range(30):
                series.append({"strategy": strategy, "t_s": 0.1 * t, "metric": "dram_bw_util_pct",
                               "value": 40 + 10 * s_i + 5 * ((t % 5) - 2)})
                series.append({"strategy": strategy, "t_s": 0.1 * t, "metric": "mem_util_pct",
                               "value": 55 + 8 * s_i + 3 * ((t % 3) - 1)})
                series.append({"strategy": strategy, "t_s": 0.1 * t, "metric": "power_w", "value": 300.0})
        pd.DataFrame(series).to_csv(run / "nvml_series.csv", index=False)
    return run


# -- loading --------------------------------------------------------------------------------


def test_loads_complete_run(tmp_path):
    runs, warnings = load_runs([write_run(tmp_path)])
    assert warnings == []
    (run,) = runs
    assert run.complete and run.label == "run-1"
    assert set(ROW_KEYS) <= set(run.rows.columns)
    assert len(run.rows) == len(STRATEGIES) * len(CATEGORIES) * 3
    assert run.strategies() == list(STRATEGIES)
    assert run.config["max_new_tokens"] == 128


def test_not_a_run_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecbenchError, match="not a specbench run directory"):
        load_runs([tmp_path / "empty"])
    with pytest.raises(SpecbenchError, match="not a specbench run directory"):
        load_runs([tmp_path / "missing"])
    with pytest.raises(SpecbenchError, match="no run directories"):
        load_runs([])


def test_bad_run_json(tmp_path):
    run = write_run(tmp_path)
    (run / "run.json").write_text("{not json")
    with pytest.raises(SpecbenchError, match="run.json"):
        load_runs([run])
    (run / "run.json").write_text(json.dumps({"status": "done"}))
    with pytest.raises(SpecbenchError, match="status"):
        load_runs([run])


def test_complete_run_without_summary_is_an_error(tmp_path):
    run = write_run(tmp_path, summary=False)
    with pytest.raises(SpecbenchError, match="complete but has no summary.json"):
        load_runs([run])


def test_incomplete_run_loads_what_it_has(tmp_path):
    run = write_run(tmp_path, status="incomplete", summary=False, truncate_rows=True)
    runs, warnings = load_runs([run])
    assert any("incomplete" in w for w in warnings)
    assert any("cut-off last line" in w for w in warnings)
    assert len(runs[0].rows) == len(STRATEGIES) * len(CATEGORIES) * 3 - 1
    df = comparison(runs, by="strategy")
    assert list(df["strategy"]) == list(STRATEGIES)
    assert df["speedup_ci_low"].isna().all()  # no bootstrap without summary.json
    assert df.loc[df["strategy"] == "ar", "speedup"].item() == 1.0


def test_incomplete_run_with_no_rows(tmp_path):
    run = write_run(tmp_path, status="incomplete", summary=False, nvml=False)
    (run / "rows.jsonl").unlink()
    runs, warnings = load_runs([run])
    assert "0 rows" in warnings[0]
    assert comparison(runs).empty
    assert write_plots(runs, tmp_path / "plots") == []


def test_corrupt_rows_in_complete_run(tmp_path):
    run = write_run(tmp_path, truncate_rows=True)
    with pytest.raises(SpecbenchError, match="line"):
        load_runs([run])


def test_missing_row_keys(tmp_path):
    run = write_run(tmp_path)
    (run / "rows.jsonl").write_text(json.dumps({"strategy": "ar", "wall_s": 1.0}) + "\n")
    with pytest.raises(SpecbenchError, match="lack key"):
        load_runs([run])


def test_mismatch_is_warned(tmp_path):
    _, warnings = load_runs([write_run(tmp_path, mismatch=True)])
    assert any("mismatch" in w and "dflash+eagle" in w and "token 17" in w and "logit margin there 0.02" in w
               for w in warnings)


# -- tables ---------------------------------------------------------------------------------


def test_comparison_by_strategy_uses_summary(tmp_path):
    runs, _ = load_runs([write_run(tmp_path)])
    df = comparison(runs, by="strategy")
    assert list(df["strategy"]) == list(STRATEGIES)
    eagle = df[df["strategy"] == "eagle"].iloc[0]
    assert eagle["speedup_ci_low"] < eagle["speedup"] < eagle["speedup_ci_high"]
    assert eagle["projected_gpu"] == "rtx4090" and eagle["projected_speedup"] == 2.1
    assert eagle["dram_bw_gbs"] == 2900.0
    assert eagle["predicted_tau"] == pytest.approx(eagle["tau"] * 1.05)


def test_comparison_by_category(tmp_path):
    runs, _ = load_runs([write_run(tmp_path)])
    df = comparison(runs, by="category")
    assert len(df) == len(STRATEGIES) * len(CATEGORIES)
    rows = runs[0].rows
    sel = rows[(rows["strategy"] == "eagle") & (rows["category"] == "math")]
    got = df[(df["strategy"] == "eagle") & (df["category"] == "math")].iloc[0]
    assert got["tokens_per_s"] == pytest.approx(sel["new_tokens"].sum() / sel["wall_s"].sum())
    assert got["tau"] == pytest.approx(sel["new_tokens"].sum() / sel["steps"].sum())
    assert got["speedup"] == pytest.approx(geometric_mean(sel["speedup"]))
    assert got["prompts"] == 3
    with pytest.raises(SpecbenchError, match="grouping"):
        comparison(runs, by="prompt")


def test_geometric_mean():
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    assert geometric_mean([2.0, None, float("nan")]) == pytest.approx(2.0)


def test_csv_and_json_parse_back(tmp_path):
    runs, _ = load_runs([write_run(tmp_path)])
    for by in ("strategy", "category"):
        df = comparison(runs, by=by)
        back = pd.read_csv(io.StringIO(render(df, "csv")))
        assert list(back.columns) == list(df.columns)
        assert len(back) == len(df)
        records = json.loads(render(df, "json"))
        assert len(records) == len(df) and set(records[0]) == set(df.columns)
    df = comparison(runs)
    for col in ("run", "model", "strategy", "tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high",
                "tau", "draft_efficiency", "mismatches", "peak_mem_gb"):
        assert col in df.columns
    ar = json.loads(render(df, "json"))[0]
    assert ar["strategy"] == "ar" and ar["predicted_tau"] is None  # NaN is written as null


def test_markdown_and_table(tmp_path):
    runs, _ = load_runs([write_run(tmp_path)])
    md = render(comparison(runs), "markdown")
    assert "run: run-1" in md
    header = md.splitlines()[2]
    assert header.startswith("| strategy |") and "speedup [95% CI]" in header
    assert md.count("\n|") >= len(STRATEGIES) + 1
    table = render(comparison(runs, "category"), "table")
    assert isinstance(table, Table)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(table)
    assert "creative writing" in console.export_text()
    with pytest.raises(SpecbenchError, match="format"):
        render(comparison(runs), "html")


def test_two_runs_side_by_side(tmp_path):
    a = write_run(tmp_path / "a", name="run")
    b = write_run(tmp_path / "b", name="run", strategies=("ar", "eagle"), nvml=False)
    runs, _ = load_runs([a, b])
    df = comparison(runs)
    assert df["run"].nunique() == 2 and len(df) == 5
    md = render(df, "markdown").splitlines()
    assert md[0] == "model: specbench/tiny-default, suite: default"
    assert md[2].startswith("| run | strategy |")
    assert any(str(a) in line for line in md)  # same directory name twice: labelled by path


# -- plots ----------------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plots_are_valid_pngs(tmp_path):
    run = write_run(tmp_path)
    paths = write_plots(run, tmp_path / "plots")
    names = {p.name for p in paths}
    assert names == {"speedup.png", "tau_by_category.png", "acceptance_by_position.png",
                     "time_breakdown.png", "throughput_vs_memory.png", "nvml_bandwidth.png"}
    for path in paths:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        with Image.open(path) as image:
            width, height = image.size
        assert 400 <= width <= 3000 and 300 <= height <= 3000, (path.name, image.size)


def test_plots_without_nvml_series_and_of_several_runs(tmp_path):
    a = write_run(tmp_path / "a", name="gpu-run")
    b = write_run(tmp_path / "b", name="cpu-run", nvml=False)
    assert "nvml_bandwidth.png" not in {p.name for p in write_plots(b, tmp_path / "pb")}
    runs, _ = load_runs([a, b])
    paths = write_plots(runs, tmp_path / "both")
    assert len(paths) == 6
