"""Sampling at temperature > 0 is exactly the target's distribution, for every drafter in this file;
a deliberately wrong verifier fails the same test, so the test can fail."""

from __future__ import annotations

from specbench.decoding.sampling import Sampling
from specbench.methods.controllers import FixedController
from specbench.methods.draft_model import DraftModelDrafter, DraftOptions
from specbench.methods.ngram import NgramDrafter, NgramOptions
from tests.helpers import CHI_SQUARE_PROMPT, CHI_SQUARE_RUNS, chi_square_pvalue, small_vocab_lm


def test_draft_model_sampling_is_exact():
    target, draft = small_vocab_lm(0), small_vocab_lm(1)
    p, _ = chi_square_pvalue(target, CHI_SQUARE_PROMPT, Sampling(temperature=1.0), CHI_SQUARE_RUNS,
                             lambda: (DraftModelDrafter(draft, DraftOptions(k=2)), FixedController(2)))
    assert p > 0.001


def test_ngram_sampling_is_exact_with_top_k_and_top_p():
    target = small_vocab_lm(2)
    p, _ = chi_square_pvalue(target, CHI_SQUARE_PROMPT, Sampling(temperature=0.8, top_k=4, top_p=0.9),
                             CHI_SQUARE_RUNS, lambda: (NgramDrafter(NgramOptions(max_ngram=2, num_pred_tokens=3)),
                                                       FixedController(3)))
    assert p > 0.001


def test_a_wrong_verifier_fails_the_same_test(monkeypatch):
    """Accepting every proposal (no rejection step) is the classic bug; the test must catch it."""
    target, draft = small_vocab_lm(0), small_vocab_lm(1)

    def accept_everything(tree, logits, sampling, rng):
        path = list(range(len(tree))) if tree.is_chain() else []
        return path, rng.draw(sampling.probs(logits[len(path)]))

    monkeypatch.setattr("specbench.decoding.decode.accept_sampling", accept_everything)
    p, _ = chi_square_pvalue(target, CHI_SQUARE_PROMPT, Sampling(temperature=1.0), CHI_SQUARE_RUNS,
                             lambda: (DraftModelDrafter(draft, DraftOptions(k=2)), FixedController(2)))
    assert p < 1e-6
