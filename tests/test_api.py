"""The library's face: `specbench.run`, `tune`, `serve` and `recommend`, each a command's call, and
`import specbench` light enough for any program (no model library loads until a call needs it)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import specbench
from specbench.core.errors import SpecbenchError
from specbench.core.records import RunResult
from specbench.recommender import Recommendation

ROOT = Path(__file__).resolve().parents[1]
HEAVY = "print(sorted({name.split('.')[0] for name in sys.modules} & {'torch', 'transformers', 'vllm', 'optuna'}))"


def test_import_loads_no_model_library():
    loaded = subprocess.run([sys.executable, "-c", f"import sys, specbench; {HEAVY}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["run", "tune", "serve", "recommend"])
def test_each_command_is_a_call(name):
    assert name in specbench.__all__ and callable(getattr(specbench, name))


def test_run_on_the_embedded_model_returns_its_result(tmp_path):
    result = specbench.run(strategies="ngram", limit=1, max_new_tokens=4, warmup=0, device="cpu",
                           cost_model=False, out=tmp_path)
    assert isinstance(result, RunResult) and result.complete
    assert [s.strategy for s in result.summary] == ["ar", "ngram"] and result.summary[1].mismatches == 0
    assert result.path.parent == tmp_path / "runs"


def test_run_takes_a_config_file_under_its_settings_and_resumes_a_run(tmp_path):
    (tmp_path / "run.toml").write_text('strategies = ["ngram"]\nmax_new_tokens = 4\nlimit = 2\n')
    result = specbench.run(config=tmp_path / "run.toml", limit=1, warmup=0, device="cpu", cost_model=False,
                           out=tmp_path)
    assert result.meta.strategies == ["ar", "ngram"] and result.config["max_new_tokens"] == 4
    assert result.config["limit"] == 1  # a setting given over the file's
    with pytest.raises(SpecbenchError, match="nothing to resume"):
        specbench.run(resume=result.path)
    meta = json.loads((result.path / "run.json").read_text())
    (result.path / "run.json").write_text(json.dumps({**meta, "status": "incomplete"}))  # as if interrupted
    with pytest.raises(SpecbenchError, match="limit"):  # what a resumed run measures is its saved configuration
        specbench.run(resume=result.path, limit=2)
    resumed = specbench.run(resume=result.path, limit=1)
    assert resumed.complete and resumed.path == result.path and len(resumed.rows) == len(result.rows)


def test_a_setting_is_checked_as_a_config_file_is():
    with pytest.raises(SpecbenchError, match="specbench.run: unknown key 'strategys'"):
        specbench.run(strategys="ngram")
    with pytest.raises(SpecbenchError, match="specbench.run: max_new_tokens must be an integer"):
        specbench.run(max_new_tokens="many")


def test_recommend_without_results_takes_the_prior(tmp_path):
    choice = specbench.recommend(results=tmp_path, gpu="rtx4090", task="code")
    assert isinstance(choice, Recommendation) and choice.source == "prior"
