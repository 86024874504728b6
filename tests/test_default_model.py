"""The embedded default model and its shipped, trained drafters: lossless, and a real model."""

from __future__ import annotations

import itertools
import json

from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding.decode import generate
from specbench.decoding.target import DEFAULT_DIR, encode_turns
from specbench.methods.names import COMBINATIONS
from specbench.methods.registry import DRAFTER_NAMES
from specbench.plan.suites import load_suite


def test_all_strategies_on_the_shipped_drafters_are_lossless(tmp_path):
    result = CliRunner().invoke(app, ["run", "--strategy", "all", "--limit", 2, "--max-new-tokens", 24,
                                      "--out", str(tmp_path), "--json", "--warmup", "0"])
    assert result.exit_code == 0, result.output
    results = {r["strategy"]: r for r in json.loads(result.stdout)["results"]}
    assert set(results) == {"ar", *DRAFTER_NAMES, *COMBINATIONS}  # every method, then the listed combinations
    assert all(r["mismatches"] == 0 for r in results.values())
    # trained drafters accept more than one token per target step on the default model's own outputs
    assert all(results[s]["tau"] > 1.2 for s in ("eagle", "mtp", "dflash", "dspark"))


def test_default_model_size_and_real_architecture():
    config = json.loads((DEFAULT_DIR / "target" / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["num_hidden_layers"] == 13
    build = json.loads((DEFAULT_DIR / "BUILD.json").read_text())
    assert build["target"]["parameters"] >= 20_000_000
    assert build["draft"]["parameters"] < build["target"]["parameters"] / 4


def test_default_models_greedy_answers_are_not_degenerate(default_target):
    """One prompt per category: the answer is text or code, not a token repeated (issue 2's bar)."""
    target = default_target
    suite = load_suite("specbench")
    for category in suite.categories():
        item = next(i for i in suite.items if i.category == category)
        tokens = generate(target.model, encode_turns(target.tokenizer, list(item.turns[:1]), []), 48,
                          eos_ids=target.eos_ids).tokens
        longest_run = max(len(list(run)) for _, run in itertools.groupby(tokens))
        assert len(set(tokens)) >= 5 and longest_run < 8, (category, target.tokenizer.decode(tokens))
