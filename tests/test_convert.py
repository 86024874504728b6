"""`specbench convert`: published checkpoints into specbench's format and back draft exactly as before;
what cannot be converted exactly is refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.errors import SpecbenchError
from specbench.decoding.target import Target, load_lm
from specbench.methods.build import build_strategy
from specbench.methods.names import parse_strategy
from specbench.methods.published.conversion import convert
from specbench.methods.published.formats import open_source
from tests.helpers import tiny_lm, write_tiny_model_dir
from tests.published_layouts import deepspec_checkpoint, dflash_checkpoint, eagle3_checkpoint, propose

# two implementations' drafts are compared exactly
pytestmark = pytest.mark.usefixtures("float32_drafting")

MASK = 7
PROMPTS = [[5, 6, 7, 8, 9], [1, 2], [40, 41, 3, 3, 90, 12, 6, 60, 2]]


def drafts(target, path, strategy: str, **knobs) -> list[list[int]]:
    drafter = build_strategy(parse_strategy(strategy), target, {strategy: knobs},
                             {strategy: open_source(path)}).drafter
    return [propose(drafter, target.model, prompt, 16).tokens for prompt in PROMPTS]


def deepspec_of_target(target, path, **kwargs):
    """A DeepSpec checkpoint whose embedding and LM head are the target's (DeepSpec copies and freezes them),
    but for the mask row."""
    deepspec_checkpoint(path, target.model, [0, 2, 4], MASK, **kwargs)
    state = load_file(str(path / "model.safetensors"))
    embedding = target.model.get_input_embeddings().weight.detach().clone()
    embedding[MASK] = state["embed_tokens.weight"][MASK]
    state.update({"embed_tokens.weight": embedding, "lm_head.weight": target.model.lm_head.weight.detach().clone()})
    save_file(state, str(path / "model.safetensors"))
    return path


def test_zlab_dflash_to_specbench(deep_target, tmp_path):
    zlab = dflash_checkpoint(tmp_path / "zlab", deep_target.model, [0, 2, 4], MASK, block_size=5)
    done = convert(open_source(zlab), deep_target, tmp_path / "ours")
    assert (open_source(done.out).format, done.out_format) == ("specbench", "specbench dflash")
    assert drafts(deep_target, done.out, "dflash", block_size=5) == drafts(deep_target, zlab, "dflash")


def test_deepspec_dspark_to_specbench_and_back(deep_target, tmp_path):
    deepspec = deepspec_of_target(deep_target, tmp_path / "deepspec")
    knobs = {"confidence_threshold": 0.3, "confidence_rule": "token"}
    ours = convert(open_source(deepspec), deep_target, tmp_path / "ours").out
    assert drafts(deep_target, ours, "dspark", block_size=5, **knobs) == \
        drafts(deep_target, deepspec, "dspark", **knobs)
    back = convert(open_source(ours), deep_target, tmp_path / "back", mask_token_id=MASK)
    assert open_source(back.out).format == "deepspec-dspark"
    assert drafts(deep_target, back.out, "dspark", **knobs) == drafts(deep_target, deepspec, "dspark", **knobs)
    original = load_file(str(deepspec / "model.safetensors"))
    round_trip = load_file(str(back.out / "model.safetensors"))
    assert original.keys() == round_trip.keys() and all(torch.equal(original[k], round_trip[k]) for k in original)


def test_what_cannot_be_converted_exactly_is_refused(deep_target, tmp_path):
    cases = [
        (eagle3_checkpoint(tmp_path / "eagle3", tiny_lm("llama-mha", layers=8), 64), tiny_lm("llama-mha", layers=8),
         "EAGLE-3's q/k/v read the 2H concatenation"),
        (dflash_checkpoint(tmp_path / "window", deep_target.model, [1, 3], MASK, sliding_window=3), deep_target.model,
         "sliding-window"),
        (deepspec_of_target(deep_target, tmp_path / "gated", markov_head_type="gated"), deep_target.model,
         "Markov head is gated"),
        (deepspec_checkpoint(tmp_path / "own-embedding", deep_target.model, [0, 2, 4], MASK), deep_target.model,
         "embedding differs from the target's"),
    ]
    for path, model, message in cases:
        with pytest.raises(SpecbenchError, match=message):
            convert(open_source(path), Target(model, None, "t", frozenset()), tmp_path / "out")
    ours = convert(open_source(dflash_checkpoint(tmp_path / "zlab", deep_target.model, [0, 2, 4], MASK)), deep_target,
                   tmp_path / "ours").out
    with pytest.raises(SpecbenchError, match="no row for specbench's learned mask vector"):
        convert(open_source(ours), deep_target, tmp_path / "zlab-again")


def test_convert_command(tiny_model_dir, tmp_path):
    model_dir = write_tiny_model_dir(tmp_path / "target", "", hidden=32, layers=6, tokenizer_from=tiny_model_dir)
    model = load_lm(str(model_dir), torch.device("cpu"), torch.float32)
    deepspec = deepspec_of_target(Target(model, None, "t", frozenset()), tmp_path / "deepspec")
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(deepspec), "--model", str(model_dir), "--out", str(tmp_path / "ours"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["out_format"] == "specbench dspark"
    # back to DeepSpec: this vocabulary has no row the tokenizer never produces, so the mask id must be given
    result = runner.invoke(app, ["convert", str(tmp_path / "ours"), "--model", str(model_dir), "--out",
                                 str(tmp_path / "back")])
    assert result.exit_code == 2 and "--mask-token-id" in result.output
    result = runner.invoke(app, ["convert", str(tmp_path / "ours"), "--model", str(model_dir), "--out",
                                 str(tmp_path / "back"), "--mask-token-id", str(MASK)])
    assert result.exit_code == 0 and "deepspec-dspark" in result.output
    result = runner.invoke(app, ["convert", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "no such drafter directory" in result.output


def test_the_embedded_dspark_drafter_in_deepspec_layout_drafts_the_same(tmp_path):
    """The shipped default target and dspark drafter (bfloat16 weights): converted to DeepSpec's layout
    and read back by the DeepSpec reader, it drafts exactly what specbench's own drafter does."""
    from specbench.decoding.target import ASSETS, load_target

    target = load_target(None, torch.device("cpu"), torch.float32)
    ours = ASSETS / "default" / "drafters" / "dspark"
    converted = convert(open_source(ours), target, tmp_path / "deepspec", mask_token_id=target.tokenizer.pad_token_id)
    knobs = {"confidence_threshold": 0.2, "confidence_rule": "cumulative"}
    own = build_strategy(parse_strategy("dspark"), target, {"dspark": knobs}, {}).drafter
    published = build_strategy(parse_strategy("dspark"), target, {"dspark": knobs},
                               {"dspark": open_source(converted.out)}).drafter
    drafted = 0
    for text in ("def parse(text):\n    ", "import os\n", "class Config:\n    def __init__(self"):
        prompt = target.tokenizer(text)["input_ids"]
        tokens = propose(own, target.model, prompt, 7).tokens
        assert propose(published, target.model, prompt, 7).tokens == tokens
        drafted += len(tokens)
    assert drafted > 3


@pytest.mark.parametrize("strategy,knobs", [
    ("eagle", {}),
    ("dflash", {"context_window": 0}),  # vLLM's DFlash sees the whole context
    ("dspark", {"confidence_threshold": 0.2, "confidence_rule": "token"}),
])
def test_the_embedded_drafters_in_vllm_layouts_draft_the_same(default_target, tmp_path, strategy, knobs,
                                                              float32_drafting):
    """Written for vLLM (eagle as a two-layer EAGLE-3, dflash as z-lab's with mask_embedding.pt, dspark as
    DeepSpec's) and read back by the published readers, each embedded drafter drafts exactly what specbench's
    own does; the written directory is cached and re-used."""
    from specbench.methods.published.to_vllm import vllm_drafter_dir

    target = default_target
    written = vllm_drafter_dir(strategy, None, target, tmp_path)
    stamp = (written / "model.safetensors").stat().st_mtime_ns
    assert vllm_drafter_dir(strategy, None, target, tmp_path) == written
    assert (written / "model.safetensors").stat().st_mtime_ns == stamp
    own = build_strategy(parse_strategy(strategy), target, {strategy: knobs}, {}).drafter
    published = build_strategy(parse_strategy(strategy), target, {strategy: knobs},
                               {strategy: open_source(written)}).drafter
    drafted = 0
    for text in ("def parse(text):\n    ", "import os\n", "class Config:\n    def __init__(self"):
        prompt = target.tokenizer(text)["input_ids"]
        tree = propose(own, target.model, prompt, 7)
        again = propose(published, target.model, prompt, 7)
        assert (again.tokens, again.parents) == (tree.tokens, tree.parents)
        drafted += len(tree.tokens)
    assert drafted > 3


@pytest.mark.parametrize("strategy", ["eagle", "dflash", "dspark"])
def test_a_draft_vocabulary_goes_to_vllm_as_eagle3s_map_or_is_refused(default_target, tmp_path, strategy,
                                                                      float32_drafting):
    """EAGLE-3's layout carries the map (d2t, t2d, a head of the draft vocabulary's rows): read back, it drafts
    what specbench's own drafter does. z-lab's and DeepSpec's layouts carry none: one line."""
    from specbench.decoding.target import fingerprint
    from specbench.methods.drafter_dir import save_drafter
    from specbench.methods.knobs import make_options
    from specbench.methods.published.to_vllm import vllm_drafter_dir
    from specbench.methods.registry import definition

    target = default_target
    torch.manual_seed(0)
    model = definition(strategy).trainable(target, make_options(strategy, {"draft_vocab": 512}))
    model.vocab.set_ids(torch.randperm(target.model.config.vocab_size)[:512])
    save_drafter(tmp_path / strategy, strategy, model.drafter_config(), model.state_dict(), fingerprint(target.model))
    if strategy != "eagle":
        with pytest.raises(SpecbenchError, match="carries no draft-vocabulary map") as refused:
            vllm_drafter_dir(strategy, tmp_path / strategy, target, tmp_path / "vllm")
        assert "\n" not in str(refused.value)
        return
    written = vllm_drafter_dir(strategy, tmp_path / strategy, target, tmp_path / "vllm")
    assert json.loads((written / "config.json").read_text())["draft_vocab_size"] == 512
    own = build_strategy(parse_strategy(strategy), target, {}, {strategy: open_source(tmp_path / strategy)}).drafter
    published = build_strategy(parse_strategy(strategy), target, {}, {strategy: open_source(written)}).drafter
    for text in ("def parse(text):\n    ", "import os\n"):
        prompt = target.tokenizer(text)["input_ids"]
        tree = propose(own, target.model, prompt, 7)
        assert tree.tokens and set(tree.tokens) <= set(model.vocab.ids.tolist())
        again = propose(published, target.model, prompt, 7)
        assert (again.tokens, again.parents) == (tree.tokens, tree.parents)


def test_convert_to_vllm_command(tmp_path):
    from specbench.decoding.target import ASSETS

    drafters = ASSETS / "default" / "drafters"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(drafters / "eagle"), "--to", "vllm", "--out", str(tmp_path / "eagle3"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert open_source(tmp_path / "eagle3").format == "eagle3"
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("")
    published = eagle3_checkpoint(tmp_path / "published", tiny_lm("llama-mha", layers=8), 64)
    cases = [
        (["--to", "sglang"], drafters / "eagle", "the one target layout is 'vllm'"),
        (["--to", "vllm"], drafters / "mtp", "no vLLM counterpart"),
        (["--to", "vllm"], published, "which vLLM loads as it is"),
        (["--to", "vllm"], tmp_path / "nowhere", "no such drafter directory"),
    ]
    for args, source, message in cases:
        out = tmp_path / "out"
        result = runner.invoke(app, ["convert", str(source), "--out", str(out), *args])
        assert result.exit_code == 2 and message in result.output, (args, source, result.output)
        assert len(result.output.strip().splitlines()) == 1 and not out.exists()
    result = runner.invoke(app, ["convert", str(drafters / "dflash"), "--to", "vllm", "--out", str(busy)])
    assert result.exit_code == 2 and "is not empty" in result.output and sorted(busy.iterdir()) == [busy / "keep"]
