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
        for key in ("strategy", "prompts", "tokens_per_s", "speedup", "speedup_ci", "tau", "acceptance_rate", "mismatches"):
            assert key in r
        assert r["mismatches"] == 0
        assert r["prompts"] == 3
        assert len(r["speedup_ci"]) == 2
    run_dir = Path(report["run_dir"])
    for name in ("run.json", "config.json", "environment.json", "rows.jsonl", "rows.parquet", "summary.md", "summary.csv"):
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


def test_unimplemented_commands_exit_2():
    for command in ("tune", "recommend"):
        result = invoke(command)
        assert result.exit_code == 2 and "not implemented" in result.output
