"""--drafter values: formats told from config and weight names, refusals before any model is loaded,
hub ids without a network, and `specbench run` end to end on published checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.errors import SpecbenchError
from specbench.decoding.target import load_lm
from specbench.methods.names import parse_strategies
from specbench.methods.published.formats import drafter_dirs_by_strategy, open_source
from tests.helpers import write_tiny_model_dir
from tests.published_layouts import deepspec_checkpoint, dflash_checkpoint, eagle3_checkpoint, mtp_target, write

runner = CliRunner()


@pytest.fixture(scope="module")
def cli_target(tiny_model_dir, tmp_path_factory):
    """A Qwen3 target directory with a tokenizer, deep enough for EAGLE-3's low/mid/high layers."""
    path = write_tiny_model_dir(tmp_path_factory.mktemp("published") / "target", "", hidden=32, layers=8,
                                tokenizer_from=tiny_model_dir)
    return path, load_lm(str(path), torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def checkpoints(cli_target, tmp_path_factory):
    root, model = tmp_path_factory.mktemp("checkpoints"), cli_target[1]
    mask = model.config.vocab_size - 1
    return {"eagle": eagle3_checkpoint(root / "eagle3", model, 64),
            "dflash": dflash_checkpoint(root / "dflash", model, [1, 3, 5], mask, block_size=4),
            "dspark": deepspec_checkpoint(root / "dspark", model, [1, 3, 5], mask, block_size=4)}


def test_each_format_is_detected(checkpoints, tiny_draft_dir, tmp_path, cli_target):
    found = {name: (open_source(path).format, open_source(path).strategy) for name, path in checkpoints.items()}
    assert found == {"eagle": ("eagle3", "eagle"), "dflash": ("dflash", "dflash"),
                     "dspark": ("deepspec-dspark", "dspark")}
    assert open_source(tiny_draft_dir).format == "draft-lm"
    assert open_source(deepspec_checkpoint(tmp_path / "ds", cli_target[1], [1], 5, markov_rank=0,
                                           confidence=False)).format == "deepspec-dflash"


@pytest.mark.parametrize("config,names,message", [
    ({"hidden_size": 8}, ["x.weight"], "none of the known formats"),
    ({"model_type": "llama"}, ["fc.weight", "layers.0.self_attn.q_proj.weight"], "EAGLE-1/EAGLE-2"),
    ({"architectures": ["Qwen3Eagle3Model"], "model_type": "qwen3"}, ["fc.weight"], "Qwen3Eagle3Model"),
    ({"architectures": ["Gemma4DSparkModel"], "markov_rank": 4}, ["fc.weight"], "Gemma4DSparkModel"),
])
def test_unknown_and_unsupported_layouts_are_one_line(tmp_path, config, names, message):
    path = write(tmp_path / "drafter", config, {n: torch.zeros(2) for n in names})
    with pytest.raises(SpecbenchError, match=message):
        open_source(path)


def test_missing_directories_and_hub_ids_not_in_the_cache(tmp_path, monkeypatch):
    with pytest.raises(SpecbenchError, match="no such drafter directory"):
        open_source(str(tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecbenchError, match="no such drafter directory"):
        open_source(empty)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SpecbenchError, match=r"drafter specbench-tests/no-such-drafter is not available offline.*"
                                             r"hf download.*or pass a drafter directory"):
        open_source("specbench-tests/no-such-drafter")


def test_a_hub_id_in_the_local_cache_is_used_offline(checkpoints, tmp_path, monkeypatch):
    """A hub id already in the Hugging Face cache is read from there (the cache's own layout)."""
    repo = tmp_path / "cache" / "models--specbench-tests--eagle3"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(checkpoints["eagle"], repo / "snapshots" / ("0" * 40))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    source = open_source("specbench-tests/eagle3")
    assert (source.format, source.checkpoint.hub_id) == ("eagle3", "specbench-tests/eagle3")
    assert source.describe()["hub_id"] == "specbench-tests/eagle3"


def test_a_drafter_no_strategy_of_the_run_uses_is_refused(checkpoints, tiny_draft_dir):
    with pytest.raises(SpecbenchError, match=r"EAGLE-3 .* for strategy eagle, which this run does not use .*dflash"):
        drafter_dirs_by_strategy([checkpoints["eagle"]], parse_strategies(["dflash"]))
    # a plain LM given to eagle: once the embedded drafter was silently used instead
    with pytest.raises(SpecbenchError, match="causal language model .* strategy draft, which this run does not use"):
        drafter_dirs_by_strategy([tiny_draft_dir], parse_strategies(["eagle"]))
    with pytest.raises(SpecbenchError, match="two --drafter values for dflash"):
        drafter_dirs_by_strategy([checkpoints["dflash"]] * 2, parse_strategies(["dflash"]))
    sources = drafter_dirs_by_strategy(list(checkpoints.values()), parse_strategies(["eagle+dflash", "dspark"]))
    assert set(sources) == {"eagle", "dflash", "dspark"}


def invoke(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


def test_run_with_published_drafters_end_to_end(cli_target, checkpoints, tmp_path):
    """One run: each published format alone and two of them combined; lossless, and the formats recorded."""
    result = invoke("run", "--model", cli_target[0], "--strategy", "eagle,dflash,dspark,eagle+dflash",
                    *[arg for path in checkpoints.values() for arg in ("--drafter", path)],
                    "--set", "eagle.depth=3", "--limit", 2, "--max-new-tokens", 10, "--warmup", 0,
                    "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {r["strategy"] for r in report["results"]} == {"ar", "eagle", "dflash", "dspark", "eagle+dflash"}
    assert all(r["mismatches"] == 0 for r in report["results"])
    drafters = json.loads((Path(report["run_dir"]) / "environment.json").read_text())["drafters"]
    assert drafters["eagle"]["eagle"]["format"] == "eagle3" and drafters["eagle"]["eagle"]["knobs"]["depth"] == 3
    assert drafters["dspark"]["dspark"]["knobs"]["confidence_rule"] == "token"
    assert set(drafters["eagle+dflash"]) == {"eagle", "dflash", "combine"}  # and how it combined
    assert drafters["eagle+dflash"]["combine"]["knobs"]["mode"] == "route"


def test_run_with_the_targets_own_mtp_modules(tiny_model_dir, tmp_path):
    target = tmp_path / "deepseek"
    mtp_target(target, "deepseek-v3", tokenizer_from=tiny_model_dir)
    result = invoke("run", "--model", target, "--strategy", "mtp", "--limit", 1, "--max-new-tokens", 8,
                    "--warmup", 0, "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {r["strategy"]: r["mismatches"] for r in report["results"]} == {"ar": 0, "mtp": 0}
    drafters = json.loads((Path(report["run_dir"]) / "environment.json").read_text())["drafters"]
    assert drafters["mtp"]["mtp"]["format"] == "mtp-deepseek-v3"


def test_wrong_kind_is_refused_before_the_model_is_loaded(checkpoints, tmp_path):
    result = invoke("run", "--model", tmp_path / "no-such-model", "--drafter", checkpoints["eagle"],
                    "--strategy", "dflash", "--out", tmp_path)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "which this run does not use" in lines[0]  # not the missing model's error
