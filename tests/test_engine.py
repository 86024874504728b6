"""The decode loop: greedy identity with plain decoding, trees vs chains, KV compaction."""

from __future__ import annotations

import random

import pytest
import torch

from specbench.decoding import linear
from specbench.decoding.decode import forward, generate
from specbench.decoding.drafting import DraftContext
from specbench.decoding.flat import StaticKV
from specbench.decoding.kv_cache import buffers, cache_length, fast_path, keep_path, new_cache, run_model
from specbench.decoding.linear import packing
from specbench.decoding.sampling import Sampling
from specbench.decoding.tree import DraftTree, ancestor_matrix, tree_attention_mask
from specbench.decoding.verify import accept_greedy
from specbench.methods.controllers import FixedController, HeuristicController
from specbench.methods.draft_model import DraftModelDrafter, DraftOptions
from specbench.methods.ngram import NgramDrafter, NgramOptions
from tests.helpers import TINY_SHAPES, ScriptedDrafter, oracle_tree, random_prompt, tiny_lm, tiny_target


def test_tree_mask_and_ancestors():
    tree = DraftTree()
    a = tree.add(5, -1, "t")
    b = tree.add(6, -1, "t")
    c = tree.add(7, a, "t")
    seen = ancestor_matrix(tree)
    assert seen[c + 1].tolist() == [True, True, False, True]
    assert seen[b + 1].tolist() == [True, False, True, False]
    mask = tree_attention_mask(tree, cached=3, dtype=torch.float32, device=torch.device("cpu"))
    assert mask.shape == (1, 1, 4, 7)
    assert (mask[0, 0, :, :3] == 0).all()
    assert mask[0, 0, c + 1, 3 + b + 1] == torch.finfo(torch.float32).min
    assert tree.depths() == [1, 1, 2]
    assert not tree.is_chain() and DraftTree.chain([1, 2, 3], "t").is_chain()


@pytest.mark.parametrize("fast", [True, False], ids=["static", "dynamic"])
def test_keep_path_moves_accepted_positions(fast):
    model = tiny_lm()
    with fast_path(fast):
        cache = new_cache(model)
    assert isinstance(cache, StaticKV) == fast
    with torch.no_grad():
        run_model(model, cache, torch.arange(8)[None])
    before = [keys.clone() for keys, _ in buffers(cache)]
    keep_path(cache, start=3, offsets=[0, 2, 4])
    assert cache_length(cache) == 6
    for (keys, _), old in zip(buffers(cache), before):
        assert torch.equal(keys[..., :4, :], old[..., :4, :])
        assert torch.equal(keys[..., 4, :], old[..., 5, :])
        assert torch.equal(keys[..., 5, :], old[..., 7, :])


def test_accept_greedy_follows_argmax():
    tree = DraftTree()
    a = tree.add(1, -1, "t")
    tree.add(2, -1, "t")
    tree.add(3, a, "t")
    logits = torch.full((4, 5), -1.0)
    logits[0, 1] = logits[1, 4] = 1.0  # root -> token 1 (node a); after a -> 4, not 3
    assert accept_greedy(tree, logits) == ([a], 4)


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
@pytest.mark.parametrize("branching", [1, 3])
def test_tree_verification_is_lossless(shape, branching):
    target = tiny_target(shape, seed=3)
    vocab = target.model.config.vocab_size
    rng = random.Random(7)
    for _ in range(4):
        prompt = random_prompt(rng, vocab)
        n = rng.randint(1, 20)
        expected = generate(target.model, prompt, n).tokens
        drafter = ScriptedDrafter(oracle_tree(target.model, branching, 4, vocab, rng))
        got = generate(target.model, prompt, n, drafter=drafter, controller=FixedController(4))
        assert got.tokens == expected
        assert got.steps < len(expected) or len(expected) <= 1


def test_tree_equals_chain_on_single_path():
    """A single-path tree forced through the tree-mask code path matches the chain path."""
    target = tiny_target("llama-mha", seed=1)
    prompt = [3, 1, 4, 1, 5]
    truth = generate(target.model, prompt, 12).tokens

    def chain(ctx):
        return DraftTree.chain(truth[len(ctx.tokens) - len(prompt):][:4], "t")

    def tree_with_dead_leaf(ctx):
        tree = chain(ctx)
        tree.add(0, -1, "t")  # a second root child makes it a tree, verified with a 4D mask
        return tree

    a = generate(target.model, prompt, 12, drafter=ScriptedDrafter(chain), controller=FixedController(4))
    b = generate(target.model, prompt, 12, drafter=ScriptedDrafter(tree_with_dead_leaf), controller=FixedController(4))
    assert a.tokens == b.tokens == truth
    assert a.steps == b.steps
    assert a.accept_by_position == b.accept_by_position


def all_drafters(shape: str, seed: int):
    draft_lm = tiny_lm(shape, seed=seed + 100, layers=1, hidden=32)
    return [
        (NgramDrafter(NgramOptions(max_ngram=3, num_pred_tokens=5)), FixedController(5)),
        (NgramDrafter(NgramOptions(max_ngram=1, num_pred_tokens=3)), HeuristicController(3)),
        (DraftModelDrafter(draft_lm, DraftOptions(k=4)), FixedController(4)),
        (DraftModelDrafter(draft_lm, DraftOptions(k=2)), HeuristicController(2)),
    ]


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_greedy_identity_random_prompts(shape):
    """Every drafter reproduces plain greedy decoding on many random prompts, EOS and lengths included."""
    rng = random.Random(hash(shape) % 1000)
    for seed in range(2):
        vocab = TINY_SHAPES[shape][2]
        eos = rng.randrange(vocab)
        target = tiny_target(shape, seed=seed, eos=eos)
        for _ in range(6):
            prompt = random_prompt(rng, vocab, length=rng.choice([1, 2, 3, rng.randint(4, 30)]))
            n = rng.randint(1, 24)
            expected = generate(target.model, prompt, n, eos_ids=target.eos_ids)
            for drafter, controller in all_drafters(shape, seed):
                got = generate(target.model, prompt, n, eos_ids=target.eos_ids, drafter=drafter, controller=controller)
                assert got.tokens == expected.tokens, (drafter.name, prompt, n)
                assert got.stop_reason == expected.stop_reason


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_fast_path_is_transformers_forward(shape):
    """decoding/flat.py's forward over its static cache, with F.linear's products, gives transformers' logits
    bit for bit (prefill, decode, chains and tree masks, a cache that grows past its first buffers), so
    every decode is the same."""
    model = tiny_lm(shape, seed=5)
    vocab = model.config.vocab_size
    rng = random.Random(11)
    prompt = random_prompt(rng, vocab, length=250)
    with fast_path(False):
        slow = new_cache(model)
    fast = new_cache(model)
    assert isinstance(fast, StaticKV) and not isinstance(slow, StaticKV)
    tree = oracle_tree(model, 3, 4, vocab, rng)(DraftContext(torch.tensor(prompt), 4, Sampling(), None, None))
    with torch.no_grad(), packing(False):
        for cache in (slow, fast):
            run_model(model, cache, torch.tensor(prompt)[None])
        assert torch.equal(*[forward(model, torch.tensor([1] + tree.tokens), c, tree, (0, 1))[0] for c in (slow, fast)])
        for cache in (slow, fast):
            keep_path(cache, len(prompt), [0, 2])
        for new in (1, 5, 1):
            ids = torch.randint(vocab, (1, new))
            a, b = (run_model(model, c, ids, output_hidden_states=True) for c in (slow, fast))
            assert torch.equal(a.logits, b.logits)
            assert all(torch.equal(x, y) for x, y in zip(a.hidden_states, b.hidden_states, strict=True))
    n = 20
    with fast_path(False), packing(False):
        expected = generate(model, prompt, n).tokens
    with packing(False):
        assert generate(model, prompt, n).tokens == expected


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_packed_weights_round_like_f_linear(shape):
    """decoding/linear.py's packed products (the default on a CPU) differ from F.linear's only in rounding:
    the same logits to 1e-4 over prefill, chains and tree verification, and the same greedy decode."""
    model = tiny_lm(shape, seed=6)
    vocab = model.config.vocab_size
    rng = random.Random(12)
    prompt = random_prompt(rng, vocab, length=120)
    tree = oracle_tree(model, 3, 4, vocab, rng)(DraftContext(torch.tensor(prompt), 4, Sampling(), None, None))
    logits = {}
    for packed in (False, True):
        cache = new_cache(model)
        with torch.no_grad(), packing(packed):
            prefill = run_model(model, cache, torch.tensor(prompt)[None]).logits
            verify = forward(model, torch.tensor([1] + tree.tokens), cache, tree, (0,))[0]
            logits[packed] = prefill, verify
    assert id(model.lm_head.weight) in linear._packed  # the packed kernel ran
    for plain, packed in zip(logits[False], logits[True], strict=True):
        torch.testing.assert_close(packed, plain, rtol=0, atol=1e-4)
    with packing(False):
        expected = generate(model, prompt, 24).tokens
    assert generate(model, prompt, 24).tokens == expected


def test_eos_inside_an_accepted_draft_stops_there():
    target = tiny_target("qwen3-gqa", seed=5)
    prompt = [1, 2, 3]
    free = generate(target.model, prompt, 16).tokens
    eos = free[5]
    first = free.index(eos)
    target_eos = frozenset({eos})
    expected = generate(target.model, prompt, 16, eos_ids=target_eos)
    assert expected.tokens == free[:first + 1] and expected.stop_reason == "eos"
    drafter = ScriptedDrafter(lambda ctx: DraftTree.chain(free[len(ctx.tokens) - 3:][:8], "t"))
    got = generate(target.model, prompt, 16, eos_ids=target_eos, drafter=drafter, controller=FixedController(8))
    assert got.tokens == expected.tokens and got.stop_reason == "eos"


def test_max_new_tokens_inside_an_accepted_draft():
    target = tiny_target("qwen3-gqa", seed=6)
    prompt = [4, 4, 4]
    free = generate(target.model, prompt, 20).tokens
    drafter = ScriptedDrafter(lambda ctx: DraftTree.chain(free[len(ctx.tokens) - 3:][:8], "t"))
    for n in (1, 3, 7):
        got = generate(target.model, prompt, n, drafter=drafter, controller=FixedController(8))
        assert got.tokens == free[:n]
        assert got.steps == 1


def test_per_position_counts():
    target = tiny_target("qwen3-gqa", seed=8)
    prompt = [9, 8, 7]
    free = generate(target.model, prompt, 30).tokens

    def half_right(ctx):
        done = len(ctx.tokens) - 3
        return DraftTree.chain(free[done:done + 2] + [0, 0], "t")  # two right, then wrong tokens

    got = generate(target.model, prompt, 30, drafter=ScriptedDrafter(half_right), controller=FixedController(4))
    assert got.tokens == free
    assert got.steps == 10 and got.accept_by_position == [10, 10]  # every step accepts two, then a wrong token
    assert got.drafted == 4 * got.steps and got.accepted == 2 * got.steps


@pytest.mark.parametrize("tokens, expected", [
    ([1, 2, 3, 9, 9, 1, 2, 3, 7, 5, 1, 2, 3], [7, 5, 1, 2]),  # the latest occurrence, a full draft after it
    ([4, 1, 2, 1, 2, 1, 2, 1, 2], [1, 2, 1, 2]),  # a repetitive tail: the latest full one, not the one at the end
    ([1, 2, 8, 1, 2], [8, 1, 2]),  # no full draft anywhere: the longest there is
    ([5, 6, 7], []),  # no earlier occurrence of any suffix
])
def test_ngram_draft_choice(tokens, expected):
    drafter = NgramDrafter(NgramOptions(max_ngram=3, num_pred_tokens=4))
    ctx = DraftContext(torch.tensor(tokens), 4, Sampling(), None, FixedController(4))
    assert drafter.propose(ctx).tokens == expected
