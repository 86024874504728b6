"""EAGLE drafter: lossless through the engine, the EAGLE-2 tree, drafting = training, training and loading."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

import specbench.methods.base as base
import specbench.methods.eagle as eagle
from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.model_source import KNOWN_MODELS
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import Target
from specbench.methods.build import build_strategy
from specbench.methods.controllers import FixedController, HeuristicController
from specbench.methods.eagle import EagleDrafter, EagleModel, EagleOptions, eagle_tree, feature_layers
from specbench.methods.names import parse_strategy
from specbench.methods.published.formats import open_source
from tests.helpers import (
    TINY_SHAPES,
    Spy,
    always,
    chi_square_pvalue,
    cut_steps_with_eos_and_length_inside_drafts,
    one_batch,
    random_prompt,
    record_drafting,
    small_vocab_target,
    tiny_target,
    train_to_memorisation,
)


def random_drafter(target: Target, options: EagleOptions, seed: int = 0) -> EagleDrafter:
    torch.manual_seed(seed)
    return EagleDrafter(EagleModel.for_target(target, options), options)


def test_options_are_validated():
    assert (EagleOptions().depth, EagleOptions().top_k, EagleOptions().total_tokens) == (5, 8, 48)
    for bad in ({"depth": 0}, {"top_k": 0}, {"total_tokens": 0}, {"depth": 33}, {"top_k": 65}):
        with pytest.raises(SpecbenchError):
            EagleOptions(**bad)


def test_feature_layers_low_mid_high():
    assert feature_layers(9) == (2, 4, 7)
    assert feature_layers(32) == (2, 16, 30)
    assert feature_layers(2) == (1, 1, 2)
    assert feature_layers(1) == (1, 1, 1)


def test_state_dict_holds_only_drafter_weights():
    target = tiny_target("llama-mha")
    model = EagleModel.for_target(target)
    assert model.hidden_layers == feature_layers(target.model.config.num_hidden_layers)
    assert not any(k.startswith(("target", "model.")) for k in model.state_dict())
    assert model.state_dict()["fc.weight"].shape == (64, 3 * 64)
    assert sum(p.numel() for p in model.parameters()) == sum(v.numel() for v in model.state_dict().values())


def reference_tree(root: list[float], table: dict[int, list[float]], depth: int, top_k: int, total: int):
    """EAGLE-2 selection written out plainly: {token path: score} of the kept nodes."""
    logp = {t: torch.tensor(v).log_softmax(-1).tolist() for t, v in table.items()}
    pool = []  # (score, path)
    frontier = [(0.0, (), torch.tensor(root).log_softmax(-1).tolist())]
    for level in range(1, depth + 1):
        candidates = []
        for score, path, dist in frontier:
            for token in sorted(range(len(dist)), key=lambda t: -dist[t])[:top_k]:
                candidates.append((score + dist[token], path + (token,)))
        pool += candidates
        best = sorted(candidates, key=lambda c: -c[0])[:top_k]
        frontier = [(score, path, logp[path[-1]]) for score, path in best]
    return {path: score for score, path in sorted(pool, key=lambda c: (-c[0], len(c[1])))[:total]}


@pytest.mark.parametrize("depth,top_k,total", [(3, 2, 5), (4, 3, 12), (2, 4, 100), (5, 1, 3)])
def test_eagle2_tree_selection(depth, top_k, total):
    gen = torch.Generator().manual_seed(depth * 10 + top_k)
    vocab = 7
    root = (torch.randn(vocab, generator=gen) * 2).tolist()
    table = {t: (torch.randn(vocab, generator=gen) * 2).tolist() for t in range(vocab)}  # logits by node token
    calls = []

    def expand(level, tokens, parents):
        calls.append((level, len(tokens)))
        return torch.tensor([table[t] for t in tokens.tolist()])

    tree = eagle_tree(torch.tensor(root), expand, depth, top_k, total, always)
    assert all(p < i for i, p in enumerate(tree.parents))  # topological
    assert all(len(kids) <= top_k for kids in tree.children())
    assert calls == [(level, top_k) for level in range(1, depth)]  # the top_k best nodes of each level expand
    paths = []
    for i, token in enumerate(tree.tokens):
        paths.append((paths[tree.parents[i]] if tree.parents[i] >= 0 else ()) + (token,))
    expected = reference_tree(root, table, depth, top_k, total)
    assert set(paths) == set(expected)
    scores = [expected[p] for p in paths]
    assert scores == sorted(scores, reverse=True)  # best first


def test_tree_respects_keep_drafting():
    tree = eagle_tree(torch.randn(9), lambda level, tokens, parents: torch.randn(len(tokens), 9), 5, 3, 40,
                      lambda depth, logits: depth < 2)
    assert max(tree.depths()) == 2


def test_a_tree_over_a_draft_vocabulary_is_the_tree_over_the_targets():
    """Searched over the draft ids and mapped back, the tree is the one searched over the target's whole
    vocabulary with -inf outside the draft ids."""
    gen = torch.Generator().manual_seed(5)
    vocab, ids = 20, torch.tensor([7, 2, 19, 11, 4, 0])
    table = {t: torch.randn(len(ids), generator=gen) * 2 for t in range(vocab)}  # draft logits by node token

    def widen(logits: torch.Tensor) -> torch.Tensor:
        out = logits.new_full((*logits.shape[:-1], vocab), float("-inf"))
        out[..., ids] = logits
        return out

    def expand(level, tokens, parents):
        return torch.stack([table[t] for t in tokens.tolist()])

    root = torch.randn(len(ids), generator=gen)
    compact = eagle_tree(root, expand, 4, 3, 12, always, draft_ids=ids)
    wide = eagle_tree(widen(root), lambda *a: widen(expand(*a)), 4, 3, 12, always)
    assert (compact.tokens, compact.parents) == (wide.tokens, wide.parents)
    assert set(compact.tokens) <= set(ids.tolist())


def test_no_further_level_below_unlikely_paths():
    flat, peaked = torch.zeros(9), torch.tensor([9.0] + [0.0] * 8)  # best path probability 1/9, then ~0.99
    expand = lambda level, tokens, parents: peaked.repeat(len(tokens), 1)  # noqa: E731
    assert max(eagle_tree(flat, expand, 5, 2, 20, always, expand_above=0.2).depths()) == 1
    assert max(eagle_tree(peaked, expand, 5, 2, 20, always, expand_above=0.2).depths()) == 5
    assert max(eagle_tree(flat, expand, 5, 2, 20, always).depths()) == 5  # 0: always to the depth


def test_drafts_in_bfloat16_beside_a_float32_target_where_the_cpu_multiplies_it(monkeypatch):
    target = tiny_target("qwen3-gqa", seed=1)
    monkeypatch.setattr(base, "bf16_native", lambda device: True)
    monkeypatch.setattr(base, "onednn", lambda dtype: True)
    assert base.drafting_dtype(target) == torch.bfloat16
    monkeypatch.setattr(base, "bf16_native", lambda device: False)  # an AVX2-only CPU
    assert base.drafting_dtype(target) == torch.float32


def test_a_bfloat16_drafter_keeps_greedy_decoding_exact():
    target = tiny_target("qwen3-gqa", seed=3)
    options = EagleOptions(depth=3, top_k=2, total_tokens=5, draft_vocab=60)
    torch.manual_seed(3)
    drafter = EagleDrafter(EagleModel.for_target(target, options).to(torch.bfloat16), options)
    rng = random.Random(3)
    for _ in range(4):
        prompt = random_prompt(rng, 97, length=rng.randint(2, 20))
        expected = generate(target.model, prompt, 12)
        assert generate(target.model, prompt, 12, drafter=drafter, controller=FixedController(3)).tokens == \
            expected.tokens
    assert drafter.last.dtype == torch.bfloat16


def test_budget_limits_the_depth():
    target = tiny_target("qwen3-gqa", seed=2)
    spy = Spy(random_drafter(target, EagleOptions(depth=5, top_k=3, total_tokens=30)))
    generate(target.model, [1, 2, 3, 4], 6, drafter=spy, controller=FixedController(2))
    assert spy.trees and all(max(t.depths()) == 2 for t in spy.trees)
    assert all(len(t) <= 30 for t in spy.trees)


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_greedy_identity_random_prompts(shape):
    """An untrained drafter: the output is plain greedy decoding, EOS and length limits included."""
    rng = random.Random(sum(map(ord, shape)))
    vocab = TINY_SHAPES[shape][2]
    for seed in range(2):
        target = tiny_target(shape, seed=seed, eos=rng.randrange(vocab))
        drafters = [(random_drafter(target, EagleOptions(), seed), FixedController(5)),
                    (random_drafter(target, EagleOptions(depth=3, top_k=2, total_tokens=5), seed),
                     HeuristicController(3))]
        for _ in range(4):
            prompt = random_prompt(rng, vocab, length=rng.choice([1, 2, rng.randint(3, 30)]))
            n = rng.randint(1, 16)
            expected = generate(target.model, prompt, n, eos_ids=target.eos_ids)
            for drafter, controller in drafters:
                got = generate(target.model, prompt, n, eos_ids=target.eos_ids, drafter=drafter,
                               controller=controller)
                assert got.tokens == expected.tokens, (prompt, n)
                assert got.stop_reason == expected.stop_reason


def test_drafting_computes_what_training_trains(monkeypatch):
    """Step after step, every drafted node's logits equal the training-time-test logits for its token path."""
    target = tiny_target("qwen3-gqa", seed=4)
    options = EagleOptions(depth=4, top_k=2, total_tokens=6)
    drafter = random_drafter(target, options, seed=4)
    model = drafter.model
    model.ttt_steps = options.depth
    prompt = random_prompt(random.Random(4), 97, length=9)
    records = record_drafting(monkeypatch, eagle, "eagle_tree", drafter, target, prompt, 10, FixedController(4))
    assert len({tuple(tokens) for tokens, _, _ in records}) >= 3 and len(records) >= 3 * (1 + 2 + 2 + 2)
    with torch.inference_mode():
        for tokens, path, logits in records:
            outs = model.unroll(one_batch(target.model, tokens + list(path), model.hidden_layers))
            expected = model.logits(outs[len(path)][0, len(tokens) - 2 + len(path)])
            torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_to_memorisation(tmp_path_factory, "eagle", EagleModel.for_target, steps=120)


def test_training_loss_falls(trained):
    *_, losses = trained
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10


def test_drafter_directory_round_trip(trained):
    target, model, sequences, out, _ = trained
    options = EagleOptions(depth=4, top_k=3, total_tokens=12)
    loaded = eagle.STRATEGY.build(target, options, out)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value.to(torch.bfloat16).float())
    prompt = sequences[0].input_ids[:sequences[0].answer_start].tolist()
    expected = generate(target.model, prompt, 20)
    got = generate(target.model, prompt, 20, drafter=loaded, controller=FixedController(4))
    assert got.tokens == expected.tokens
    assert got.steps <= len(got.tokens) // 2  # it learnt the answers it was trained on
    with pytest.raises(SpecbenchError, match="another target"):
        eagle.STRATEGY.build(tiny_target("qwen3-gqa", seed=2), options, out)
    with pytest.raises(SpecbenchError, match="--drafter"):
        eagle.STRATEGY.build(target, options, None)


def test_eos_and_length_inside_an_accepted_draft(trained):
    target, model, sequences, *_ = trained
    drafter = EagleDrafter(model, EagleOptions(depth=5, top_k=2, total_tokens=10))
    assert cut_steps_with_eos_and_length_inside_drafts(target, drafter, sequences, k=5) >= 8


def test_sampling_distribution_is_exact():
    """Temperature sampling through EAGLE drafts has the target's own distribution (chi-square)."""
    target = small_vocab_target()
    options = EagleOptions(depth=2, top_k=3, total_tokens=6)
    drafter = random_drafter(target, options)
    p, accepted = chi_square_pvalue(target.model, [3, 1, 4], Sampling(temperature=0.9), 1200,
                                    lambda: (drafter, FixedController(2)))
    assert sum(accepted) > 1200 // 4  # drafts were accepted often: acceptance is tested, not plain sampling
    assert p > 0.001


def test_a_drafter_carries_its_drafting_knobs_under_the_users(default_target, tmp_path):
    shutil.copytree(KNOWN_MODELS["default"].drafter_dir("eagle"), tmp_path / "eagle")
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    config["drafting"] = {"depth": 3, "top_k": 1, "total_tokens": 3}
    (tmp_path / "eagle" / "config.json").write_text(json.dumps(config))

    def knobs(given: dict, sources: dict) -> dict:
        strategy = build_strategy(parse_strategy("eagle"), default_target, {"eagle": given}, sources)
        return {k: strategy.drafter_sources["eagle"]["knobs"][k] for k in ("depth", "top_k", "total_tokens")}

    source = {"eagle": open_source(tmp_path / "eagle")}
    assert knobs({}, source) == {"depth": 3, "top_k": 1, "total_tokens": 3}
    assert knobs({"depth": 2}, source) == {"depth": 2, "top_k": 1, "total_tokens": 3}
    assert knobs({}, {}) == {"depth": 5, "top_k": 8, "total_tokens": 48}  # the embedded model's carries none
