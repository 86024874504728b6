"""MTP drafter: lossless through the engine, entropy pruning, drafting = training, training and loading."""

from __future__ import annotations

import math
import random

import pytest
import torch

import specbench.methods.mtp as mtp
from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import fingerprint
from specbench.methods.controllers import FixedController, HeuristicController
from specbench.methods.drafter_dir import save_drafter
from specbench.methods.mtp import MtpDrafter, MtpModel, MtpOptions, module_mask, mtp_tree
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

EVERYWHERE = MtpOptions(entropy_threshold=math.inf)  # untrained modules are unsure: never prune


def random_drafter(target, options: MtpOptions, seed: int = 0) -> MtpDrafter:
    torch.manual_seed(seed)
    return MtpDrafter(MtpModel.for_target(target, options), options)


def test_options_are_validated():
    options = MtpOptions()
    assert (options.n_modules, options.widths, options.entropy_threshold) == (3, (3, 2), 2.1)
    assert MtpOptions(branching=(4, 2, 1)).branching == "4,2,1"
    assert MtpOptions(branching="2").widths == (2,)
    for bad in ({"branching": "3,x"}, {"branching": "3,0"}, {"branching": ""}, {"n_modules": 0},
                {"entropy_threshold": -1.0}, {"entropy_threshold": math.nan}):
        with pytest.raises(SpecbenchError):
            MtpOptions(**bad)


def test_module_mask():
    mask = module_mask(3, 0, 5, torch.device("cpu"))  # module 3: row t sees rows up to t - 2 and itself
    assert mask.int().tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0],
                                   [1, 1, 1, 0, 1]]
    assert torch.equal(module_mask(1, 2, 3, torch.device("cpu")), torch.ones(3, 5, dtype=torch.bool).tril(2))
    assert torch.equal(module_mask(3, 3, 2, torch.device("cpu")), mask[3:])


def peaked(vocab: int, best: list[int]) -> torch.Tensor:
    """Low-entropy logits ranking `best` first."""
    logits = torch.full((vocab,), -8.0)
    logits[best] = torch.linspace(8.0, 4.0, len(best))
    return logits


def test_entropy_pruning_with_scripted_logits():
    vocab = 10
    flat = torch.zeros(vocab)  # entropy log(10) = 2.30 nats > 2.1
    # node token -> the logits of its children: tokens 1 and 5 are unsure, the rest sure
    script = {t: flat if t in (1, 5) else peaked(vocab, [(t + 1) % vocab, (t + 2) % vocab, (t + 3) % vocab])
              for t in range(vocab)}
    levels = []

    def expand(level, tokens, parents):
        levels.append((level, tokens.tolist(), parents.tolist()))
        return torch.stack([script[t] for t in tokens.tolist()])

    tree = mtp_tree(flat, expand, (3, 2), 3, 2.1, always)  # the root is flat: level 1 is proposed all the same
    level1 = tree.tokens[:3]
    assert tree.parents[:3] == [-1, -1, -1]
    assert levels[0] == (1, level1, [0, 0, 0])
    kids = tree.children()
    for i, token in enumerate(level1):
        grandkids = [tree.tokens[c] for c in kids[i + 1]]
        assert grandkids == ([] if token in (1, 5) else [(token + 1) % vocab, (token + 2) % vocab])
    assert max(tree.depths()) == 3 and len(levels) == 2
    assert all(p < i for i, p in enumerate(tree.parents))

    sure = peaked(vocab, [1, 2, 3])
    tree = mtp_tree(sure, expand, (3, 2), 3, 2.1, always)
    assert tree.tokens[:3] == [1, 2, 3]
    assert [tree.tokens[c] for c in tree.children()[1]] == []  # token 1: unsure, pruned
    assert [tree.tokens[c] for c in tree.children()[2]] == [3, 4]
    assert [tree.tokens[c] for c in tree.children()[3]] == [4, 5]
    assert tree.tokens[6] == 5 and tree.children()[7] == []  # a level-2 token 5: unsure, pruned
    assert len(tree) == 3 + 4 + 6
    assert len(mtp_tree(sure, expand, (3, 2), 3, 0.0, always)) == 3  # threshold 0 prunes everything below level 1
    assert max(mtp_tree(sure, expand, (3, 2), 3, 2.1, lambda d, logits: d < 2).depths()) == 2
    assert max(mtp_tree(sure, expand, (3, 2), 1, 2.1, always).depths()) == 1


def test_state_dict_and_config():
    target = tiny_target("qwen3-mqa")
    model = MtpModel.for_target(target, MtpOptions(n_modules=2))
    assert model.hidden_layers == (target.model.config.num_hidden_layers,)
    assert not any(k.startswith("target") for k in model.state_dict())
    assert sum(p.numel() for p in model.parameters()) == sum(v.numel() for v in model.state_dict().values())
    rebuilt = MtpModel.from_config(target.model, model.drafter_config())
    assert rebuilt.state_dict().keys() == model.state_dict().keys()
    with pytest.raises(SpecbenchError, match="n_modules"):
        MtpDrafter(model, MtpOptions(n_modules=3))


@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_greedy_identity_random_prompts(shape):
    """Untrained modules: the output is plain greedy decoding, EOS and length limits included."""
    rng = random.Random(sum(map(ord, shape)) + 1)
    vocab = TINY_SHAPES[shape][2]
    for seed in range(2):
        target = tiny_target(shape, seed=seed, eos=rng.randrange(vocab))
        drafters = [(random_drafter(target, EVERYWHERE, seed), FixedController(3)),
                    (random_drafter(target, MtpOptions(n_modules=4, branching="2,2,1", entropy_threshold=4.0), seed),
                     HeuristicController(4))]
        for _ in range(4):
            prompt = random_prompt(rng, vocab, length=rng.choice([1, 2, 3, rng.randint(4, 30)]))
            n = rng.randint(1, 16)
            expected = generate(target.model, prompt, n, eos_ids=target.eos_ids)
            for drafter, controller in drafters:
                got = generate(target.model, prompt, n, eos_ids=target.eos_ids, drafter=drafter,
                               controller=controller)
                assert got.tokens == expected.tokens, (prompt, n)
                assert got.stop_reason == expected.stop_reason


def test_budget_limits_the_depth():
    target = tiny_target("llama-mha", seed=2)
    spy = Spy(random_drafter(target, EVERYWHERE))
    generate(target.model, [1, 2, 3, 4], 6, drafter=spy, controller=FixedController(2))
    assert spy.trees and all(max(t.depths()) == 2 and len(t) == 3 + 3 * 2 for t in spy.trees)


def test_drafting_computes_what_training_trains(monkeypatch):
    """Step after step, every drafted node's logits equal the chained training logits for its token path."""
    target = tiny_target("llama-mha", seed=4)
    options = MtpOptions(n_modules=3, branching="2", entropy_threshold=math.inf)
    drafter = random_drafter(target, options, seed=4)
    model = drafter.model
    prompt = random_prompt(random.Random(5), 211, length=10)
    records = record_drafting(monkeypatch, mtp, "mtp_tree", drafter, target, prompt, 10, FixedController(3))
    assert len({tuple(tokens) for tokens, _, _ in records}) >= 3 and len(records) >= 3 * (1 + 2 + 4)
    with torch.inference_mode():
        for tokens, path, logits in records:
            outs = model.unroll(one_batch(target.model, tokens + list(path), model.hidden_layers))
            expected = model.logits(len(path), outs[len(path)][0, len(tokens) - 2])
            torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_to_memorisation(tmp_path_factory, "mtp", lambda t: MtpModel.for_target(t, MtpOptions()), steps=80)


def test_training_loss_falls(trained):
    *_, losses = trained
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10


def test_drafter_directory_round_trip(trained):
    target, model, sequences, out, _ = trained
    options = MtpOptions(n_modules=2)
    loaded = mtp.STRATEGY.build(target, options, out)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value.to(torch.bfloat16).float())
    prompt = sequences[0].input_ids[:sequences[0].answer_start].tolist()
    expected = generate(target.model, prompt, 20)
    got = generate(target.model, prompt, 20, drafter=loaded, controller=FixedController(2))
    assert got.tokens == expected.tokens
    assert got.steps <= len(got.tokens) // 2  # it learnt the answers it was trained on
    with pytest.raises(SpecbenchError, match="n_modules"):
        mtp.STRATEGY.build(target, MtpOptions(n_modules=4), out)
    with pytest.raises(SpecbenchError, match="another target"):
        mtp.STRATEGY.build(tiny_target("qwen3-gqa", seed=2), options, out)
    other = out.parent / "eagle-drafter"
    save_drafter(other, "eagle", {}, {}, fingerprint(target.model))
    with pytest.raises(SpecbenchError, match="not mtp"):
        mtp.STRATEGY.build(target, options, other)
    with pytest.raises(SpecbenchError, match="--drafter"):
        mtp.STRATEGY.build(target, options, None)


def test_eos_and_length_inside_an_accepted_draft(trained):
    target, model, sequences, *_ = trained
    drafter = MtpDrafter(model, MtpOptions())
    assert cut_steps_with_eos_and_length_inside_drafts(target, drafter, sequences, k=3) >= 8


def test_sampling_distribution_is_exact():
    """Temperature sampling through MTP drafts has the target's own distribution (chi-square)."""
    target = small_vocab_target(seed=1)
    options = MtpOptions(n_modules=2, branching="3,2", entropy_threshold=math.inf)
    drafter = random_drafter(target, options)
    p, accepted = chi_square_pvalue(target.model, [2, 7, 1], Sampling(temperature=0.9), 1200,
                                    lambda: (drafter, FixedController(2)))
    assert sum(accepted) > 1200 // 4  # drafts were accepted often: acceptance is tested, not plain sampling
    assert p > 0.001
