"""Sampling at temperature > 0 is exactly the target's distribution, for every drafter in this file;
a deliberately wrong verifier fails the same test, so the test can fail."""

from __future__ import annotations

import torch

from specbench.engine.sampling import Sampling
from specbench.strategies.controllers import FixedController
from specbench.strategies.draft_model import DraftModelDrafter, DraftOptions
from specbench.strategies.ngram import NgramDrafter, NgramOptions
from tests.sampling_check import chi_square_pvalue

PROMPT = [1, 2, 1, 2, 1]
RUNS = 1500


def small_vocab_lm(seed: int, hidden: int = 32):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=6, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=hidden // 2, initializer_range=0.5)
    return Qwen3ForCausalLM(config).eval()


def test_draft_model_sampling_is_exact():
    target, draft = small_vocab_lm(0), small_vocab_lm(1)
    p = chi_square_pvalue(target, PROMPT, Sampling(temperature=1.0), RUNS,
                          lambda: (DraftModelDrafter(draft, DraftOptions(k=2)), FixedController(2)))
    assert p > 0.001


def test_ngram_sampling_is_exact_with_top_k_and_top_p():
    target = small_vocab_lm(2)
    p = chi_square_pvalue(target, PROMPT, Sampling(temperature=0.8, top_k=4, top_p=0.9), RUNS,
                          lambda: (NgramDrafter(NgramOptions(max_ngram=2, num_pred_tokens=3)), FixedController(3)))
    assert p > 0.001


def test_a_wrong_verifier_fails_the_same_test(monkeypatch):
    """Accepting every proposal (no rejection step) is the classic bug; the test must catch it."""
    target, draft = small_vocab_lm(0), small_vocab_lm(1)

    def accept_everything(tree, logits, sampling, rng):
        path = list(range(len(tree))) if tree.is_chain() else []
        return path, rng.draw(sampling.probs(logits[len(path)]))

    monkeypatch.setattr("specbench.engine.decode.accept_sampling", accept_everything)
    p = chi_square_pvalue(target, PROMPT, Sampling(temperature=1.0), RUNS,
                          lambda: (DraftModelDrafter(draft, DraftOptions(k=2)), FixedController(2)))
    assert p < 1e-6
