"""Batched decoding: every sequence of a batch decodes exactly what it decodes alone (greedy), samples
exactly from the target (temperature > 0), and trees are refused."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from specbench.analysis.batch_model import drain
from specbench.core.errors import SpecbenchError
from specbench.decoding.batch import drafter_copies, generate_batch
from specbench.decoding.decode import generate
from specbench.decoding.sampling import Sampling, seeded
from specbench.decoding.target import encode_turns
from specbench.decoding.tree import DraftTree
from specbench.methods.build import build_strategy
from specbench.methods.controllers import FixedController, HeuristicController
from specbench.methods.draft_model import DraftModelDrafter, DraftOptions
from specbench.methods.names import parse_strategy
from specbench.methods.ngram import NgramDrafter, NgramOptions
from specbench.plan.suites import load_suite
from tests.helpers import (
    TINY_SHAPES,
    ScriptedDrafter,
    enumerate_outcomes,
    exact_first_two,
    random_prompt,
    small_vocab_lm,
    tiny_target,
)

CHAIN_STRATEGIES = ("ar", "ngram", "draft", "dflash", "dspark")


def alone(model, prompts, limits, eos_ids=frozenset(), make=None):
    """Each sequence decoded by itself (decode.generate), with a fresh drafter state and controller."""
    out = []
    for prompt, limit in zip(prompts, limits):
        drafter, controller = make() if make else (None, None)
        out.append(generate(model, prompt, limit, Sampling(), eos_ids, drafter, controller))
    return out


def together(model, prompts, limits, eos_ids=frozenset(), make=None):
    drafters = controllers = None
    if make:
        pairs = [make() for _ in prompts]
        drafters, controllers = [d for d, _ in pairs], [c for _, c in pairs]
    return generate_batch(model, prompts, limits, Sampling(), eos_ids, drafters, controllers)


def assert_same(batched, singles) -> None:
    for got, want in zip(batched.sequences, singles):
        assert got.tokens == want.tokens
        assert got.stop_reason == want.stop_reason
        assert (got.steps, got.drafted, got.accepted) == (want.steps, want.drafted, want.accepted)
        assert got.accept_by_position == want.accept_by_position


def assert_trace(batched, singles) -> None:
    """The per-step trace: the rows active never above the batch nor growing, at each step the sequences
    with steps left (the load axis's drain of their step counts), and its committed tokens the output's."""
    rows = batched.step_rows
    assert len(rows) == len(batched.step_tokens) == len(batched.block_lengths) == batched.steps
    assert rows[0] <= len(singles) and all(a >= b for a, b in zip(rows, rows[1:]))
    assert rows == [sum(s.steps > k for s in singles) for k in range(batched.steps)]
    assert Counter(rows) == drain([s.steps for s in singles], len(singles)) and sum(rows) == batched.rows
    assert sum(batched.step_tokens) == sum(len(s.tokens) for s in singles)
    assert all(rows <= tokens <= rows * block for rows, tokens, block in zip(rows, batched.step_tokens,
                                                                             batched.block_lengths))


def oracle_chain(model, rng: random.Random, vocab: int, depth: int = 5):
    """The target's true continuation, corrupted at a random position: acceptance differs per step and sequence."""

    def make(ctx):
        truth = generate(model, ctx.tokens.tolist(), depth).tokens
        cut = rng.randint(0, depth)
        return DraftTree.chain(truth[:cut] + [rng.randrange(vocab)] * (depth - cut), "oracle")

    return make


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_ragged_batch_matches_batch_one(shape):
    """Prompts of different lengths (one of a single token: nothing to prefill), one sequence stopping at
    an early EOS, others at their own max_new_tokens, and acceptance that differs per sequence and step."""
    vocab = TINY_SHAPES[shape][2]
    rng = random.Random(3)
    target = tiny_target(shape, seed=2)
    prompts = [random_prompt(rng, vocab, length) for length in (1, 4, 19, 9)]
    limits = [18, 3, 22, 12]
    eos = frozenset({generate(target.model, prompts[2], 6).tokens[5]})  # sequence 2 ends at its 6th token
    make = lambda: (ScriptedDrafter(oracle_chain(target.model, random.Random(5), vocab)), FixedController(5))  # noqa: E731
    for drafter in (None, make):
        singles = alone(target.model, prompts, limits, eos, drafter)
        batched = together(target.model, prompts, limits, eos, drafter)
        assert singles[2].stop_reason == "eos" and len(singles[2].tokens) <= 6
        assert_same(batched, singles)
        assert_trace(batched, singles)
        assert batched.steps == max(s.steps for s in singles)
    assert len({tuple(s.accept_by_position) for s in singles}) > 1  # ragged: sequences accepted differently


@dataclass
class LoggingController(HeuristicController):
    """The heuristic rule, logging every outcome it learns from."""

    seen: list[tuple[int, int]] = field(default_factory=list)

    def update(self, drafted: int, accepted: int) -> None:
        self.seen.append((drafted, accepted))
        super().update(drafted, accepted)


def test_controllers_learn_the_same_outcomes_in_a_batch():
    """A sequence's controller is told the same (drafted, accepted) at every step alone and in a batch, and
    so drafts the same budgets (the heuristic's budget follows what it is told)."""
    rng = random.Random(4)
    target = tiny_target("qwen3-gqa", seed=1)
    vocab = TINY_SHAPES["qwen3-gqa"][2]
    prompts = [random_prompt(rng, vocab, length) for length in (3, 11, 6)]
    limits = [20, 14, 24]
    made: list[LoggingController] = []

    def make():
        draws = random.Random(9)

        def budgeted(ctx):  # the controller's budget deep, wrong from a random position on
            truth = generate(target.model, ctx.tokens.tolist(), ctx.budget).tokens
            cut = draws.randint(0, ctx.budget)
            return DraftTree.chain(truth[:cut] + [draws.randrange(vocab)] * (ctx.budget - cut), "oracle")

        made.append(LoggingController(2))
        return ScriptedDrafter(budgeted), made[-1]

    singles = alone(target.model, prompts, limits, make=make)
    alone_seen = [c.seen for c in made]
    made.clear()
    batched = together(target.model, prompts, limits, make=make)
    assert_same(batched, singles)
    assert [c.seen for c in made] == alone_seen
    assert [g.budget for g in batched.sequences] == [g.budget for g in singles]
    assert any(a == d for seen in alone_seen for d, a in seen) and any(a < d for seen in alone_seen for d, a in seen)


def test_sliding_window_target():
    """Sliding-window layers (alone and mixed with full ones) see only their window in the batched masks."""
    rng = random.Random(0)
    prompts = [random_prompt(rng, 50, length) for length in (2, 9, 20)]
    for types in (["sliding_attention", "full_attention"], ["sliding_attention"] * 2):
        torch.manual_seed(0)
        config = Qwen3Config(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.3,
                             use_sliding_window=True, sliding_window=4, layer_types=types)
        model = Qwen3ForCausalLM(config).eval()
        make = lambda: (NgramDrafter(NgramOptions(max_ngram=2, num_pred_tokens=4)), FixedController(4))  # noqa: E731
        for drafter in (None, make):
            assert_same(together(model, prompts, [12] * 3, make=drafter), alone(model, prompts, [12] * 3, make=drafter))


@pytest.mark.parametrize("name", CHAIN_STRATEGIES)
def test_every_chain_strategy_on_the_default_model(default_target, name):
    """The shipped drafters on real prompts of different lengths: batched greedy equals batch 1."""
    items = load_suite("specbench").items
    prompts = [encode_turns(default_target.tokenizer, list(item.turns[:1]), []) for item in items[:40:10]]
    assert len({len(p) for p in prompts}) == len(prompts)
    limits = [20, 9, 20, 14]
    eos = frozenset(default_target.eos_ids | {generate(default_target.model, prompts[1], 4).tokens[3]})
    strategy = build_strategy(parse_strategy(name), default_target, {}, {})
    make = (lambda: (strategy.drafter, strategy.new_controller())) if strategy.drafter else None
    singles = alone(default_target.model, prompts, limits, eos, make)
    if strategy.drafter:
        copies = iter(drafter_copies(strategy.drafter, len(prompts)))
        make = lambda: (next(copies), strategy.new_controller())  # noqa: E731
    batched = together(default_target.model, prompts, limits, eos, make)
    assert singles[1].stop_reason == "eos"
    assert_same(batched, singles)
    assert_trace(batched, singles)
    if name != "ar":
        assert len({s.steps for s in singles}) > 1  # sequences needed different numbers of steps


def test_drafter_copies_share_weights_not_state(default_target):
    drafter = build_strategy(parse_strategy("dflash"), default_target, {}, {}).drafter
    a, b = drafter_copies(drafter, 2)
    assert a.model is b.model is drafter.model
    a.start(torch.tensor([1, 2, 3]), (torch.zeros(2, 320),) * 3)
    assert a.pending and not getattr(b, "pending", None)


def batched_distribution(target, prompts, which: int, limit: int, make) -> dict[tuple[int, ...], float]:
    """Exact distribution of sequence `which`'s output in a batch, by enumerating its Rng's every
    outcome while the other sequences draw from fixed seeds."""

    def run(rng) -> tuple[int, ...]:
        rngs = [rng if k == which else seeded(k, torch.device("cpu")) for k in range(len(prompts))]
        pairs = [make() for _ in prompts]
        batch = generate_batch(target, prompts, limit, Sampling(temperature=1.0), drafters=[d for d, _ in pairs],
                               controllers=[c for _, c in pairs], rngs=rngs)
        return tuple(batch.sequences[which].tokens)

    return enumerate_outcomes(run)


PROMPTS = [[1, 2, 1, 2, 1], [3], [4, 0, 4, 0]]


@pytest.mark.parametrize("which", range(len(PROMPTS)))
def test_batched_sampling_is_exact_per_sequence(which):
    """Each sequence of a batch samples exactly from the target: its first two tokens with a deterministic
    chain (prompt lookup), its first token with sampled drafts (a draft model's q), to 1e-6."""
    target, draft = small_vocab_lm(0), small_vocab_lm(1)
    prompt = PROMPTS[which]
    lookup = batched_distribution(target, PROMPTS, which, 2, lambda: (
        NgramDrafter(NgramOptions(max_ngram=2, num_pred_tokens=3)), FixedController(3)))
    exact = exact_first_two(target, prompt, Sampling(temperature=1.0))
    assert max(abs(lookup.get(pair, 0.0) - p) for pair, p in np.ndenumerate(exact.numpy())) < 1e-6
    drafted = batched_distribution(target, PROMPTS, which, 1,
                                   lambda: (DraftModelDrafter(draft, DraftOptions(k=1)), FixedController(1)))
    first = torch.tensor([drafted.get((t,), 0.0) for t in range(6)], dtype=torch.float64)
    assert torch.allclose(first, exact_first_two(target, prompt, Sampling(temperature=1.0)).sum(1), atol=1e-6)


def test_a_wrong_batched_verifier_fails_the_same_test(monkeypatch):
    def accept_everything(tree, logits, sampling, rng):
        return list(range(len(tree))), rng.draw(sampling.probs(logits[len(tree)]))

    monkeypatch.setattr("specbench.decoding.decode.accept_sampling", accept_everything)  # the batch's too
    target, draft = small_vocab_lm(0), small_vocab_lm(1)
    drafted = batched_distribution(target, PROMPTS, 0, 1,
                                   lambda: (DraftModelDrafter(draft, DraftOptions(k=1)), FixedController(1)))
    first = torch.tensor([drafted.get((t,), 0.0) for t in range(6)], dtype=torch.float64)
    assert (first - exact_first_two(target, PROMPTS[0], Sampling(temperature=1.0)).sum(1)).abs().max() > 1e-3


def test_trees_are_refused():
    target = tiny_target()

    def tree(ctx):
        t = DraftTree.chain([1, 2], "t")
        t.add(3, -1, "t")
        return t

    with pytest.raises(SpecbenchError, match="batched decoding verifies chains only"):
        together(target.model, [[1, 2], [3]], [4, 4], make=lambda: (ScriptedDrafter(tree), FixedController(2)))
