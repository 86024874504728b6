"""Targets whose KV cache is not plain full attention: sliding windows shorter than prompt + answer are
verified exactly (chains and trees); layer types whose state cannot be compacted are refused."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM

from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.kv_cache import attention_masks, check_supported, layer_types, state_bytes
from specbench.decoding.tree import DraftTree
from specbench.methods.controllers import FixedController
from specbench.methods.draft_model import DraftModelDrafter, DraftOptions
from specbench.methods.ngram import NgramDrafter, NgramOptions
from tests.helpers import ScriptedDrafter, oracle_tree, random_prompt

WINDOW = 6
VOCAB = 97


def sliding_mistral(seed: int = 0, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                           max_position_embeddings=512, initializer_range=0.3, attn_implementation="sdpa")
    return MistralForCausalLM(config).eval()


def hybrid_qwen3(seed: int = 0) -> torch.nn.Module:
    """Alternating full and sliding-window layers, as Gemma and Qwen3's `layer_types` declare them."""
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, use_sliding_window=True,
                         sliding_window=WINDOW,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         max_position_embeddings=512, initializer_range=0.3, attn_implementation="sdpa")
    return Qwen3ForCausalLM(config).eval()


@torch.no_grad()
def uncached_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The definition of greedy decoding: a full forward over the whole sequence for every token, no cache.

    (transformers' `generate` with its own sliding-window cache differs from this on some prompts, by
    logit margins far from a tie, so it is not the reference.)"""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("make", [sliding_mistral, hybrid_qwen3], ids=["mistral", "qwen3-hybrid"])
def test_sliding_windows_are_lossless_for_chains_and_trees(make):
    model = make()
    assert set(layer_types(model.config)) & {"sliding_attention"}
    rng = random.Random(3)
    for _ in range(3):
        prompt = random_prompt(rng, VOCAB, length=rng.randint(WINDOW + 2, 3 * WINDOW))
        n = rng.randint(2 * WINDOW, 4 * WINDOW)  # prompt + answer well past the window
        expected = generate(model, prompt, n).tokens
        assert expected == uncached_greedy(model, prompt, n)
        strategies = [
            (ScriptedDrafter(oracle_tree(model, 3, 4, VOCAB, rng)), FixedController(4)),  # trees: the 4D masks
            (NgramDrafter(NgramOptions(max_ngram=2, num_pred_tokens=4)), FixedController(4)),
            (DraftModelDrafter(sliding_mistral(seed=9, layers=1), DraftOptions(k=3)), FixedController(3)),
        ]
        for drafter, controller in strategies:
            assert generate(model, prompt, n, drafter=drafter, controller=controller).tokens == expected


def test_tree_masks_take_the_window_and_the_models_form():
    tree = DraftTree.chain([1, 2], "t")
    tree.add(3, -1, "t")
    mistral = attention_masks(sliding_mistral().config, tree, cached=10, dtype=torch.float32, device="cpu")
    assert isinstance(mistral, torch.Tensor)  # Mistral takes one mask for all (sliding) layers
    visible = mistral[0, 0] == 0
    # the second node sits at position 12: it sees positions 7..12 of its own path, not 6 or below
    assert visible[2].nonzero().flatten().tolist() == [7, 8, 9, 10, 11, 12]
    hybrid = attention_masks(hybrid_qwen3().config, tree, cached=10, dtype=torch.float32, device="cpu")
    assert set(hybrid) == {"full_attention", "sliding_attention"}
    assert (hybrid["full_attention"][0, 0, 2] == 0).sum() == 13  # 10 cached, root, first node, itself


def test_layers_that_cannot_be_compacted_are_refused():
    config = Qwen3Config(num_hidden_layers=2, layer_types=["full_attention", "full_attention"])
    check_supported(config)
    config.layer_types = ["linear_attention", "full_attention"]
    with pytest.raises(SpecbenchError, match="linear_attention layers") as refused:
        check_supported(config)
    assert "\n" not in str(refused.value)


def test_state_bytes_counts_tensors_and_caches():
    model = sliding_mistral()
    assert state_bytes(torch.zeros(3, dtype=torch.float32), [torch.zeros(2, dtype=torch.float16)], None) == 16
    drafter = DraftModelDrafter(model, DraftOptions(k=2))
    gen = generate(model, [1, 2, 3], 4, drafter=drafter, controller=FixedController(2))
    per_position = 2 * 2 * 2 * 16 * 4  # layers x (K, V) x kv heads x head dim x float32
    assert gen.drafter_state_bytes == per_position * drafter.cache.get_seq_length() > 0
