"""DSpark: lossless decoding, the Markov head, the confidence cut, the scheduler, training."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.drafting import DraftContext
from specbench.decoding.sampling import Sampling
from specbench.methods.controllers import CONTROLLERS, FixedController
from specbench.methods.dflash import STRATEGY as DFLASH
from specbench.methods.dspark import STRATEGY, DSparkDrafter, DSparkOptions
from specbench.methods.dspark_scheduler import DSparkScheduler
from specbench.methods.ngram import NgramOptions
from tests.helpers import (
    TINY_SHAPES,
    check_blocks_match_inference,
    check_lossless_inside_accepted_drafts,
    check_round_trip,
    chi_square_pvalue,
    small_vocab_target,
    tiny_target,
    train_tiny,
    uniform_prompt,
)

scheduler_for = CONTROLLERS["dspark"]  # (starting draft depth, a strategy's knob dataclass) -> a scheduler


def test_options_are_validated():
    for knob, value in [("block_size", 0), ("confidence_threshold", 1.5), ("markov_rank", 0), ("k_min", 1),
                        ("k_max", 1), ("window_size", 0), ("adjust_interval", 0), ("shrink_below", -0.1),
                        ("grow_above", 0.1), ("context_window", -1)]:
        with pytest.raises(SpecbenchError, match=f"dspark.{knob}"):
            DSparkOptions(**{knob: value})
    assert STRATEGY.budget(DSparkOptions(block_size=5)) == 5  # shifted: the anchor slot drafts too
    assert STRATEGY.default_controller == "dspark"


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_greedy_identity_untrained(shape):
    """Random drafters reproduce plain greedy decoding with the scheduler and with confidence cuts."""
    rng = random.Random(len(shape) + 1)
    vocab = TINY_SHAPES[shape][2]
    configs = [
        DSparkOptions(block_size=7, confidence_threshold=0.0, context_window=4, adjust_interval=2, hysteresis=False),
        DSparkOptions(block_size=3, confidence_threshold=0.3, context_window=0, layers=1, markov_rank=4),
        DSparkOptions(block_size=5, confidence_threshold=0.05, k_max=4),
    ]
    for seed in range(2):
        target = tiny_target(shape, seed=seed, eos=rng.randrange(vocab))
        for options in configs:
            drafter = DSparkDrafter.untrained(target, options, seed=seed)
            for _ in range(3):
                prompt, n = uniform_prompt(rng, vocab), rng.randint(1, 24)
                expected = generate(target.model, prompt, n, eos_ids=target.eos_ids)
                got = generate(target.model, prompt, n, eos_ids=target.eos_ids, drafter=drafter,
                               controller=scheduler_for(STRATEGY.budget(options), options))
                assert got.tokens == expected.tokens, (options, prompt, n)
                assert got.stop_reason == expected.stop_reason


@pytest.mark.parametrize("window", [0, 5])
def test_training_blocks_match_inference(window):
    check_blocks_match_inference(DSparkDrafter, DSparkOptions(block_size=4, context_window=window))


def started(options: DSparkOptions, prompt: list[int]) -> tuple[DSparkDrafter, torch.Tensor]:
    target = tiny_target("qwen3-gqa", seed=3)
    drafter = DSparkDrafter.untrained(target, options, seed=3)
    ids = torch.tensor(prompt)
    with torch.inference_mode():
        states = target.model(input_ids=ids[None, :-1], output_hidden_states=True).hidden_states
    drafter.start(ids, tuple(states[i][0] for i in drafter.hidden_layers))
    return drafter, ids


def test_markov_head_conditions_each_draft_on_the_previous_one():
    """Greedy drafts are sequential: draft k is the argmax of its logits corrected from draft k-1."""
    drafter, ids = started(DSparkOptions(block_size=6, confidence_threshold=0.0), [4, 8, 15, 16, 23, 42])
    model = drafter.model
    with torch.no_grad():
        model.markov_out.weight.mul_(300.0)  # a correction strong enough to change argmaxes
    tree = drafter.propose(DraftContext(ids, 6, Sampling(), None, FixedController(6)))
    assert len(tree) == 6
    with torch.inference_mode():
        x = model.block_inputs(ids[None, -1:], 6)
        hidden = model(x, torch.arange(len(ids) - 1, len(ids) + 5)[None], drafter.context)[0]
        base = model.logits(hidden)
        prev = torch.tensor([int(ids[-1])] + tree.tokens[:-1])
        corrected, _ = model.heads(hidden, base, prev)  # teacher-forced, as in training
    assert corrected.argmax(-1).tolist() == tree.tokens
    assert base.argmax(-1).tolist() != tree.tokens  # the Markov head mattered


class ScriptedConfidence(nn.Module):
    """Stands in for the confidence head: returns the logits of the given probabilities in turn."""

    def __init__(self, probs: list[float]):
        super().__init__()
        self.logits = iter(torch.logit(torch.tensor(probs)).tolist())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.tensor([next(self.logits)])


@pytest.mark.parametrize("probs, threshold, kept", [
    ([0.9, 0.9, 0.5, 0.9, 0.9, 0.9], 0.5, 2),  # cumulative 0.9, 0.81, 0.405: cut before the third
    ([0.9, 0.9, 0.5, 0.9, 0.9, 0.9], 0.0, 6),  # threshold 0: never cut
    ([0.3, 0.9, 0.9, 0.9, 0.9, 0.9], 0.5, 0),  # the first draft already below: nothing to verify
    ([0.5, 1.0, 1.0, 1.0, 1.0, 1.0], 0.5, 6),  # equal to the threshold is kept
    ([0.99] * 6, 0.95, 5),  # 0.99^6 = 0.941: many confident drafts add up
])
def test_confidence_cut(probs, threshold, kept):
    drafter, ids = started(DSparkOptions(block_size=6, confidence_threshold=threshold), [1, 2, 3, 4])
    drafter.model.confidence = ScriptedConfidence(probs)
    tree = drafter.propose(DraftContext(ids, 6, Sampling(), None, FixedController(6)))
    assert len(tree) == kept and tree.is_chain()


def test_budget_cuts_before_the_confidence_does():
    drafter, ids = started(DSparkOptions(block_size=6, confidence_threshold=0.5), [1, 2, 3, 4])
    drafter.model.confidence = ScriptedConfidence([0.99] * 6)
    assert len(drafter.propose(DraftContext(ids, 3, Sampling(), None, FixedController(3)))) == 3


def test_sampling_is_exact():
    """Markov-corrected, sequentially sampled drafts keep the target's exact distributions (top-k too)."""
    target = small_vocab_target(10, seed=1, initializer_range=0.1)
    sampling = Sampling(temperature=0.8, top_k=6)
    prompt = [3, 1, 4]
    drafter = DSparkDrafter.untrained(target, DSparkOptions(block_size=3, confidence_threshold=0.1, layers=1), seed=2)
    with torch.no_grad():
        drafter.model.markov_out.weight.mul_(10.0)
    p, accepted = chi_square_pvalue(target.model, prompt, sampling, 2000, lambda: (drafter, FixedController(3)))
    assert 0 < sum(a > 0 for a in accepted) < len(accepted)
    assert p > 0.001


# the scheduler


def feed(scheduler: DSparkScheduler, verifications: list[tuple[int, int]]) -> list[int]:
    """K after each update."""
    ks = []
    for drafted, accepted in verifications:
        scheduler.update(drafted, accepted)
        ks.append(scheduler.k)
    return ks


def test_scheduler_budget_and_start():
    scheduler = DSparkScheduler(8)
    assert scheduler.budget() == 7 and scheduler.keep_drafting(3, torch.zeros(5))
    assert DSparkScheduler(20).k == 8 and DSparkScheduler(0).k == 2  # the start is clamped into [k_min, k_max]


def test_scheduler_evaluates_every_interval_of_committed_tokens():
    scheduler = DSparkScheduler(4, adjust_interval=16, hysteresis=False)
    # full acceptance: 3 drafts + the bonus = 4 tokens a verification, so an evaluation every 4 updates
    assert feed(scheduler, [(3, 3)] * 3) == [4, 4, 4]
    assert feed(scheduler, [(3, 3)]) == [6]
    assert feed(scheduler, [(5, 5)] * 2) == [6, 6]  # 6 + 6 + 6 = 18 >= 16 at the third
    assert feed(scheduler, [(5, 5)]) == [8]
    # nothing accepted: 1 token a verification
    scheduler = DSparkScheduler(8, adjust_interval=16, hysteresis=False)
    assert feed(scheduler, [(7, 0)] * 15) == [8] * 15
    assert feed(scheduler, [(7, 0)]) == [6]


def test_scheduler_marks_bounds_and_step_size():
    scheduler = DSparkScheduler(5, adjust_interval=1, hysteresis=False, window_size=1)
    assert feed(scheduler, [(4, 4)] * 3) == [7, 8, 8]  # above grow_above: +2 up to k_max
    assert feed(scheduler, [(4, 2)]) == [8]  # 0.5 is inside the band: hold
    assert feed(scheduler, [(4, 0)] * 5) == [6, 4, 2, 2, 2]  # below shrink_below: -2 down to k_min
    assert feed(scheduler, [(0, 0)] * 2) == [2, 2]  # nothing drafted: no information, hold
    narrow = DSparkScheduler(3, adjust_interval=1, hysteresis=False, window_size=1, k_min=3, k_max=4)
    assert feed(narrow, [(2, 2), (3, 0)]) == [4, 3]  # a step of 2 is cut at the bounds
    rng = random.Random(0)
    scheduler = DSparkScheduler(5, adjust_interval=3, hysteresis=False, window_size=4)
    ks = [scheduler.k]
    for _ in range(500):
        drafted = scheduler.budget()
        ks.extend(feed(scheduler, [(drafted, rng.randint(0, drafted))]))
    assert all(abs(a - b) <= 2 for a, b in itertools.pairwise(ks)) and set(ks) <= set(range(2, 9))
    assert len(set(ks)) > 3


def test_scheduler_window_forgets_old_verifications():
    scheduler = DSparkScheduler(8, window_size=4, adjust_interval=1, hysteresis=False)
    feed(scheduler, [(7, 0)] * 4)  # shrinks to 2
    assert scheduler.k == 2
    scheduler.k = 8
    # the zeros still in the window first pull K down, then leave it
    assert feed(scheduler, [(7, 7)] * 4) == [6, 6, 8, 8]
    assert scheduler.acceptance_rate() == 1.0


def test_scheduler_hysteresis_needs_two_agreeing_evaluations():
    up, down = (4, 4), (4, 0)
    scheduler = DSparkScheduler(4, adjust_interval=1, window_size=1)
    assert feed(scheduler, [up, up]) == [4, 6]
    assert feed(scheduler, [up, up, up]) == [6, 8, 8]  # a change resets the vote
    assert feed(scheduler, [down, up, down, up]) == [8, 8, 8, 8]  # disagreeing votes never change K
    assert feed(scheduler, [down, (4, 2), down]) == [8, 8, 8]  # a hold in between breaks the streak
    assert feed(scheduler, [down]) == [6]  # agrees with the evaluation before
    no_hysteresis = DSparkScheduler(4, adjust_interval=1, window_size=1, hysteresis=False)
    assert feed(no_hysteresis, [down, up, down]) == [2, 4, 2]


def test_scheduler_validation_names_the_knob():
    for knobs, name in [({"k_min": 1}, "k_min"), ({"k_min": 5, "k_max": 4}, "k_max"),
                        ({"window_size": 0}, "window_size"), ({"adjust_interval": 0}, "adjust_interval"),
                        ({"grow_above": 0.2}, "grow_above"), ({"shrink_below": 1.5}, "shrink_below")]:
        with pytest.raises(SpecbenchError, match=name):
            DSparkScheduler(4, **knobs)


def test_scheduler_from_any_options():
    """`--controller dspark` with another drafter: its knobs where present, the defaults elsewhere."""
    scheduler = scheduler_for(5, NgramOptions())
    assert scheduler.k == 6 and scheduler.window_size == 64 and scheduler.adjust_interval == 16
    assert scheduler_for(20, NgramOptions()).k == 8
    custom = scheduler_for(3, SimpleNamespace(k_max=5, hysteresis=False, window_size=8, adjust_interval=4, k=99))
    assert (custom.k, custom.k_max, custom.hysteresis) == (4, 5, False)
    assert (custom.window_size, custom.adjust_interval) == (8, 4)
    options = DSparkOptions(k_min=4, grow_above=0.9)
    assert (scheduler_for(7, options).k_min, scheduler_for(7, options).grow_above) == (4, 0.9)
    with pytest.raises(SpecbenchError, match="k_max"):
        scheduler_for(3, SimpleNamespace(k_min=6, k_max=5))


# training


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny(STRATEGY, DSparkOptions(block_size=5, context_window=24, confidence_threshold=0.1),
                      tmp_path_factory)


def test_training_loss_falls(trained):
    first, last = sum(trained.losses[:5]) / 5, sum(trained.losses[-5:]) / 5
    assert last < 0.8 * first, trained.losses


def test_drafter_directory_round_trip(trained):
    check_round_trip(STRATEGY, trained)
    with pytest.raises(SpecbenchError, match="not dflash"):
        DFLASH.build(trained.target, DFLASH.options(), trained.directory)


def test_trained_drafter_is_lossless_inside_accepted_drafts(trained):
    check_lossless_inside_accepted_drafts(STRATEGY, trained)
