"""DFlash checkpoints in z-lab's layout and DeepSpec's DFlash and DSpark ones on a Qwen3 target: the
same drafts as a direct evaluation of the weights, greedy output identical to ar, the checkpoint's
own knob values under --set, DeepSpec's confidence rule, and one-line refusals."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import Target
from specbench.methods.build import build_strategy
from specbench.methods.names import parse_strategy
from specbench.methods.published.formats import open_source
from tests.helpers import chi_square_pvalue, small_vocab_target, tiny_lm
from tests.published_layouts import BlockReference, deepspec_checkpoint, dflash_checkpoint, propose

MASK = 7  # an id of the target's vocabulary standing for MASK


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("block")


def build(target, path, strategy: str, **knobs):
    return build_strategy(parse_strategy(strategy), target, {strategy: knobs}, {strategy: open_source(path)})


def prompts(seed: int, count: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(97) for _ in range(rng.randint(2, 14))] for _ in range(count)]


def copy_with(source, out, config_change=None, state_change=None):
    out.mkdir()
    config = json.loads((source / "config.json").read_text())
    (config_change or (lambda c: None))(config)
    (out / "config.json").write_text(json.dumps(config))
    state = load_file(str(source / "model.safetensors"))
    (state_change or (lambda s: None))(state)
    save_file(state, str(out / "model.safetensors"))
    return out


def check_greedy_identity(target, strategy, seed: int) -> None:
    rng = random.Random(seed)
    for prompt in prompts(seed, 5):
        n, eos = rng.randint(1, 24), frozenset({rng.randrange(97)})
        expected = generate(target.model, prompt, n, eos_ids=eos)
        got = generate(target.model, prompt, n, eos_ids=eos, drafter=strategy.drafter,
                       controller=strategy.new_controller())
        assert (got.tokens, got.stop_reason) == (expected.tokens, expected.stop_reason)


@pytest.mark.parametrize("layout", ["block_size at the top level", "dflash_config.block_size, a window layer"])
def test_zlab_dflash(deep_target, root, layout):
    newer = layout.startswith("dflash_config")
    path = dflash_checkpoint(root / f"zlab-{newer}", deep_target.model, [1, 3] if newer else [0, 2, 4], MASK,
                             block_size=5 if newer else 4, sliding_window=3 if newer else None,
                             block_in_dflash_config=newer)
    assert open_source(path).format == "dflash"
    strategy = build(deep_target, path, "dflash")
    options = strategy.drafter.options
    assert (options.block_size, options.context_window) == (5 if newer else 4, 0)  # the checkpoint's own values
    assert strategy.drafter.hidden_layers == ((2, 4) if newer else (1, 3, 5))  # hidden_states[id + 1]
    reference = BlockReference(deep_target.model, path)
    for prompt in prompts(1):
        assert propose(strategy.drafter, deep_target.model, prompt, 16).tokens == reference.dflash_drafts(prompt,
                                                                                                    options.block_size)
    check_greedy_identity(deep_target, strategy, 2)


def test_set_overrides_the_checkpoint_block_size(deep_target, root):
    path = dflash_checkpoint(root / "zlab-set", deep_target.model, [0, 2, 4], MASK, block_size=6)
    strategy = build(deep_target, path, "dflash", block_size=3)
    assert strategy.drafter.options.block_size == 3
    prompt = prompts(3, 1)[0]
    assert propose(strategy.drafter, deep_target.model, prompt, 16).tokens == \
        BlockReference(deep_target.model, path).dflash_drafts(prompt, 3)


def test_deepspec_dflash_drafts_with_the_anchor_slot(deep_target, root):
    """markov_rank 0: DeepSpec's DFlash; every slot drafts (B drafts per block), its own embedding and head."""
    path = deepspec_checkpoint(root / "deepspec-dflash", deep_target.model, [-1, 2, 4], MASK, block_size=5,
                               markov_rank=0, confidence=False)
    assert open_source(path).format == "deepspec-dflash"
    strategy = build(deep_target, path, "dflash")
    assert strategy.drafter.max_depth == 5 and strategy.new_controller().budget() == 5
    assert strategy.drafter.hidden_layers == (0, 3, 5)
    reference = BlockReference(deep_target.model, path)
    for prompt in prompts(4):
        assert propose(strategy.drafter, deep_target.model, prompt, 16).tokens == reference.dflash_drafts(prompt, 5)
    check_greedy_identity(deep_target, strategy, 5)


@pytest.mark.parametrize("head,with_markov", [("vanilla", True), ("gated", True), ("rnn", True), ("vanilla", False)])
def test_deepspec_dspark(deep_target, root, head, with_markov):
    path = deepspec_checkpoint(root / f"dspark-{head}-{with_markov}", deep_target.model, [0, 2, 4], MASK,
                               markov_head_type=head, confidence_with_markov=with_markov)
    assert open_source(path).format == "deepspec-dspark"
    strategy = build(deep_target, path, "dspark", confidence_threshold=0.0)  # no cut: every slot's Markov step counts
    described = strategy.drafter_sources["dspark"]
    assert described["format"] == "deepspec-dspark" and described["knobs"]["confidence_rule"] == "token"
    reference = BlockReference(deep_target.model, path)
    for prompt in prompts(6):
        assert propose(strategy.drafter, deep_target.model, prompt, 16).tokens == \
            reference.dspark_drafts(prompt, 5, 0.0)
    check_greedy_identity(deep_target, strategy, 7)


def test_confidence_rules_cut_where_the_reference_does(deep_target, root):
    """DeepSpec's rule (the default for its checkpoints) cuts at the first low confidence, the cumulative rule
    where the product falls: both as the reference says, and they differ on these prompts."""
    sure = deepspec_checkpoint(root / "dspark-sure", deep_target.model, [0, 2, 4], MASK, seed=3)
    path = copy_with(sure, root / "dspark-cut", state_change=lambda s: s.update({  # confidences around 0.75
        "confidence_head.proj.weight": s["confidence_head.proj.weight"] * 0.1,
        "confidence_head.proj.bias": torch.ones(1)}))
    reference = BlockReference(deep_target.model, path)
    lengths = {}
    for rule in ("token", "cumulative"):
        drafter = build(deep_target, path, "dspark", confidence_threshold=0.3, confidence_rule=rule).drafter
        for prompt in prompts(8, 6):
            drafts = propose(drafter, deep_target.model, prompt, 16).tokens
            assert drafts == reference.dspark_drafts(prompt, 5, 0.3, rule)
            lengths.setdefault(rule, []).append(len(drafts))
    assert lengths["token"] != lengths["cumulative"], lengths


def test_a_missing_or_misshapen_weight_is_one_line(deep_target, root, tmp_path):
    zlab = dflash_checkpoint(root / "zlab-bad", deep_target.model, [0, 2, 4], MASK)
    missing = copy_with(zlab, tmp_path / "a", state_change=lambda s: s.pop("layers.1.self_attn.k_norm.weight"))
    with pytest.raises(SpecbenchError, match="weight layers.1.self_attn.k_norm.weight is missing"):
        build(deep_target, missing, "dflash")
    wrong = copy_with(zlab, tmp_path / "b", state_change=lambda s: s.update({"hidden_norm.weight": torch.ones(5)}))
    with pytest.raises(SpecbenchError, match=r"hidden_norm.weight has shape \(5,\)"):
        build(deep_target, wrong, "dflash")
    dspark = deepspec_checkpoint(root / "dspark-bad", deep_target.model, [0, 2, 4], MASK)
    missing = copy_with(dspark, tmp_path / "c", state_change=lambda s: s.pop("markov_head.markov_w2.weight"))
    with pytest.raises(SpecbenchError, match="weight markov_head.markov_w2.weight is missing"):
        build(deep_target, missing, "dspark")
    wrong = copy_with(dspark, tmp_path / "d", state_change=lambda s: s.update(
        {"confidence_head.proj.weight": torch.zeros(1, 64)}))  # sized for H, the config says H + r
    with pytest.raises(SpecbenchError, match=r"confidence_head.proj.weight has shape \(1, 64\)"):
        build(deep_target, wrong, "dspark")


def test_a_drafter_for_another_target_is_refused(deep_target, root, tmp_path):
    zlab = dflash_checkpoint(root / "zlab-other", deep_target.model, [0, 2, 4], MASK)
    with pytest.raises(SpecbenchError, match="num_target_layers"):
        build(Target(tiny_lm("qwen3-gqa", layers=4), None, "four", frozenset()), zlab, "dflash")
    with pytest.raises(SpecbenchError, match="hidden size is 64, the target's is 32"):
        build(Target(tiny_lm("qwen3-gqa", layers=6, hidden=32), None, "narrow", frozenset()), zlab, "dflash")
    far = copy_with(zlab, tmp_path / "far", config_change=lambda c: c["dflash_config"].update(target_layer_ids=[0, 5]))
    with pytest.raises(SpecbenchError, match=r"target_layer_ids \[0, 5\]"):  # 5 is the last layer: its state is normed
        build(deep_target, far, "dflash")
    mask = copy_with(zlab, tmp_path / "mask", config_change=lambda c: c["dflash_config"].update(mask_token_id=97))
    with pytest.raises(SpecbenchError, match="mask_token_id 97"):
        build(deep_target, mask, "dflash")
    dspark = deepspec_checkpoint(root / "dspark-other", deep_target.model, [0, 2, 4], MASK)
    llama = Target(tiny_lm("llama-mha", layers=6), None, "llama", frozenset())
    with pytest.raises(SpecbenchError, match="target family"):
        build(llama, dspark, "dspark")


@pytest.mark.slow
def test_sampling_with_a_deepspec_dspark_is_exact(tmp_path):
    """The RNN Markov head's sequentially sampled drafts keep the target's exact two-token distribution."""
    target = small_vocab_target(vocab=12)  # every continuation is counted often enough
    path = deepspec_checkpoint(tmp_path / "dspark", target.model, [-1], 3, block_size=3, markov_rank=4,
                               markov_head_type="rnn")
    strategy = build(target, path, "dspark", confidence_threshold=0.05)
    sampling = Sampling(temperature=0.9)
    accepted = [generate(target.model, [3, 1, 4], 2, sampling, drafter=strategy.drafter,
                         controller=strategy.new_controller(), seed=seed).accepted for seed in range(40)]
    assert 0 < sum(a > 0 for a in accepted) < len(accepted)  # acceptance and rejection both tested
    pvalue = chi_square_pvalue(target.model, [3, 1, 4], sampling, 1500,
                               lambda: (strategy.drafter, strategy.new_controller()))
    assert pvalue > 0.001
