"""Tiny random-weight models built locally: real transformers classes, no download."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from specbench.models import Target

TINY_SHAPES = {
    # name: (config class, model class, vocab, kv heads)
    "qwen3-gqa": (Qwen3Config, Qwen3ForCausalLM, 97, 2),
    "llama-mha": (LlamaConfig, LlamaForCausalLM, 211, 4),
    "qwen3-mqa": (Qwen3Config, Qwen3ForCausalLM, 512, 1),
}


def tiny_lm(shape: str = "qwen3-gqa", seed: int = 0, layers: int = 2, hidden: int = 64) -> torch.nn.Module:
    config_cls, model_cls, vocab, kv_heads = TINY_SHAPES[shape]
    torch.manual_seed(seed)
    config = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=kv_heads,
                        head_dim=hidden // 4, max_position_embeddings=512, initializer_range=0.3,
                        tie_word_embeddings=False, attn_implementation="sdpa")
    return model_cls(config).eval()


def tiny_target(shape: str = "qwen3-gqa", seed: int = 0, eos: int | None = None) -> Target:
    model = tiny_lm(shape, seed)
    return Target(model, tokenizer=None, name=f"tiny-{shape}-{seed}", eos_ids=frozenset({eos} if eos is not None else ()))


@pytest.fixture(params=list(TINY_SHAPES))
def target(request) -> Target:
    return tiny_target(request.param)
