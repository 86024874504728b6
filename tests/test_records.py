"""The typed records: what a run measures is what reading its directory gives back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from specbench.bench.pipeline import run_benchmark
from specbench.core.errors import SpecbenchError
from specbench.core.records import (
    ROW_KEYS,
    SUMMARY_KEYS,
    EngineReport,
    Environment,
    Row,
    RunMeta,
    RunResult,
    ServedStudy,
    StrategySummary,
    SummaryFile,
    TunedStudy,
)
from specbench.core.records.study_records import (
    Gain,
    Gains,
    Holdout,
    ServedBest,
    ServedFigures,
    ServedTrial,
    Speedups,
    TrialCounts,
)
from specbench.plan.run_config import RunConfig
from specbench.report.run_dir import read_run
from specbench.report.tune_report import study_lines
from tests.helpers import write_run

RUN_JSON = RunMeta("complete", "m", "s", None, None, None, [], None)


@pytest.mark.parametrize("batch_sizes", [[1], [1, 2]])
def test_a_run_read_back_is_the_run_measured(tiny_model_dir, tmp_path, batch_sizes):
    result = run_benchmark(RunConfig(model=str(tiny_model_dir), strategies=["ngram"], limit=3, max_new_tokens=6,
                                     warmup=0, device="cpu", out=str(tmp_path), batch_sizes=batch_sizes).plan())
    assert result.complete and result.rows and result.summary
    assert {s.batch_size for s in result.summary} == set(batch_sizes)
    assert all(r.speedup is not None for r in result.rows)  # paired with ar's before they were written
    assert read_run(result.path) == result


def test_rows_keep_the_files_schema(tiny_model_dir, tmp_path):
    result = run_benchmark(RunConfig(model=str(tiny_model_dir), strategies=["ngram"], limit=2, max_new_tokens=4,
                                     warmup=0, device="cpu", out=str(tmp_path)).plan())
    written = [json.loads(line) for line in (result.path / "rows.jsonl").read_text().splitlines()]
    assert written == [r.as_dict() for r in result.rows]
    assert "batch_rows" not in written[0] and "engines_agree" not in written[0]  # batched and vLLM rows only
    summary = json.loads((result.path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result.summary_json()))
    meta = json.loads((result.path / "run.json").read_text())
    assert meta == result.meta.as_dict() and list(meta) == ["status", "model", "suite", "started", "finished",
                                                            "specbench_version", "strategies", "gpu_profile", "noise"]
    environment = json.loads((result.path / "environment.json").read_text())
    assert environment == result.environment.as_dict() and environment["torch"] == torch.__version__
    assert list(environment) == ["specbench", "git_revision", "python", "torch", "transformers", "platform", "cpu",
                                 "cpu_count", "torch_threads", "cuda", "drafters"]
    assert "transfer" not in summary["results"][1] and "by_category" in summary


def test_older_rows_read_with_their_defaults():
    old = {key: 0 for key in ROW_KEYS} | {"strategy": "ar", "prompt_id": "p", "category": "c",
                                          "accept_by_position": [], "mismatch": False, "first_divergence": None}
    row = Row.from_dict(old)
    assert row.batch_size == 1 and row.engine == "specbench" and row.speedup is None
    with pytest.raises(SpecbenchError, match="lack key"):
        Row.from_dict({"strategy": "ar"})
    assert StrategySummary.from_dict({"strategy": "ar"} | {k: None for k in SUMMARY_KEYS[2:]}).engine \
        == "specbench"
    # run.json before the version and the --gpu profile were kept
    meta = RunMeta.from_dict({"status": "complete", "model": "m", "suite": "s", "strategies": ["ar"]})
    assert meta.complete and meta.specbench_version is None and meta.noise is None
    assert Environment.from_dict({"python": "3.11"}).cuda is None  # environment.json of an older version


def test_summaries_written_before_the_acceptance_rename_read_under_the_new_name():
    """Older summaries held the conditional per-position acceptance as `acceptance_by_position`, and no
    unconditional rate."""
    old = {k: None for k in SUMMARY_KEYS if k != "conditional_acceptance_by_position"}
    summary = StrategySummary.from_dict(old | {"strategy": "s", "acceptance_by_position": [0.8, 0.5]})
    assert summary.conditional_acceptance_by_position == [0.8, 0.5] and summary.acceptance_rate_by_position is None


def test_what_a_summary_and_a_run_note_read_as_records_and_write_back_unchanged():
    """A projection from before the sweep over batch sizes, a modelled speedup from before `rows`, and the
    two forms of the load axis."""
    projection = {"projected": True, "gpu": "rtx4090", "verify_s": 1e-3, "verify_bound": "memory", "draft_s": 0.0,
                  "overhead_s": 2e-5, "step_s": 1e-3, "tau": 2.0, "tokens_per_s": 2e3, "ar_tokens_per_s": 1e3,
                  "speedup": 2.0, "memory_fit": {"projected": True, "fits": True, "need_gb": 1.0, "have_gb": 24.0}}
    modelled = {"speedup": 1.5, "tokens_per_s": 30.0, "tau": 2.0, "block": 3.0, "step_s": 0.02, "verify_s": 0.015,
                "draft_s": 0.004, "overhead_s": 0.001, "ar_step_s": 0.01}
    saved = {"strategy": "s"} | {k: None for k in SUMMARY_KEYS[1:]} | {"projection": projection, "modelled": modelled}
    summary = StrategySummary.from_dict(saved)
    assert summary.projection.by_batch is None and summary.modelled.rows is None
    assert summary.as_dict() == saved
    noise = {"noisy": False, "reasons": [], "advice": [], "prompts": 6, "others_cpu_share": 0.01, "steal_share": 0.0,
             "clock_change": None, "ar_spread": None, "load_before": 0.2, "cpus": 8}
    point = {"strategy": "s", "batch_size": 2, "modelled_speedup": 1.2, "measured_speedup": None,
             "measured_over_modelled": None, "modelled_tokens_per_s": 40.0, "block": 2.5, "modelled_rows": 2.0,
             "continuous_speedup": 1.3, "measured_rows": None}
    for load in ({"note": "no cost table"}, {"cost_table": {"model": "m"}, "batch_sizes": [1, 2], "points": [point],
                                             "stops_paying": {}, "schedule": {}, "schedule_toml": "", "vllm": {}}):
        noted = {"noise": noise, "projection": {"gpu": "rtx4090", "projected": True}, "load": load}
        saved = SummaryFile.from_dict({"results": []} | noted)
        result = RunResult(Path("run"), RUN_JSON, {}, {}, [], [], **RunResult.noted(saved))
        assert result.load.modelled == ("note" not in load)
        assert [p.modelled_speedup for p in result.load.points] == ([] if "note" in load else [1.2])
        assert result.summary_json() == {"results": [], "skipped_prompts": [], "notes": []} | noted


def test_optional_entries_are_written_as_groups():
    base = {key: 0 for key in ROW_KEYS} | {"accept_by_position": [], "mismatch": False, "first_divergence": None}
    agreeing = Row.from_dict(base | {"engines_agree": True}).as_dict()
    assert agreeing["engines_first_divergence"] is None and agreeing["engines_divergence_margin"] is None
    batched = Row.from_dict(base | {"batch_rows": 2, "batch_size": 2}).as_dict()
    assert "batch_block" in batched and "engines_agree" not in batched and "speedup" not in batched


def test_a_tuned_study_keeps_its_files_schema():
    """Without a best trial a study writes none of its entries; with one, all of them, a None controller too.
    Records from before `session` was kept read without it."""
    study = TunedStudy(study="s", storage="sqlite:///s.db", strategy="ngram", model="m", label="measured here",
                       suite="mini", categories=[], temperature=0.0, max_new_tokens=8, trials=TrialCounts(2),
                       target_trials=2, created="2025-01-01", best_params=None, best_value=None, toml=None, plots=[],
                       gpu=None, projected=False, objectives=["speedup"], batch_size=1,
                       prompts={"tuning": 2, "holdout": 1}, note="no trial completed")
    written = study.as_dict()
    assert written["gpu"] is None and written["session"] == [] and written["note"] == "no trial completed"
    assert not {"best_trial", "controller", "tuning", "pareto", "engines", "vllm_config"} & set(written)
    assert TunedStudy.from_dict(written) == study
    assert TunedStudy.from_dict({k: v for k, v in written.items() if k != "session"}).session == []
    best = dataclasses.replace(study, note=None, best_trial=1, best_params={"n": 3}, best_value=1.4, knobs={},
                               importances={}, tuning=Speedups(1.4, [1.2, 1.6], 2),
                               holdout=Holdout(tuned=Speedups(1.3, [1.1, 1.5], 1)),
                               gain=Gains(Gain(None, [None, None], 0), None))
    written = best.as_dict()
    assert written["controller"] is None and "note" not in written
    assert written["holdout"] == {"tuned": {"speedup": 1.3, "speedup_ci": [1.1, 1.5], "prompts": 1}, "failures": []}
    assert written["gain"] == {"holdout": {"gain": None, "gain_ci": [None, None], "prompts": 0}, "tuning": None}
    assert TunedStudy.from_dict(written) == best and best.held_out("tuned") == 1.3 and best.held_out("defaults") is None
    with pytest.raises(SpecbenchError, match=r"^x\.json lack key\(s\): strategy$"):
        TunedStudy.from_dict({k: v for k, v in written.items() if k != "strategy"}, "x.json")


def test_a_run_from_before_engines_were_plug_ins_reads_its_vllm_report(tmp_path):
    """Run directories written when vLLM was the one other engine kept its start-up and idle engines as two
    entries of summary.json; they read as vLLM's engine report, and are written back in the new form."""
    path = write_run(tmp_path, "old", {"ngram": 1.3})
    saved = json.loads((path / "summary.json").read_text())
    saved |= {"vllm_start_s": {"ar": 12.5, "ngram": 14.0}, "vllm_idle_engines": "stopped (SIGSTOP)"}
    (path / "summary.json").write_text(json.dumps(saved))
    run = read_run(path)
    assert run.engines == [EngineReport("vllm", {"ar": 12.5, "ngram": 14.0}, {"idle_engines": "stopped (SIGSTOP)"})]
    written = run.summary_json()
    assert "vllm_start_s" not in written and written["engines"][0]["start_s"] == {"ar": 12.5, "ngram": 14.0}
    assert read_run(path).summary == run.summary and read_run(path).engine_pairs == []


def test_a_served_study_reads_back_as_written():
    figures = {"goodput_req_s": 1.5, "tpot_p50_ms": 40.0, "ttft_p50_ms": 90.0, "e2e_p50_ms": 700.0,
               "tpot_p99_ms": 60.0, "output_tok_s": 50.0, "req_s": 1.6}
    trial = figures | {"tpot_speedup": 1.2, "tau": 1.8, "number": 0, "params": {"max_ngram": 3}, "value": 1.5,
                       "speculative_config": {"method": "ngram"}, "wall_s": 30.0}
    study = ServedStudy(study="s", storage="sqlite:///s.db", strategy="ngram", model="m", label="at concurrency 2",
                        suite="mini", categories=[], temperature=0.0, max_new_tokens=8,
                        trials=TrialCounts(1, complete=1), target_trials=1, created="2025-01-01",
                        best_params={"max_ngram": 3}, best_value=1.5, toml="s.toml", plots=[], best_trial=0, knobs={},
                        engine="vllm", objective="goodput_req_s", unit="req/s", direction="maximize",
                        load={"concurrency": 2, "request_rate": None}, slo={}, requests=4, engine_args={},
                        logs="logs", baseline=ServedFigures(**figures), measured=[ServedTrial.from_dict(trial)],
                        best=ServedBest.from_dict(trial))
    written = json.loads(json.dumps(study.as_dict()))
    assert written["baseline"] == figures and written["measured"] == [trial]
    assert written["best"] == figures | {"tpot_speedup": 1.2, "tau": 1.8}
    assert ServedStudy.from_dict(written) == study
    lines, warnings = study_lines(study)
    assert "ar 1.5 req/s; TPOT speedup over ar 1.20x" in lines[2] and warnings == []
