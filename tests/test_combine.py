"""Combinations: the trie merge, and losslessness of merged proposals (greedy and sampling)."""

from __future__ import annotations

import random

import pytest
import torch

from specbench.decoding.decode import generate
from specbench.decoding.sampling import Sampling
from specbench.decoding.tree import DraftTree
from specbench.methods.combine import CombinedDrafter, member_path, merge_trees
from specbench.methods.combine_options import MODES, CombineOptions
from specbench.methods.controllers import FixedController
from specbench.methods.draft_model import DraftModelDrafter, DraftOptions
from specbench.methods.names import StrategyName, parse_strategy
from specbench.methods.ngram import NgramDrafter, NgramOptions
from tests.helpers import (
    CHI_SQUARE_PROMPT,
    CHI_SQUARE_RUNS,
    TINY_SHAPES,
    chi_square_pvalue,
    random_prompt,
    small_vocab_lm,
    tiny_lm,
    tiny_target,
)


def test_merge_shares_common_prefixes_and_keeps_every_proposer():
    a = DraftTree.chain([5, 6, 7], "a")
    b = DraftTree()
    x = b.add(5, -1, "b")
    b.add(9, x, "b")
    b.add(6, x, "b", q=torch.tensor([0.5, 0.5]))
    merged, maps = merge_trees([a, b])
    assert merged.tokens == [5, 6, 7, 9]
    assert merged.parents == [-1, 0, 1, 0]
    assert maps == [[0, 1, 2], [0, 3, 1]]
    assert [(t.node, t.drafter) for t in merged.trials[0]] == [(0, "a"), (0, "b")]
    assert [(t.node, t.drafter) for t in merged.trials[1]] == [(1, "a"), (3, "b"), (1, "b")]
    assert merged.trials[1][2].q is not None  # b's q survives the merge
    assert member_path([0, 1, 2], maps[1]) == [0, 2]
    assert member_path([0, 3], maps[0]) == [0]


def test_order_of_members_does_not_matter():
    assert parse_strategy("draft+ngram") == parse_strategy("ngram+draft") == StrategyName(("ngram", "draft"))


def combined(draft_lm, **combine) -> CombinedDrafter:
    return CombinedDrafter(
        [NgramDrafter(NgramOptions(max_ngram=2, num_pred_tokens=4)), DraftModelDrafter(draft_lm, DraftOptions(k=3))],
        [lambda: FixedController(4), lambda: FixedController(3)], CombineOptions(**combine))


@pytest.mark.parametrize("mode", MODES)
def test_combination_greedy_identity(mode):
    rng = random.Random(11)
    for shape in TINY_SHAPES:
        target = tiny_target(shape, seed=4, eos=rng.randrange(TINY_SHAPES[shape][2]))
        draft_lm = tiny_lm(shape, seed=40, layers=1, hidden=32)
        for _ in range(5):
            prompt = random_prompt(rng, TINY_SHAPES[shape][2])
            n = rng.randint(1, 20)
            expected = generate(target.model, prompt, n, eos_ids=target.eos_ids).tokens
            got = generate(target.model, prompt, n, eos_ids=target.eos_ids, drafter=combined(draft_lm, mode=mode),
                           controller=FixedController(16))
            assert got.tokens == expected


def test_the_union_accepts_at_least_its_best_member():
    target = tiny_target("qwen3-gqa", seed=2)
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    draft_lm = target.model  # a perfect drafter: every token accepted
    solo = generate(target.model, prompt, 24, drafter=DraftModelDrafter(draft_lm, DraftOptions(k=3)),
                    controller=FixedController(3))
    both = generate(target.model, prompt, 24, drafter=combined(draft_lm, mode="union"), controller=FixedController(16))
    assert both.tokens == solo.tokens
    assert both.steps <= solo.steps


def test_combination_sampling_is_exact():
    target, draft = small_vocab_lm(0), small_vocab_lm(1)
    p, _ = chi_square_pvalue(target, CHI_SQUARE_PROMPT, Sampling(temperature=1.0), CHI_SQUARE_RUNS,
                             lambda: (combined(draft), FixedController(16)))
    assert p > 0.001
