"""Combinations: the trie merge, and losslessness of merged proposals (greedy and sampling)."""

from __future__ import annotations

import random

import pytest
import torch

from specbench.analysis.cost_table import CostTable
from specbench.decoding.decode import generate
from specbench.decoding.drafting import DraftContext, StepOutcome
from specbench.decoding.sampling import Sampling
from specbench.decoding.tree import DraftTree
from specbench.methods.combine import (
    Calibration,
    CombinedDrafter,
    first_kept,
    member_path,
    merge_trees,
    paying_size,
    ranked,
    subtree,
)
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


def test_a_lone_tree_is_verified_as_it_is():
    """A routed step where one member drafted: the merge and a cut that keeps every node hand that tree on as it
    is (its trials with each q), each node where it was."""
    b = DraftTree()
    x = b.add(5, -1, "b")
    b.add(9, x, "b")
    b.add(6, x, "b", q=torch.tensor([0.5, 0.5]))
    merged, maps = merge_trees([DraftTree(), b, DraftTree()])
    assert merged is b and maps == [[], [0, 1, 2], []]
    assert subtree(b, [True] * 3) == (b, [0, 1, 2])


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


# -- how a combination decides: the budget cut, the calibration, the routers -------------------------------------


def test_the_budget_keeps_a_trie_of_the_likeliest_nodes():
    tree = DraftTree()
    a = tree.add(1, -1, "m")
    tree.add(2, a, "m")  # likely, but below an unlikely parent: ranks as its parent
    b = tree.add(3, -1, "m")
    tree.add(4, b, "m")
    order = ranked(tree, [0.2, 0.9, 0.6, 0.5])[0]
    assert first_kept(order, 2, len(tree)) == [False, False, True, True]
    assert first_kept(order, 3, len(tree)) == [True, False, True, True]
    kept, new = subtree(tree, [False, False, True, True])
    assert (kept.tokens, kept.parents, new) == ([3, 4], [-1, 0], [-1, -1, 0, 1])
    assert [t.node for t in kept.trials[0]] == [0] and [t.node for t in kept.trials[1]] == [1]


def test_calibration_learns_what_the_target_accepted_per_member():
    calibration = Calibration()
    tree = DraftTree.chain([1, 2], "m")
    tree.scores = [0.9, 0.8]
    before = calibration.estimate(0, 1, 0.9)
    for _ in range(20):
        calibration.record(0, tree, [True, True], {0})  # the first node always accepted, the second never
    assert calibration.estimate(0, 1, 0.9) > before > 0.5 > calibration.estimate(0, 2, 0.8)
    assert calibration.estimate(1, 2, 0.8) == 0.8  # another member's nodes: still its own score
    assert calibration.estimate(0, 3, None) == pytest.approx(0.6 ** 3)  # unscored: a prior decaying with depth


def deterministic(tokens: list[int]) -> DraftTree:
    return DraftTree.chain(tokens, "det")


def drawn(tokens: list[int]) -> DraftTree:
    return DraftTree.chain(tokens, "drawn", [torch.full((5,), 0.2)] * len(tokens))


def test_the_budget_cuts_deterministic_trees_and_keeps_drawn_ones_whole():
    drafter = combined(small_vocab_lm(1), mode="budget", budget=1)
    cut = drafter._cut([deterministic([1, 2, 3]), drawn([4, 0])])
    assert cut[0][0].tokens == [1] and cut[0][1] == [0, -1, -1]
    assert cut[1][0].tokens == [4, 0] and cut[1][1] == [0, 1]


def test_a_cut_that_looks_at_drawn_tokens_would_not_be_exact():
    """Why the budget keeps drawn trees whole: dropping a deterministic candidate whenever another member
    drew a given token changes the output distribution (the enumeration sees it)."""
    from tests.helpers import step_distribution, target_joint

    def make(rng):
        q = torch.tensor([0.1, 0.3, 0.2, 0.2, 0.2])
        token = rng.draw(q)
        trees = [deterministic([1]) if token != 1 else DraftTree(), DraftTree.chain([token], "drawn", [q])]
        return merge_trees(trees)[0]

    sampling = Sampling(temperature=1.0)
    assert (step_distribution(make, sampling) - target_joint(sampling)).abs().max() > 1e-3


def routing() -> tuple[CombinedDrafter, DraftContext]:
    """n-gram and a draft model routed, started on a repeating prompt, no member due to explore."""
    drafter = combined(small_vocab_lm(1), mode="route", explore=99)
    drafter.start(torch.tensor([1, 2, 1, 2, 1]), ())
    drafter.idle, drafter.sizes = [0, 0], [None, 3]
    return drafter, DraftContext(torch.tensor([1, 2, 1, 2, 1]), 16, Sampling(), random.Random(0), FixedController(16))


def test_the_cost_router_skips_a_model_member_that_does_not_pay():
    drafter, ctx = routing()
    drafter.gains, drafter.typical = [None, 0.1], [None, 0.1]
    ngram, draft = drafter._route(ctx)
    assert len(ngram) == 2 and draft is None  # n-gram's match (about 1.1 tokens expected) beats 0.1 for 3 forwards
    drafter.gains, drafter.sizes = [None, 3.0], [None, 3]  # the draft model's 3 accepted tokens pay for its 3 forwards
    drafter.typical = drafter.gains
    assert drafter._route(ctx)[1] is not None


def test_a_model_member_is_weighed_by_what_it_brings_beside_a_model_free_proposal_of_that_strength():
    drafter, ctx = routing()
    drafter.gains = drafter.typical = [None, 3.0]  # 3 tokens a draft on the whole: it pays
    assert drafter._route(ctx)[1] is not None and drafter._free_bin == 1  # n-gram's match: about 1.1 tokens
    drafter.beside[(1, 1)] = 0.0  # but beside a match like this one it brought nothing
    assert drafter._route(ctx)[1] is None
    drafter.beside = {(1, 0): 0.0}  # nothing beside no match at all says nothing of this step
    assert drafter._route(ctx)[1] is not None


def test_the_cost_router_scales_its_prices_by_what_steps_of_each_kind_took():
    drafter, ctx = routing()
    drafter.gains = drafter.typical = [None, 3.0]
    assert drafter.seconds_per_forward(1) == 1.0  # no step timed yet: the prices as they are
    ticks = iter([0.0, 0.02, 1.0, 1.05])
    drafter.clock = lambda: next(ticks)
    for _ in range(2):  # a step the draft model drafted, then (it accepted nothing) a step of n-gram alone
        drafter.propose(ctx)
        drafter.observe(StepOutcome(DraftTree(), [], 1, [1], ()))
    assert drafter.step_time[1][0] == pytest.approx(0.02) and drafter.step_time[-1][0] == pytest.approx(0.05)
    drafter.step_time = {-1: [0.02, 1.0, 1.0]}
    assert drafter.seconds_per_forward(1) == 0.02  # a kind not timed yet: the others'
    drafter.step_time, drafter.beside = {-1: [0.01, 1.0, 1.0], 1: [0.01, 1.0, 1.0]}, {}
    drafter.gains = drafter.typical = [None, 3.0]
    drafter.idle, drafter.sizes = [0, 0], [None, 3]
    assert drafter._route(ctx)[1] is not None
    drafter.step_time[1] = [0.05, 1.0, 1.0]  # the draft model's steps take 5 times their price: it no longer pays
    assert drafter._route(ctx)[1] is None


def two_models(**combine) -> CombinedDrafter:
    drafters = [DraftModelDrafter(small_vocab_lm(seed), DraftOptions(k=3)) for seed in (1, 2)]
    return CombinedDrafter(drafters, [lambda: FixedController(3)] * 2, CombineOptions(mode="route", **combine))


def test_of_model_members_alone_the_best_drafts_and_keeps_drafting_within_the_margin():
    drafter = two_models(explore=99)
    drafter.start(torch.tensor([1, 2, 1]), ())
    ctx = DraftContext(torch.tensor([1, 2, 1]), 16, Sampling(), random.Random(0), FixedController(16))
    drafter.idle, drafter.sizes = [0, 0], [3, 3]
    drafter.gains = drafter.typical = [0.0, 0.0]  # neither pays, but each would draft every step alone
    assert [t is not None for t in drafter._route(ctx)] == [True, False]
    drafter.typical = [1.0, 1.05]  # typically 5% better: within the 10% margin, the first keeps drafting
    assert [t is not None for t in drafter._route(ctx)] == [True, False]
    drafter.gains = [0.0, 3.0]  # lately far better, but the choice among model members goes by the typical
    assert [t is not None for t in drafter._route(ctx)] == [True, False]
    drafter.typical = [1.0, 1.5]
    assert [t is not None for t in drafter._route(ctx)] == [False, True]


def test_a_member_left_out_is_judged_against_the_chosen_one_on_the_steps_both_drafted():
    drafter = two_models(explore=99)
    drafter.start(torch.tensor([1, 2, 1]), ())
    ctx = DraftContext(torch.tensor([1, 2, 1]), 16, Sampling(), random.Random(0), FixedController(16))
    drafter.idle, drafter.sizes, drafter.held = [0, 0], [3, 3], 0
    drafter.gains = drafter.typical = [1.0, 0.5]  # the second's few drafts fell on hard text
    assert [t is not None for t in drafter._route(ctx)] == [True, False]
    drafter._last = ([DraftTree.chain([5, 6, 7], "a"), DraftTree.chain([5, 6, 7], "b")], [[0, 1, 2], [0, 1, 2]],
                     [True, True])
    drafter.observe(StepOutcome(DraftTree(), [0, 1, 2], 0, [0], ()))  # an exploration: same path, both
    assert drafter.paired == {(0, 1): [0.0, 1], (1, 0): [0.0, 1]}
    drafter.typical, drafter.paired[(1, 0)] = [1.0, 0.5], [0.5, 3]  # on the same text it brought half a token more
    assert [t is not None for t in drafter._route(ctx)] == [True, False]  # on 3 steps: not yet
    drafter.paired[(1, 0)] = [0.5, 4]
    assert [t is not None for t in drafter._route(ctx)] == [False, True]


def test_a_running_gain_starts_as_the_mean_of_the_first_drafts_and_forgets_by_the_step():
    drafter = two_models()
    drafter.start(torch.tensor([1, 2, 1]), ())
    drafter._last = ([DraftTree.chain([5, 6], "m"), DraftTree()], [[0, 1], []], [True, False])
    for accepted in ([0, 1], [], [0]):  # 2, 0 and 1 tokens
        drafter.observe(StepOutcome(DraftTree(), accepted, 0, [0], ()))
    assert drafter.gains == drafter.typical == [pytest.approx(1.0), None]
    drafter.counted[0], drafter.gap[0] = 100, 60  # a draft after 60 idle steps: what it brought then is stale
    drafter.observe(StepOutcome(DraftTree(), [0, 1], 0, [0], ()))
    assert drafter.typical[0] == pytest.approx(1 + (2 - 1) * (1 - 0.95 ** 60))
    assert drafter.gains[0] == pytest.approx(1 + (2 - 1) * (1 - 0.8 ** 60))


def test_a_dear_member_explores_no_more_than_a_share_of_the_runs_time():
    drafter = combined(small_vocab_lm(1), mode="route", explore=2, draft_cost=0.5)
    drafter.start(torch.tensor([1, 2, 1, 2, 1]), ())
    ctx = DraftContext(torch.tensor([1, 2, 1, 2, 1]), 16, Sampling(), random.Random(0), FixedController(16))
    drafter.gains = drafter.typical = [None, 0.0]
    drafter.sizes = [None, 10]
    drafter.step_time = {-1: [0.01, 1.0, 1.0]}  # 10 ms a step
    # its 3 draft forwards (1.5 target forwards) and 10 nodes' verify (0.3): 18 ms, 1.8 steps, 1% of 180 steps
    assert drafter._explore_floor(1, ctx) == pytest.approx(180)
    explored = [step for step in range(400) if drafter._route(ctx)[1] is not None]
    assert explored == [0, 180, 360]
    drafter.step_time = {-1: [1.0, 100.0, 1.0]}  # steps of 100 forwards: its drafts are cheap beside them
    assert [step for step in range(400, 550) if drafter._route(ctx)[1] is not None] == [540, 542, 544, 546, 548]


def test_a_member_that_sits_out_steps_has_their_tokens_to_catch_up_on():
    drafter = two_models()
    drafter.start(torch.tensor([1, 2, 1]), ())
    backlogs = []
    for drafted, committed in (([True, False], [4, 5, 6]), ([True, False], [7]), ([False, True], [8, 9])):
        drafter._last = ([DraftTree()] * 2, [[], []], drafted)
        drafter.observe(StepOutcome(DraftTree(), [], committed[-1], committed, ()))
        backlogs.append(list(drafter.backlog))
    assert backlogs == [[3, 3], [1, 4], [3, 2]]  # a member that drafted absorbed all before, the step's are new
    drafter.start(torch.tensor([1, 2, 1]), ())
    assert drafter.backlog == [0, 0]  # the prompt: every member absorbs it, whichever drafts


def test_the_cost_router_counts_what_a_members_tree_costs_to_verify():
    """3 accepted tokens do not pay for verifying 200 positions (0.03 of a forward each), n-gram's 2 do."""
    ctx = DraftContext(torch.tensor([1, 2, 1, 2, 1]), 16, Sampling(), random.Random(0), FixedController(16))
    for node_cost, drafts in ((0.03, False), (0.0, True)):
        drafter = combined(small_vocab_lm(1), mode="route", explore=99, node_cost=node_cost)
        drafter.start(torch.tensor([1, 2, 1, 2, 1]), ())
        drafter.idle, drafter.gains, drafter.sizes = [0, 0], [None, 3.0], [None, 200]
        drafter.typical = drafter.gains
        assert (drafter._route(ctx)[1] is not None) == drafts


def test_a_node_is_verified_only_where_it_pays_for_its_position():
    """Expected tokens per step time: 2.3 / 1.06 beats 1.9 / 1.03 and 2.31 / 1.09; free positions take every node;
    a cut no better than the margin keeps them all (2.3 / 1.06 is 2.4% better than 2.31 / 1.09, 7% than
    2.33 / 1.15)."""
    def linear(per_position):
        return lambda k: 1 + per_position * k

    assert paying_size([0.9, 0.4, 0.01], linear(0.03)) == 2
    assert paying_size([0.9, 0.4, 0.01], linear(0.0)) == 3
    assert paying_size([0.01, 0.01], linear(0.03)) == 0
    assert paying_size([], linear(0.03)) == 0
    assert paying_size([0.9, 0.4, 0.01], linear(0.03), margin=0.05) == 3
    assert paying_size([0.9, 0.4, 0.01, 0.01, 0.01], linear(0.03), margin=0.05) == 2


def test_the_cost_router_cuts_a_tree_to_the_nodes_that_pay_on_the_measured_curve():
    drafter = combined(small_vocab_lm(1), mode="route")
    tree = deterministic(list(range(1, 9)))
    tree.scores = [0.9 ** d for d in range(1, 9)]  # accepted less and less deep down
    assert len(drafter._cut([tree])[0][0]) == 8  # 0.03 a position: every node pays
    drafter.verify_curve = lambda positions: 1 + 0.5 * (positions - 1)  # a machine where positions are dear
    kept = drafter._cut([tree])[0][0]
    assert 0 < len(kept) < 8 and kept.tokens == tree.tokens[:len(kept)]
    assert len(drafter._cut([tree], draft_cost=2.0)[0][0]) > len(kept)  # drafting spent: a longer verify pays
    assert drafter.verify_cost(3) == 2.5


def test_a_run_prices_its_combinations_from_the_cost_table(tiny_model_dir, tiny_draft_dir, tmp_path):
    from specbench.bench.cost_timing import drafter_key
    from specbench.bench.pipeline import member_strategies, price_combinations
    from specbench.bench.prepare import prepare
    from specbench.plan.run_config import RunConfig

    def prepared(**knobs):
        return prepare(RunConfig(model=str(tiny_model_dir), drafters=[str(tiny_draft_dir)], limit=2,
                                 strategies=["ngram+draft"], out=str(tmp_path), knobs={"combine": knobs}).plan())

    bench = prepared()
    (member,) = member_strategies(bench.strategies)
    budget = member.new_controller().budget()
    table = CostTable({}, target=[{"batch": 1, "mask": mask, "context": c, "tokens": n, "median_s": 0.01 * (1 + n / 8)}
                                  for mask in ("chain", "tree") for c in (64, 1024) for n in (1, 8, 16, 32, 49)],
                      drafters={drafter_key(member): [{"budget": b, "median_s": 0.0045 * b} for b in (1, 8)]
                                + [{"budget": 1, "absorbed": 16, "median_s": 0.0045 + 0.01125}]})
    notes = price_combinations(bench, table)
    combination = bench.strategies[-1].drafter
    assert combination.verify_cost(7) == pytest.approx(16 / 9)  # 8 positions: 1 + 8/8 against 1 + 1/8
    ctx = DraftContext(torch.tensor([1, 2]), 16, Sampling(), random.Random(0), FixedController(16))
    combination.start(torch.tensor([1, 2]), ())
    assert combination.draft_cost(1, ctx) == pytest.approx(0.4 * budget)  # 4.5 ms a draft forward, 11.25 a target's
    assert combination.draft_cost(0, ctx) == 0.0  # n-gram drafts without a forward
    combination.backlog[1] = 16  # it sat out steps that committed 16 tokens: catching up costs a target forward
    assert combination.draft_cost(1, ctx) == pytest.approx(0.4 * budget + 1)
    combination.backlog[1] = 8.5
    assert combination.draft_cost(1, ctx) == pytest.approx(0.4 * budget + 0.5)
    assert "a verify of 8 positions 1.78" in notes[0] and f"draft {0.4 * budget:.2f} (budget {budget};" in notes[0]
    bench = prepared(node_cost=0.1, draft_cost=0.2)
    assert price_combinations(bench, table) == []
    assert bench.strategies[-1].drafter.verify_cost(7) == pytest.approx(1.7)


def test_the_entropy_router_switches_with_hysteresis():
    drafter = combined(small_vocab_lm(1), mode="route", router="entropy", entropy_low=0.5, entropy_high=1.5)
    drafter.start(torch.tensor([1, 2]), ())
    drafter.propose(DraftContext(torch.tensor([1, 2]), 16, Sampling(), random.Random(0), FixedController(16)))
    # entropies 1.61, 0.005 and 1.14 nats
    flat, peaked, middle = torch.zeros(5), torch.tensor([9.0, 0, 0, 0, 0]), torch.tensor([2.0, 0, 0, 0, 0])
    states = []
    for logits in (middle, flat, middle, peaked, middle):
        drafter.observe(StepOutcome(DraftTree(), [], 0, [0], (), logits))
        states.append(drafter.uncertain)
    assert states == [False, True, True, False, False]


def test_a_member_and_its_strategy_alone_share_one_timed_entry(tiny_model_dir, tiny_draft_dir, tmp_path):
    from specbench.bench.cost_timing import drafter_key, drafting
    from specbench.bench.pipeline import member_strategies
    from specbench.bench.prepare import prepare
    from specbench.plan.run_config import RunConfig

    bench = prepare(RunConfig(model=str(tiny_model_dir), drafters=[str(tiny_draft_dir)], limit=2,
                              strategies=["draft", "ngram+draft"], out=str(tmp_path)).plan())
    both = bench.strategies + member_strategies(bench.strategies)
    keys = [drafter_key(s) for s in drafting(both)]
    assert len(keys) == len(set(keys)) == 2  # draft (alone and as a member) and the combination
    table = CostTable({}, drafters={"k": [{"budget": 8, "median_s": 0.01}, {"budget": 8, "median_s": 0.02},
                                          {"budget": 4, "median_s": 0.01}]})
    assert table.drafter_s("k", 16) == pytest.approx(0.04)  # a budget timed twice reads its latest
