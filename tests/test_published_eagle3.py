"""EAGLE-3 checkpoints in SafeAILab's layout on a Llama target: the same proposals as a direct
evaluation of the weights, greedy output identical to ar, knobs, and one-line refusals."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.target import Target
from specbench.methods.build import build_strategy
from specbench.methods.controllers import EntropyController
from specbench.methods.names import parse_strategy
from specbench.methods.published.formats import open_source
from tests.published_layouts import Eagle3Reference, eagle3_checkpoint, propose

VOCAB, DRAFT_VOCAB = 211, 64


def llama(layers: int = 8, hidden: int = 32, seed: int = 0, vocab: int = VOCAB) -> Target:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.3, tie_word_embeddings=False, attn_implementation="sdpa")
    return Target(LlamaForCausalLM(config).eval(), None, f"tiny-llama-{layers}-{hidden}", frozenset())


@pytest.fixture(scope="module")
def llama_target() -> Target:
    return llama()


@pytest.fixture(scope="module")
def checkpoint(llama_target, tmp_path_factory):
    return eagle3_checkpoint(tmp_path_factory.mktemp("eagle3") / "EAGLE3-tiny", llama_target.model, DRAFT_VOCAB)


def build(target, path, **knobs):
    return build_strategy(parse_strategy("eagle"), target, {"eagle": knobs}, {"eagle": open_source(path)})


def test_detected_and_described(llama_target, checkpoint):
    source = open_source(checkpoint)
    assert (source.format, source.strategy) == ("eagle3", "eagle")
    strategy = build(llama_target, checkpoint, depth=3)
    described = strategy.drafter_sources["eagle"]
    assert described["format"] == "eagle3" and described["knobs"]["depth"] == 3
    assert strategy.drafter.options.depth == 3  # --set eagle.depth reaches the published drafter
    assert strategy.drafter.hidden_layers == (2, 4, 5)  # the inputs of layers 2, L//2, L-3 of an 8-layer target


def test_proposals_equal_a_direct_evaluation(llama_target, checkpoint, float32_drafting):
    """The tree's first level and the best node's children are the reference's top-k (as target ids)."""
    drafter = build(llama_target, checkpoint, depth=2, top_k=4, total_tokens=64).drafter
    reference = Eagle3Reference(llama_target.model, checkpoint)
    rng = random.Random(0)
    for _ in range(3):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 12))]
        tree = propose(drafter, llama_target.model, prompt, 2)
        first = [t for t, p in zip(tree.tokens, tree.parents) if p == -1]
        second = [t for t, p in zip(tree.tokens, tree.parents) if p == tree.parents.index(-1)]
        assert (first, second) == reference.first_two_levels(prompt, 4)


def test_drafts_stay_in_the_draft_vocabulary(llama_target, checkpoint):
    state = load_file(str(checkpoint / "model.safetensors"))
    allowed = set((torch.arange(DRAFT_VOCAB) + state["d2t"]).tolist())
    drafter = build(llama_target, checkpoint, depth=3, top_k=8, total_tokens=60).drafter
    tree = propose(drafter, llama_target.model, [3, 1, 4, 1, 5, 9, 2, 6], 3)
    assert len(tree) == 60 and set(tree.tokens) <= allowed


def test_greedy_output_identical_to_ar(llama_target, checkpoint):
    strategy = build(llama_target, checkpoint, depth=4, top_k=4, total_tokens=16)
    rng = random.Random(1)
    for i in range(6):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 14))]
        n, eos = rng.randint(1, 24), frozenset({rng.randrange(VOCAB)})
        expected = generate(llama_target.model, prompt, n, eos_ids=eos)
        controller = strategy.new_controller() if i % 2 else EntropyController(4, threshold=3.0)
        got = generate(llama_target.model, prompt, n, eos_ids=eos, drafter=strategy.drafter, controller=controller)
        assert (got.tokens, got.stop_reason) == (expected.tokens, expected.stop_reason)


def test_pytorch_bin_and_a_full_draft_vocabulary(llama_target, tmp_path):
    """pytorch_model.bin is read as well; with draft_vocab_size == vocab_size d2t/t2d are the identity."""
    path = eagle3_checkpoint(tmp_path / "bin", llama_target.model, VOCAB, bin_format=True)
    drafter = build(llama_target, path, depth=2, top_k=4, total_tokens=64).drafter
    prompt = [7, 8, 9, 10, 11]
    tree = propose(drafter, llama_target.model, prompt, 2)
    first = [t for t, p in zip(tree.tokens, tree.parents) if p == -1]
    assert first == Eagle3Reference(llama_target.model, path).first_two_levels(prompt, 4)[0]


def test_a_drafter_of_another_width_brings_its_own_embedding(llama_target, tmp_path):
    """target_hidden_size: fc maps the target's 3 x 32 features to the drafter's 48, and the drafter embeds
    tokens with its own table."""
    path = eagle3_checkpoint(tmp_path / "wide", llama_target.model, DRAFT_VOCAB, hidden=48)
    drafter = build(llama_target, path, depth=2, top_k=4, total_tokens=64).drafter
    for prompt in ([9, 8, 7, 6, 5, 4], [100, 3]):
        tree = propose(drafter, llama_target.model, prompt, 2)
        first = [t for t, p in zip(tree.tokens, tree.parents) if p == -1]
        second = [t for t, p in zip(tree.tokens, tree.parents) if p == tree.parents.index(-1)]
        assert (first, second) == Eagle3Reference(llama_target.model, path).first_two_levels(prompt, 4)
    no_embedding = broken(path, tmp_path / "no-embedding", lambda s: s.pop("embed_tokens.weight"))
    with pytest.raises(SpecbenchError, match="embed_tokens.weight"):
        build(llama_target, no_embedding)


def broken(source, out, change):
    """A copy of the checkpoint at `out` with `change` applied to its weights."""
    out.mkdir()
    (out / "config.json").write_text((source / "config.json").read_text())
    state = load_file(str(source / "model.safetensors"))
    change(state)
    save_file(state, str(out / "model.safetensors"))
    return out


def test_a_missing_or_misshapen_weight_is_one_line(llama_target, checkpoint, tmp_path):
    missing = broken(checkpoint, tmp_path / "a", lambda s: s.pop("midlayer.hidden_norm.weight"))
    with pytest.raises(SpecbenchError, match="weight midlayer.hidden_norm.weight is missing"):
        build(llama_target, missing)
    wrong = broken(checkpoint, tmp_path / "b", lambda s: s.update({"fc.weight": torch.zeros(32, 64)}))
    with pytest.raises(SpecbenchError, match=r"fc.weight has shape \(32, 64\)"):
        build(llama_target, wrong)


def test_a_drafter_for_another_target_is_refused(checkpoint):
    with pytest.raises(SpecbenchError, match="hidden size is 32, the target's is 64"):
        build(llama(hidden=64), checkpoint)
    with pytest.raises(SpecbenchError, match="vocabulary size is 211, the target's is 300"):
        build(llama(vocab=300), checkpoint)
    with pytest.raises(SpecbenchError, match=r"layers \[2, 3, 3\]"):  # a 6-layer target: L//2 == L-3
        build(llama(layers=6), checkpoint)
