"""The command line through Typer's runner: a real run on a local tiny model, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and "specbench" in result.output


@pytest.fixture(scope="module")
def json_run(tiny_model_dir, tiny_draft_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    result = invoke("run", "--model", tiny_model_dir, "--drafter", tiny_draft_dir, "--strategy", "ngram,draft",
                    "--limit", 3, "--max-new-tokens", 12, "--out", out, "--json", "--warmup", 0)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), out


def test_run_json_shape(json_run):
    report, _ = json_run
    assert [r["strategy"] for r in report["results"]] == ["ar", "ngram", "draft"]
    for r in report["results"]:
        for key in ("strategy", "prompts", "tokens_per_s", "speedup", "speedup_ci", "tau", "draft_efficiency",
                    "mismatches"):
            assert key in r
        assert r["mismatches"] == 0
        assert r["prompts"] == 3
        assert len(r["speedup_ci"]) == 2
    run_dir = Path(report["run_dir"])
    for name in ("run.json", "config.json", "environment.json", "rows.jsonl", "rows.parquet", "summary.md",
                 "summary.csv"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"


def test_report_of_a_run(json_run):
    report, _ = json_run
    result = invoke("report", report["run_dir"], "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("run,") or "strategy" in result.output.splitlines()[0]


def test_resume_finishes_an_interrupted_run(json_run, tiny_model_dir, tiny_draft_dir):
    report, out = json_run
    run_dir = Path(report["run_dir"])
    lines = (run_dir / "rows.jsonl").read_text().splitlines()
    # keep the first prompt and half a row of the second: as if interrupted mid-write
    (run_dir / "rows.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][: len(lines[4]) // 2])
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "status": "incomplete"}))
    result = invoke("run", "--resume", run_dir, "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 9
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"


def test_suites_lists_builtin():
    result = invoke("suites")
    assert result.exit_code == 0 and "specbench" in result.output and "code" in result.output


@pytest.mark.parametrize("args, message", [
    (["--strategy", "nope"], "unknown strategy"),
    (["--strategy", "ngram+ngram"], "repeat"),
    (["--strategy", "ngram+ar"], "baseline"),
    (["--categories", "poetry"], "unknown category"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--temperature", "-1"], "temperature"),
    (["--model", "./does/not/exist"], "model path"),
    (["--device", "cuda"], "CUDA"),
    (["--set", "ngram.bogus=1"], "valid: ngram.max_ngram"),
    (["--suite", "missing.jsonl"], "missing.jsonl"),
])
def test_bad_input_is_one_line_exit_2(args, message, tmp_path):
    import torch

    if args == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = invoke("run", "--out", tmp_path, "--limit", 1, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_malformed_suite_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi"}\n{not json}\n')
    result = invoke("run", "--suite", bad, "--out", tmp_path)
    assert result.exit_code == 2 and "line 2" in result.output


def test_config_file_and_flags_override(tiny_model_dir, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f'model = "{tiny_model_dir}"\nstrategy = ["ngram"]\nlimit = 1\nmax_new_tokens = 50\n'
                      f'warmup = 0\n[knobs.ngram]\nnum_pred_tokens = 3\n')
    result = invoke("run", "--config", config, "--max-new-tokens", 4, "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    saved = json.loads((Path(report["run_dir"]) / "config.json").read_text())
    assert saved["max_new_tokens"] == 4 and saved["knobs"] == {"ngram": {"num_pred_tokens": 3}}
    bad = tmp_path / "bad.toml"
    bad.write_text("max_new_tokens = [\n")
    result = invoke("run", "--config", bad)
    assert result.exit_code == 2 and "bad.toml" in result.output


def test_multi_turn_suite_runs_turn_by_turn(tiny_model_dir, tmp_path):
    suite = tmp_path / "mt.jsonl"
    suite.write_text('{"question_id": 1, "category": "writing", "turns": ["Write a line.", "Now shorter."]}\n')
    result = invoke("run", "--model", tiny_model_dir, "--suite", suite, "--strategy", "ngram",
                    "--max-new-tokens", 6, "--out", tmp_path, "--json", "--warmup", 0)
    assert result.exit_code == 0, result.output
    rows_file = Path(json.loads(result.stdout)["run_dir"]) / "rows.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    turns = [(r["strategy"], r["turn"]) for r in rows]
    assert sorted(turns) == [("ar", 0), ("ar", 1), ("ngram", 0), ("ngram", 1)]
    first, second = (next(r for r in rows if r["strategy"] == "ar" and r["turn"] == t) for t in (0, 1))
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["new_tokens"] - 1  # the answer is in the context


def test_a_speed_bench_directory_runs_with_its_categories(tiny_model_dir, tmp_path):
    from tests.test_suites import write_speed_bench

    suite = write_speed_bench(tmp_path / "speed-bench")
    result = invoke("run", "--model", tiny_model_dir, "--suite", suite, "--strategy", "ngram", "--max-new-tokens", 4,
                    "--out", tmp_path, "--json", "--warmup", 0)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["suite"] == "speed-bench-qualitative"
    assert {s["category"] for s in report["by_category"]} == {"coding", "roleplay", "writing"}
    result = invoke("report", report["run_dir"], "--by", "category", "--format", "json")
    assert {r["category"] for r in json.loads(result.stdout)} == {"coding", "roleplay", "writing"}


def test_interrupt_keeps_finished_prompts(tiny_model_dir, tmp_path, monkeypatch):
    import specbench.bench.pipeline as benchmark

    real = benchmark.measure_group
    calls = []

    def interrupted_after_two(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(benchmark, "measure_group", interrupted_after_two)
    result = invoke("run", "--model", tiny_model_dir, "--strategy", "ngram", "--limit", 4, "--max-new-tokens", 4,
                    "--out", tmp_path, "--warmup", 0)
    assert result.exit_code == 130
    run_dir = next((tmp_path / "runs").iterdir())
    assert json.loads((run_dir / "run.json").read_text())["status"] == "incomplete"
    assert len((run_dir / "rows.jsonl").read_text().splitlines()) == 4
    assert (run_dir / "summary.json").is_file()


def test_gpu_projection_and_unknown_profile(json_run, tiny_model_dir, tmp_path):
    result = invoke("run", "--gpu", "nope", "--limit", 1)
    assert result.exit_code == 2 and "rtx4090" in result.output
    result = invoke("run", "--model", tiny_model_dir, "--strategy", "ngram", "--limit", 1, "--max-new-tokens", 4,
                    "--gpu", "rtx4090", "--out", tmp_path, "--json", "--warmup", 0)
    assert result.exit_code == 0, result.output
    for r in json.loads(result.stdout)["results"]:
        assert r["projection"]["projected"] is True and r["projection"]["gpu"] == "rtx4090"
        assert r["projection"]["tokens_per_s"] > 0


def test_hardware_lists_profiles():
    result = invoke("hardware", "--json")
    assert result.exit_code == 0
    listing = json.loads(result.stdout)
    assert "h200" in json.dumps(listing) and "rtx4090" in json.dumps(listing)


def test_report_to_file_and_by_category(json_run, tmp_path):
    report, _ = json_run
    target = tmp_path / "report.json"
    result = invoke("report", report["run_dir"], "--by", "category", "--format", "json", "--out", target)
    assert result.exit_code == 0, result.output
    records = json.loads(target.read_text())
    assert records and {"strategy", "category", "tau", "speedup"} <= set(records[0])
    result = invoke("report", tmp_path)
    assert result.exit_code == 2 and "not a specbench run" in result.output


def test_library_run_config_limit_zero_is_the_whole_suite(tiny_model_dir):
    # prepare uses the validated copy of the configuration, as the CLI does
    from specbench.bench.prepare import prepare
    from specbench.plan.run_config import RunConfig
    from specbench.plan.suites import load_suite
    bench = prepare(RunConfig(strategies=["ngram"], model=str(tiny_model_dir), limit=0, device="cpu").plan())
    assert bench.config.limit is None
    assert len(bench.suite.items) + len(bench.skipped) == len(load_suite("default").items)
