"""`--engine transformers`: transformers' own `generate` (plain, assisted with the draft model, prompt lookup)
as a third engine, on the tiny local model and its draft model; with vLLM too, every pair of engines compared."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import load_target
from specbench.engines.specbench import SpecbenchBackend
from specbench.engines.transformers import TransformersBackend
from specbench.plan.run_config import RunConfig

runner = CliRunner()
ENGINES = ("specbench", "transformers")
EAGER_SMALL_CACHE = {"kv_cache_memory_bytes": 64 << 20, "enforce_eager": True}  # vLLM started sooner, for the test


def run(*args: str) -> dict:
    result = runner.invoke(app, ["run", *map(str, args), "--warmup", "0", "--no-cost-model", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def summary_of(report: dict, strategy: str, engine: str) -> dict:
    return next(r for r in report["results"] if r["strategy"] == strategy and r["engine"] == engine)


@pytest.fixture(scope="module")
def both(tiny_model_dir, tiny_draft_dir, tmp_path_factory):
    return run("--model", tiny_model_dir, "--drafter", tiny_draft_dir, "--strategy", "ngram,draft", "--engine",
               "specbench,transformers", "--limit", 3, "--max-new-tokens", 16, "--out", tmp_path_factory.mktemp("tf"))


def test_every_strategy_runs_in_transformers_losslessly(both):
    for strategy in ("ar", "ngram", "draft"):
        for engine in ENGINES:
            summary = summary_of(both, strategy, engine)
            assert summary["prompts"] == 3
            if strategy != "ar":
                assert summary["mismatches"] == 0, (strategy, engine)  # against the same engine's ar
    assert summary_of(both, "ar", "transformers")["tau"] == 1.0
    (report,) = both["engines"]
    assert report["engine"] == "transformers" and set(report["start_s"]) == {"draft"}  # what loads a model


def test_transfer_and_agreement_against_specbench(both):
    for strategy in ("ngram", "draft"):
        theirs, own = summary_of(both, strategy, "transformers"), summary_of(both, strategy, "specbench")
        assert theirs["transfer"] == pytest.approx(theirs["speedup"] / own["speedup"])
    agreement = summary_of(both, "ar", "transformers")["engine_agreement"]
    assert agreement["prompts"] == 3 and len(agreement["first_divergence"]) == 3 - agreement["agreeing"]
    (pair,) = both["engine_pairs"]
    assert (pair["reference"], pair["engine"], pair["prompts"], pair["agreeing"]) == \
        ("specbench", "transformers", 3, agreement["agreeing"])
    assert pair["transfer"] == {s: summary_of(both, s, "transformers")["transfer"] for s in ("ngram", "draft")}


def test_counts_match_specbench_on_the_same_drafts(tiny_model_dir, tiny_draft_dir):
    """Prompt lookup and the draft model propose the same drafts in both engines, so with outputs equal the
    target forwards (steps) are equal too: the hook's counting is the engine's own count."""
    plan = RunConfig(model=str(tiny_model_dir), drafters=[str(tiny_draft_dir)], strategies=["ngram", "draft"],
                     device="cpu").plan()
    target = load_target(plan.model, torch.device("cpu"), torch.float32)
    theirs = TransformersBackend(plan.engine).start(target)
    ours = SpecbenchBackend(plan.engine).start(target)
    prompt = [int(t) for t in target.tokenizer.encode("def f1(x): return x + 1 # the quick brown fox 1 def f2(x):")]
    for mine, other in zip(ours, theirs):
        gen, reference = other.runner(prompt, 20, Sampling(), 0), mine.runner(prompt, 20, Sampling(), 0)
        assert gen.tokens == reference.tokens, mine.name
        assert gen.steps == reference.steps and gen.accepted == len(gen.tokens) - gen.steps, mine.name
        assert sum(gen.accept_by_position) == gen.accepted <= gen.drafted and gen.wall_s > 0 < gen.ttft_s
    sampled = theirs[1].runner(prompt, 20, Sampling(0.8, 0.95, 0), 7)
    assert sampled.tokens == theirs[1].runner(prompt, 20, Sampling(0.8, 0.95, 0), 7).tokens  # the prompt's seed


def test_sampling_runs_through_generate(tiny_model_dir, tmp_path):
    report = run("--model", tiny_model_dir, "--strategy", "ngram", "--engine", "transformers", "--limit", 2,
                 "--max-new-tokens", 8, "--temperature", 0.8, "--out", tmp_path)
    ngram = summary_of(report, "ngram", "transformers")
    assert ngram["prompts"] == 2 and ngram["mismatches"] is None  # sampling: no greedy check
    assert "engine_pairs" not in report or all(p["prompts"] == 0 for p in report["engine_pairs"])


BAD = [
    (["--engine", "transformers", "--strategy", "eagle"],
     "--engine transformers runs ar (generate), draft (assisted generation, assistant_model=) and ngram (prompt "
     "lookup, prompt_lookup_num_tokens=); not eagle"),
    (["--engine", "transformers", "--strategy", "ngram+draft"], "; not ngram+draft"),
    (["--engine", "transformers", "--strategy", "draft", "--controller", "entropy"],
     "--controller entropy has no counterpart in transformers' assistants"),
    (["--engine", "transformers", "--strategy", "ngram", "--controller", "heuristic"], "prompt lookup drafts a fixed"),
    (["--engine", "transformers", "--strategy", "ngram", "--batch-size", "2"], "measures batch size 1 only"),
    (["--engine", "transformers", "--strategy", "ngram", "--engine-args", '{"a": 1}'], "they need --engine vllm"),
    (["--engine", "specbench,nosuch"], "--engine nosuch: expected specbench, vllm, both, transformers"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[m for _, m in BAD])
def test_what_generate_cannot_run_is_refused_in_one_line(args, message, tmp_path):
    result = runner.invoke(app, ["run", *args, "--out", str(tmp_path / "results")])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.vllm
@pytest.mark.usefixtures("vllm_installed")
def test_three_engines_give_agreement_and_transfer_for_each_pair(tmp_path, monkeypatch):
    """specbench, vLLM and transformers on the same prompts: each pair's agreement on `ar` and transfer."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the converted drafters: the test's own
    monkeypatch.setenv("VLLM_CACHE_ROOT", os.environ.get("VLLM_CACHE_ROOT")
                       or os.path.join(os.path.expanduser("~"), ".cache", "vllm"))
    report = run("--strategy", "ngram,draft", "--engine", "specbench,vllm,transformers", "--limit", 2,
                 "--max-new-tokens", 16, "--engine-args", json.dumps(EAGER_SMALL_CACHE),
                 "--out", tmp_path / "results")
    engines = ("specbench", "vllm", "transformers")
    pairs = {(p["reference"], p["engine"]): p for p in report["engine_pairs"]}
    assert set(pairs) == {("specbench", "vllm"), ("specbench", "transformers"), ("vllm", "transformers")}
    for (reference, engine), pair in pairs.items():
        assert pair["prompts"] == 2 and len(pair["first_divergence"]) == 2 - pair["agreeing"]
        for strategy in ("ngram", "draft"):
            assert pair["transfer"][strategy] == pytest.approx(
                summary_of(report, strategy, engine)["speedup"] / summary_of(report, strategy, reference)["speedup"])
    for engine in engines:
        for strategy in ("ngram", "draft"):
            assert summary_of(report, strategy, engine)["mismatches"] == 0, (strategy, engine)


def test_tune_in_transformers_writes_the_generate_arguments_it_measured(tiny_model_dir, tmp_path):
    result = runner.invoke(app, ["tune", "--engine", "transformers", "--model", str(tiny_model_dir), "--strategy",
                                 "ngram", "--trials", "2", "--limit", "3", "--max-new-tokens", "8",
                                 "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["trials"]["counted"] == 2 and record["best_value"] > 0
    assert "controller" not in record["best_params"]  # prompt lookup drafts a fixed length
    arguments = json.loads(open(record["transformers_config"]).read())
    assert arguments == {"prompt_lookup_num_tokens": record["knobs"]["ngram"].get("num_pred_tokens", 8),
                         "max_matching_ngram_size": record["knobs"]["ngram"].get("max_ngram", 3)}
