"""analysis/stats.py against answers computed by hand: the paired per-token speedup and its geometric
mean, the bootstrap interval's coverage, per-position acceptance, tau and the other summary figures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from specbench.analysis.stats import (
    PositionCounts,
    geometric_mean,
    geometric_mean_ci,
    paired_speedups,
    summarise_strategies,
)
from specbench.decoding.decode import Generation
from specbench.decoding.tree import DraftTree


def row(strategy, prompt, new_tokens, wall_s, repeat=0, **extra):
    base = {"strategy": strategy, "prompt_id": prompt, "category": "c", "turn": 0, "repeat": repeat,
            "prompt_tokens": 10, "new_tokens": new_tokens, "wall_s": wall_s, "steps": new_tokens, "drafted": 0,
            "accepted": 0, "accept_by_position": [], "prefill_s": 0.1 * wall_s, "draft_s": 0.0,
            "verify_s": 0.8 * wall_s, "other_s": 0.1 * wall_s, "memory_bytes": 1000, "peak_mem_bytes": 5000,
            "mismatch": False, "first_divergence": None}
    return {**base, **extra}


# prompt p1: ar 100 tokens in 2 s (50 tok/s), s 100 in 1 s (100 tok/s): 2x
# prompt p2: ar 60 tokens in 1 s (60 tok/s), s 40 in 0.5 s (80 tok/s): 4/3 (per answer it would read 2x)
HAND = pd.DataFrame([row("ar", "p1", 100, 2.0), row("s", "p1", 100, 1.0),
                     row("ar", "p2", 60, 1.0), row("s", "p2", 40, 0.5)])


def test_paired_speedup_per_token_by_hand():
    assert paired_speedups(HAND).tolist() == pytest.approx([1.0, 2.0, 1.0, 4 / 3])
    s = summarise_strategies(HAND)[1]
    assert s.strategy == "s" and s.speedup == pytest.approx(math.sqrt(2 * 4 / 3))
    assert s.speedup_ci[0] <= s.speedup <= s.speedup_ci[1]
    assert s.tokens_per_s == pytest.approx(140 / 1.5)
    assert summarise_strategies(HAND)[0].speedup == 1.0


def test_repeats_are_averaged_before_prompts():
    rows = pd.DataFrame([row("ar", "p1", 10, 1.0, 0), row("s", "p1", 10, 0.5, 0),  # 2x
                         row("ar", "p1", 10, 1.0, 1), row("s", "p1", 10, 0.125, 1),  # 8x
                         row("ar", "p2", 10, 1.0), row("s", "p2", 10, 1.0)])  # 1x
    # p1: sqrt(2 * 8) = 4; p2: 1; over prompts: sqrt(4 * 1) = 2 (pooling all rows would give 16^(1/3))
    assert summarise_strategies(rows)[1].speedup == pytest.approx(2.0)


def test_geometric_mean_by_hand():
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    assert geometric_mean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert geometric_mean([2.0, None, float("nan")]) == pytest.approx(2.0)
    assert geometric_mean_ci(np.array([0.5, 2.0]))[0] == pytest.approx(1.0)


def test_bootstrap_interval_covers_the_true_geometric_mean_about_95_percent():
    rng = np.random.default_rng(0)
    truth, trials, hits = 1.6, 300, 0
    for t in range(trials):
        ratios = np.exp(rng.normal(math.log(truth), 0.3, size=40))
        _, low, high = geometric_mean_ci(ratios, seed=t)
        hits += low <= truth <= high
    assert 0.90 <= hits / trials <= 0.98


def test_per_position_acceptance_of_hand_built_steps():
    """Five drafts accepting 0, 1, 3, 2 and 3 of 3 drafts, and one step that drafted nothing: positions
    1, 2, 3 accepted by 4, 3 and 2 of the 5 drafts (unconditional, vLLM's); conditionally a1 = 4/6 (the
    empty step rejected at position 1), a2 = 3/4, a3 = 2/3."""
    gen = Generation(tokens=[])
    for accepted in (0, 1, 3, 2, 3):
        gen.record(DraftTree.chain([7, 7, 7], "t"), accepted, budget=3)
    gen.record(DraftTree(), 0, budget=0)
    assert gen.accept_by_position == [4, 3, 2] and gen.drafts == 5 and gen.steps == 6
    counts = PositionCounts(np.array(gen.accept_by_position), gen.drafts, gen.steps)
    assert counts.rates() == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    assert counts.conditional() == pytest.approx([4 / 6, 3 / 4, 2 / 3])
    assert gen.drafted == 15 and gen.accepted == 9 and gen.verified == 21 and gen.budget == 15


def test_tau_efficiency_shares_and_mismatches():
    rows = pd.DataFrame([
        row("ar", "p1", 12, 1.0),
        row("s", "p1", 12, 0.5, steps=4, drafts=4, drafted=16, accepted=8, accept_by_position=[3, 3, 2],
            draft_s=0.1, verify_s=0.3, other_s=0.05, prefill_s=0.05),
    ])
    s = summarise_strategies(rows)[1]
    assert s.tau == 3.0  # 12 tokens over 4 target forwards
    assert s.draft_efficiency == 0.5  # 8 of 16 drafted nodes accepted
    assert s.acceptance_rate_by_position == pytest.approx([3 / 4, 3 / 4, 2 / 4])
    assert s.conditional_acceptance_by_position == pytest.approx([3 / 4, 1.0, 2 / 3])
    assert s.time_shares == pytest.approx({"prefill": 0.1, "draft": 0.2, "verify": 0.6, "other": 0.1})
    assert s.mismatches == 0
    sampled = summarise_strategies(rows.assign(mismatch=None))[1]
    assert sampled.mismatches is None  # no greedy check runs when sampling


def test_summaries_by_category():
    slower = HAND.assign(category="d", prompt_id=HAND.prompt_id + "d", wall_s=HAND.wall_s * [1, 2, 1, 2])
    rows = pd.concat([HAND, slower])
    by = summarise_strategies(rows, by="category")
    assert [(s.category, s.strategy) for s in by] == [("c", "ar"), ("c", "s"), ("d", "ar"), ("d", "s")]
    assert by[1].speedup == pytest.approx(math.sqrt(2 * 4 / 3))
    assert by[3].speedup == pytest.approx(math.sqrt(1 * 2 / 3))


def test_accepted_tokens_per_step_are_the_differences_of_the_positions_reached():
    from specbench.analysis.stats import PositionCounts

    # 10 steps: 6 accepted position 1, 3 of them position 2, 1 of those position 3
    counts = PositionCounts(np.array([6, 3, 1]), drafts=8, steps=10)
    assert counts.accepted_per_step() == pytest.approx([0.4, 0.3, 0.2, 0.1])
    assert PositionCounts(np.array([]), drafts=0, steps=0).accepted_per_step() == []
