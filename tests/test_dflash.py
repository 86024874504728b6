"""DFlash: lossless decoding with untrained and trained block drafters, the context window, sampling
exactness, training and the drafter directory."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.drafting import DraftContext
from specbench.decoding.sampling import Sampling
from specbench.methods.controllers import EntropyController, FixedController, HeuristicController
from specbench.methods.dflash import STRATEGY, DFlashDrafter, DFlashOptions, context_layers
from tests.helpers import (
    TINY_SHAPES,
    Trained,
    check_blocks_match_inference,
    check_lossless_inside_accepted_drafts,
    check_round_trip,
    chi_square_pvalue,
    small_vocab_target,
    tiny_target,
    train_tiny,
    uniform_prompt,
)


def test_context_layers():
    assert context_layers(9) == (2, 5, 7)  # the default target: three of layers 1 .. N-3
    assert context_layers(36) == (2, 18, 34)
    assert context_layers(2) == (1, 2)  # tiny targets: every layer (2 = the final normed state)


def test_options_are_validated():
    for bad in ({"block_size": 1}, {"context_window": -1}, {"layers": 0}, {"gamma": 0.0}):
        with pytest.raises(SpecbenchError, match=f"dflash.{next(iter(bad))}"):
            DFlashOptions(**bad)
    assert STRATEGY.budget(DFlashOptions(block_size=6)) == 5


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_greedy_identity_untrained(shape):
    """Random drafters of several shapes reproduce plain greedy decoding: EOS, lengths, short windows."""
    rng = random.Random(len(shape))
    vocab = TINY_SHAPES[shape][2]
    configs = [
        (DFlashOptions(block_size=8, context_window=4, layers=1), lambda: FixedController(7)),
        (DFlashOptions(block_size=2, context_window=0), lambda: HeuristicController(1)),
        (DFlashOptions(block_size=5, context_window=16), lambda: EntropyController(4, threshold=3.0)),
    ]
    for seed in range(2):
        target = tiny_target(shape, seed=seed, eos=rng.randrange(vocab))
        for options, controller in configs:
            drafter = DFlashDrafter.untrained(target, options, seed=seed)
            for _ in range(3):
                prompt, n = uniform_prompt(rng, vocab), rng.randint(1, 24)
                expected = generate(target.model, prompt, n, eos_ids=target.eos_ids)
                got = generate(target.model, prompt, n, eos_ids=target.eos_ids, drafter=drafter,
                               controller=controller())
                assert got.tokens == expected.tokens, (options, prompt, n)
                assert got.stop_reason == expected.stop_reason


def test_budget_and_controller_cut_the_block():
    target = tiny_target("qwen3-gqa", seed=2)
    drafter = DFlashDrafter.untrained(target, DFlashOptions(block_size=8))
    prompt = torch.tensor([5, 6, 7, 8])
    with torch.inference_mode():
        states = target.model(input_ids=prompt[None, :-1], output_hidden_states=True).hidden_states
    drafter.start(prompt, tuple(states[i][0] for i in drafter.hidden_layers))

    class StopAt(FixedController):
        def keep_drafting(self, depth, logits):
            return depth < 3

    def propose(budget, controller):
        return drafter.propose(DraftContext(prompt, budget, Sampling(), None, controller))

    assert len(propose(2, FixedController(2))) == 2
    assert len(propose(20, FixedController(20))) == 7  # B - 1
    assert len(propose(0, FixedController(0))) == 0
    tree = propose(7, StopAt(7))
    assert len(tree) == 3 and tree.is_chain()


@pytest.mark.parametrize("window", [0, 5])
def test_training_blocks_match_inference(window):
    check_blocks_match_inference(DFlashDrafter, DFlashOptions(block_size=4, context_window=window))


def test_sampling_is_exact():
    """At temperature > 0 the first two tokens follow the target's exact distributions."""
    target = small_vocab_target(10, initializer_range=0.1)
    sampling = Sampling(temperature=1.0)
    prompt = [1, 2, 3]
    drafter = DFlashDrafter.untrained(target, DFlashOptions(block_size=4, layers=1), seed=1)
    p, accepted = chi_square_pvalue(target.model, prompt, sampling, 2000, lambda: (drafter, FixedController(3)))
    assert 0 < sum(a > 0 for a in accepted) < len(accepted)  # drafts were accepted, and rejected
    assert p > 0.001


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Trained:
    return train_tiny(STRATEGY, DFlashOptions(block_size=6, context_window=24), tmp_path_factory)


def test_training_loss_falls(trained):
    first, last = np.mean(trained.losses[:5]), np.mean(trained.losses[-5:])
    assert last < 0.6 * first, trained.losses


def test_drafter_directory_round_trip(trained):
    check_round_trip(STRATEGY, trained)
    head = trained.target.model.get_output_embeddings().weight
    state = STRATEGY.build(trained.target, trained.options, trained.directory).model.state_dict()
    assert not any(v.shape == head.shape for v in state.values())  # the target's weights are not saved


def test_trained_drafter_is_lossless_inside_accepted_drafts(trained):
    check_lossless_inside_accepted_drafts(STRATEGY, trained)
