"""`specbench tune --concurrency`: ngram's vLLM knobs searched on real `vllm serve` servers (ar's once, then a
server per trial), the study resumed without starting any."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.errors import SpecbenchError
from specbench.plan.run_config import layered
from specbench.tuning.study_config import TuneConfig
from tests.helpers import SMALL_SERVER, vllm_servers_left

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_installed")]
runner = CliRunner()


def test_tune_at_a_load_measures_each_trial_on_its_own_server(tmp_path):
    command = ["tune", "--strategy", "ngram", "--concurrency", "2", "--slo", "ttft=60000,tpot=30000,e2e=120000",
               "--trials", "1", "--limit", "2", "--max-new-tokens", "16", "--engine-args", SMALL_SERVER,
               "--out", str(tmp_path), "--json"]
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["objective"] == "goodput_req_s" and record["load"] == {"concurrency": 2, "request_rate": None}
    assert record["trials"]["complete"] == 1 and not record["trials"]["failures"]  # lossless against ar's
    assert record["baseline"]["goodput_req_s"] > 0 and record["baseline"]["tpot_p50_ms"] > 0
    for trial in record["measured"]:
        assert trial["value"] == trial["goodput_req_s"] > 0 and trial["tpot_p50_ms"] > 0 and trial["tpot_speedup"] > 0
        spec = trial["speculative_config"]  # what the trial's server ran: its knobs, translated
        assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == trial["params"]["num_pred_tokens"]
        assert spec["prompt_lookup_max"] == trial["params"]["max_ngram"]
        assert (Path(record["logs"]) / f"trial-{trial['number']}.log").stat().st_size > 0
    assert record["measured"][0]["params"] == record["defaults"]["params"] == {"max_ngram": 3, "num_pred_tokens": 8}
    best = next(t for t in record["measured"] if t["number"] == record["best_trial"])
    assert record["best_value"] == max(t["value"] for t in record["measured"])
    toml = tomllib.loads(Path(record["toml"]).read_text())
    assert toml["engine"] == "vllm" and toml["knobs"]["ngram"] == record["best_params"] == best["params"]
    assert json.loads(Path(record["vllm_config"]).read_text()) == best["speculative_config"]
    assert Path(record["toml"]).parent == tmp_path / "tuned" / "serve"  # apart from what `recommend` reads

    resumed = runner.invoke(app, command)  # the study has its trials: nothing is measured again, ar included
    assert resumed.exit_code == 0, resumed.output
    again = json.loads(resumed.stdout)
    assert again["baseline"] == record["baseline"] and again["measured"] == record["measured"]
    assert not vllm_servers_left()


@pytest.mark.parametrize("flags, message", [
    (["--concurrency", "2", "--slo", "ttft=fast"], "--slo ttft=fast: expected"),
    (["--concurrency", "2", "--gpu", "h100-sxm"], "--gpu h100-sxm: a study at a load measures real servers here"),
    (["--request-rate", "1", "--slo", "tpot=50", "--objectives", "speedup,memory"], "--objectives speedup,memory"),
    (["--slo", "tpot=50"], "--slo is the objective of a study at a load"),
    (["--strategy", "ngram+suffix", "--concurrency", "2"], "combine drafters, which vLLM cannot run"),
])
def test_bad_input_at_a_load_is_one_line(flags, message, tmp_path):
    strategy = [] if "--strategy" in flags else ["--strategy", "ngram"]
    result = runner.invoke(app, ["tune", *strategy, *flags, "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert not (tmp_path / "tuning").exists() and not (tmp_path / "tuned").exists()


def test_a_load_makes_vllm_the_engine_and_takes_its_engine_args():
    """The load alone picks the engine: --engine-args need no --engine vllm beside --concurrency."""
    workload = layered({}, {"engine_args": {"enforce_eager": True}})
    measured = TuneConfig(workload, ("ngram",), concurrency=2).validate().measured_plan.config
    assert (measured.engine, measured.engine_args) == ("vllm", {"enforce_eager": True})
    with pytest.raises(SpecbenchError, match="need --engine vllm"):  # one request at a time: specbench's engine
        TuneConfig(workload, ("ngram",)).validate()


@pytest.mark.parametrize("limit, repeats", [(0, False), (4, True)])
def test_a_trials_level_repeats_prompts_only_where_the_tuning_prompts_fall_short(limit, repeats):
    """A trial's level sends each measured request a prompt of its own, as serve does, where the tuning prompts
    (the suite, or --limit of them, less the held-out share) are enough; with too few they repeat."""
    from specbench.methods.names import parse_strategy
    from specbench.tuning.serve_study import plan_served

    config = TuneConfig(layered({}, {"limit": limit}), ("ngram",), concurrency=2).validate()
    plan = plan_served(config, parse_strategy("ngram"))
    assert plan.serve.repeat_prompts is repeats
    assert repeats or len(plan.work.prompts) >= plan.serve.prompts_needed
