"""Ctrl-C and SIGTERM in `run` and `train`: what was kept is kept, and the message says how to carry on."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench.cli import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "many.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"def f{i}(x): return"}) + "\n" for i in range(200)))
    return path


def interrupt_on_call(n: int, real):
    """`real`, wrapped to raise KeyboardInterrupt on its n-th call; and the list of calls so far."""
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return wrapper, calls


def resume_command(stderr: str) -> list[str]:
    match = re.search(r"resume it with: (specbench run --resume \S+)", stderr)
    assert match, stderr
    return shlex.split(match.group(1))


def test_ctrl_c_in_run_prints_the_resume_command_that_finishes_it(tiny_model_dir, tmp_path, monkeypatch):
    import specbench.bench.pipeline as benchmark

    real = benchmark.measure_group
    monkeypatch.setattr(benchmark, "measure_group", interrupt_on_call(2, real)[0])
    result = invoke("run", "--model", tiny_model_dir, "--strategy", "ngram", "--limit", 3, "--max-new-tokens", 4,
                    "--out", tmp_path, "--warmup", 0)
    assert result.exit_code == 130, result.output
    assert "the prompts finished so far are kept" in result.stderr
    command = resume_command(result.stderr)
    run_dir = Path(command[-1])
    assert json.loads((run_dir / "run.json").read_text())["status"] == "incomplete"

    monkeypatch.setattr(benchmark, "measure_group", real)
    result = invoke(*command[1:], "--json")
    assert result.exit_code == 0, result.output
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    assert len((run_dir / "rows.jsonl").read_text().splitlines()) == 2 * 3


def test_ctrl_c_while_loading_writes_nothing(tiny_model_dir, tmp_path, monkeypatch):
    import specbench.bench.pipeline as benchmark

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmark, "prepare", interrupted)
    result = invoke("run", "--model", tiny_model_dir, "--strategy", "ngram", "--limit", 1, "--out", tmp_path)
    assert result.exit_code == 130
    assert "interrupted before anything was measured" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_resuming_says_the_run_is_unchanged(tiny_model_dir, tmp_path, monkeypatch):
    import specbench.bench.pipeline as benchmark

    result = invoke("run", "--model", tiny_model_dir, "--strategy", "ngram", "--limit", 1, "--max-new-tokens", 2,
                    "--out", tmp_path, "--warmup", 0, "--json")
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "status": "incomplete"}))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmark, "prepare", interrupted)
    result = invoke("run", "--resume", run_dir)
    assert result.exit_code == 130
    assert f"anything new was measured; resume it with: specbench run --resume {run_dir}" in result.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_ctrl_c_in_train_keeps_the_checkpoint_and_the_same_command_resumes(tiny_model_dir, prompts, tmp_path,
                                                                            monkeypatch):
    import specbench.training.trainer as trainer

    interrupted_at_step_56, calls = interrupt_on_call(56, trainer.make_batch)
    monkeypatch.setattr(trainer, "make_batch", interrupted_at_step_56)
    out = tmp_path / "eagle"
    args = ["train", "--strategy", "eagle", "--model", tiny_model_dir, "--prompts", prompts, "--limit", 4,
            "--out", out, "--steps", 60, "--batch-size", 2, "--max-new-tokens", 4]
    result = invoke(*args)
    assert result.exit_code == 130, result.output
    assert "the target's answers to 4 prompts and the checkpoint of step 50 of 60" in result.stderr
    assert "resume by running the same command again: specbench train --strategy eagle" in result.stderr
    assert f"--out {out}" in result.stderr
    assert not out.exists() and (out.with_name("eagle.partial") / "checkpoint.pt").is_file()

    calls.clear()
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert len(calls) == 10  # steps 51 to 60 only, and no regeneration of the answers
    assert (out / "model.safetensors").is_file() and not out.with_name("eagle.partial").exists()


def test_train_with_other_settings_than_the_unfinished_one_needs_force(tiny_model_dir, prompts, tmp_path):
    out = tmp_path / "mtp"
    partial = out.with_name("mtp.partial")
    partial.mkdir()
    (partial / "settings.json").write_text(json.dumps({"strategy": "mtp", "steps": 999}))
    args = ["train", "--strategy", "mtp", "--model", tiny_model_dir, "--prompts", prompts, "--limit", 2,
            "--out", out, "--steps", 2, "--batch-size", 2, "--max-new-tokens", 4]
    result = invoke(*args)
    assert result.exit_code == 2 and "unfinished training with other settings" in result.stderr
    result = invoke(*args, "--force")
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file() and not partial.exists()


def start(args: list, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "specbench", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_sigterm_in_run_keeps_the_rows_and_says_how_to_resume(tiny_model_dir, prompts, tmp_path):
    process = start(["run", "--model", tiny_model_dir, "--suite", prompts, "--strategy", "ngram", "--warmup", 0,
                     "--max-new-tokens", 16, "--out", tmp_path], tmp_path)
    rows = lambda: [p for p in (tmp_path / "runs").glob("*/rows.jsonl") if p.stat().st_size]  # noqa: E731
    wait_for(rows, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    run_dir = Path(resume_command(stderr)[-1])
    assert run_dir == rows()[0].parent
    assert json.loads((run_dir / "run.json").read_text())["status"] == "incomplete"
    assert (run_dir / "summary.json").is_file()


def test_sigterm_in_train_says_what_was_kept(tiny_model_dir, prompts, tmp_path):
    out = tmp_path / "dflash"
    process = start(["train", "--strategy", "dflash", "--model", tiny_model_dir, "--prompts", prompts, "--limit", 2,
                     "--out", out, "--steps", 100000, "--batch-size", 2, "--max-new-tokens", 4], tmp_path)
    cache = out.with_name("dflash.partial") / "distill.pt"
    wait_for(cache.is_file, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert f"kept in {cache.parent}: the target's answers to 2 prompts" in stderr
    assert "resume by running the same command again: specbench train --strategy dflash" in stderr
