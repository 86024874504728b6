"""`specbench train`: a drafter trained by self-distillation from a local tiny target, then used."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.training.trainer import partial_dir

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"def f{i}(x): return"}) + "\n" for i in range(6)))
    return path


def test_train_then_run_with_the_drafter(tiny_model_dir, prompts, tmp_path):
    out = tmp_path / "eagle"
    result = invoke("train", "--strategy", "eagle", "--model", tiny_model_dir, "--prompts", prompts, "--out", out,
                    "--steps", 6, "--batch-size", 2, "--max-new-tokens", 8, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not partial_dir(out).exists()
    result = invoke("run", "--model", tiny_model_dir, "--drafter", out, "--strategy", "eagle", "--limit", 2,
                    "--max-new-tokens", 6, "--out", tmp_path, "--json", "--warmup", 0)
    assert result.exit_code == 0, result.output
    assert all(r["mismatches"] == 0 for r in json.loads(result.stdout)["results"])


def test_drafter_for_another_target_is_refused(tiny_model_dir, tiny_draft_dir, prompts, tmp_path):
    out = tmp_path / "mtp"
    assert invoke("train", "--strategy", "mtp", "--model", tiny_model_dir, "--prompts", prompts, "--out", out,
                  "--steps", 2, "--batch-size", 2, "--max-new-tokens", 4).exit_code == 0
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "target_fingerprint": "0" * 16}))
    result = invoke("run", "--model", tiny_model_dir, "--drafter", out, "--strategy", "mtp", "--limit", 1)
    assert result.exit_code == 2 and "another target" in result.output
    result = invoke("run", "--model", tiny_model_dir, "--drafter", out, "--strategy", "eagle", "--limit", 1)
    assert result.exit_code == 2


@pytest.mark.parametrize("args, message", [
    (["--strategy", "ngram"], "cannot be trained"),
    (["--steps", "0"], "at least 1"),
    (["--set", "eagle.nope=1"], "valid: eagle.depth"),
])
def test_train_bad_input(tiny_model_dir, prompts, tmp_path, args, message):
    base = {"--strategy": "eagle", "--steps": "2"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    flat = [x for kv in base.items() for x in kv if kv[0] != "--set"]
    flat += ["--set", base["--set"]] if "--set" in base else []
    result = invoke("train", "--model", tiny_model_dir, "--prompts", prompts, "--out", tmp_path / "d", *flat)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "d").exists()


def test_train_with_no_prompts(tiny_model_dir, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = invoke("train", "--strategy", "eagle", "--model", tiny_model_dir, "--prompts", empty,
                    "--out", tmp_path / "d")
    assert result.exit_code == 2 and not (tmp_path / "d").exists()


@pytest.mark.parametrize("strategy", ["mtp", "dflash", "dspark"])
def test_every_trainable_strategy_end_to_end(strategy, tiny_model_dir, prompts, tmp_path):
    out = tmp_path / strategy
    result = invoke("train", "--strategy", strategy, "--model", tiny_model_dir, "--prompts", prompts, "--out", out,
                    "--steps", 3, "--batch-size", 2, "--max-new-tokens", 8)
    assert result.exit_code == 0, result.output
    result = invoke("run", "--model", tiny_model_dir, "--drafter", out, "--strategy", f"{strategy},ngram+{strategy}",
                    "--limit", 2, "--max-new-tokens", 8, "--out", tmp_path, "--json", "--warmup", 0)
    assert result.exit_code == 0, result.output
    assert [r["mismatches"] for r in json.loads(result.stdout)["results"]] == [0, 0, 0]


def test_train_on_instructions_the_target_writes(tiny_model_dir, prompts, tmp_path):
    """--synthesise: the corpus recipe of `specbench prepare` (written forms fill in where a model writes no
    instruction of its own), a draft vocabulary, held-out decodes; exactly one source of prompts."""
    out = tmp_path / "dflash"
    result = invoke("train", "--strategy", "dflash", "--model", tiny_model_dir, "--synthesise", 4, "--out", out,
                    "--steps", 3, "--batch-size", 2, "--max-new-tokens", 8, "--set", "dflash.draft_vocab=64")
    assert result.exit_code == 0, result.output
    assert "dflash drafter" in result.output and json.loads((out / "config.json").read_text())
    result = invoke("run", "--model", tiny_model_dir, "--drafter", out, "--strategy", "dflash", "--limit", 2,
                    "--max-new-tokens", 8, "--out", tmp_path, "--json", "--warmup", 0)
    assert result.exit_code == 0 and [r["mismatches"] for r in json.loads(result.stdout)["results"]] == [0, 0]
    for extra in ([], ["--prompts", prompts, "--synthesise", 4]):
        result = invoke("train", "--strategy", "dflash", "--model", tiny_model_dir, "--out", tmp_path / "x", *extra)
        assert result.exit_code == 2 and "one of the three" in result.output, result.output


def test_train_on_users_conversations(tiny_model_dir, tmp_path):
    """--dataset: a file in ShareGPT's layout, each request with the conversation before it; a held-out share
    decoded as it trains; a file of another layout or a missing one is one line and exit 2."""
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"id": i, "conversations": [
        {"from": "human", "value": f"def f{i}(x): return"}, {"from": "gpt", "value": "x"},
        {"from": "human", "value": f"and def g{i}(y): return"}]}) + "\n" for i in range(70)))
    out = tmp_path / "mtp"
    result = invoke("train", "--strategy", "mtp", "--model", tiny_model_dir, "--dataset", chats, "--out", out,
                    "--steps", 3, "--batch-size", 2, "--max-new-tokens", 8, "--limit", 70)
    assert result.exit_code == 0, result.output
    assert "held-out tau" in result.output and (out / "config.json").is_file()
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "hello"}) + "\n")
    for dataset, says in ((other, "not in ShareGPT's layout"), (tmp_path / "absent.json", "no such file")):
        result = invoke("train", "--strategy", "mtp", "--model", tiny_model_dir, "--dataset", dataset,
                        "--out", tmp_path / "y")
        assert result.exit_code == 2 and says in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
