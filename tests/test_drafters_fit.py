"""Every learned method fits what it was trained on: trained to memorisation on a few of a tiny target's
greedy answers, it drafts them back through the real decode loop with near-perfect acceptance.

A wrong feature layer, a position off by one, or a mask that hides from drafting what training saw
(or shows training what drafting cannot see) leaves a drafter that learns its loss and still misses
its own training answers; this catches such a silent bug where a benchmark would only show a low tau.
Each method runs with its whole vocabulary and with a reduced draft vocabulary, in float32 and, where the
CPU multiplies it natively, with the products in bfloat16 as `specbench prepare` trains there.
"""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.decode import generate
from specbench.decoding.linear import bf16_native
from specbench.decoding.target import fingerprint
from specbench.methods.controllers import FixedController
from specbench.methods.drafter_config import read_drafter_config
from specbench.methods.knobs import make_options
from specbench.methods.registry import definition, definitions
from specbench.training.held_out import plateaued
from specbench.training.trainer import train
from tests.helpers import distill_sequences, tiny_target

# knobs that draft a chain of 4 (trees of width 1): acceptance then reads position by position
CHAINS = {"eagle": {"depth": 4, "top_k": 1, "total_tokens": 4, "ttt_steps": 4},
          "mtp": {"n_modules": 4, "branching": "1", "entropy_threshold": 100.0},
          "dflash": {"block_size": 5, "context_window": 0},
          "dspark": {"block_size": 4, "context_window": 0, "confidence_threshold": 0.0}}


@pytest.mark.parametrize(("draft_vocab", "bf16"), [(0, False), (48, False), (48, True)],
                         ids=["whole-vocabulary", "draft-vocabulary", "draft-vocabulary-bf16"])
@pytest.mark.parametrize("strategy", sorted(CHAINS))
def test_a_drafter_fits_the_answers_it_was_trained_on(strategy, draft_vocab, bf16, tmp_path):
    if bf16 and not bf16_native(torch.device("cpu")):
        pytest.skip("this CPU has no native bfloat16 products (AVX512-BF16 or AMX): prepare trains in float32 here")
    target = tiny_target("qwen3-gqa", seed=1)
    with torch.no_grad():  # next-token distributions as peaked as a trained model's (the greedy answers unchanged)
        target.model.lm_head.weight.mul_(4.0)
    options = make_options(strategy, {**CHAINS[strategy], "draft_vocab": draft_vocab})
    method = definition(strategy)
    torch.manual_seed(0)
    model = method.trainable(target, options)
    sequences = distill_sequences(target, tuple(model.hidden_layers), 4, prompt_len=6, answer_len=24)
    train(model, sequences, tmp_path / "drafter", strategy, fingerprint(target.model), steps=400, batch_size=4,
          lr=1e-2, bf16=bf16)
    drafter = method.build(target, options, tmp_path / "drafter")
    drafts = first_accepted = tokens = steps = 0
    for s in sequences:
        prompt = s.input_ids[:s.answer_start].tolist()
        plain = generate(target.model, prompt, 24)
        got = generate(target.model, prompt, 24, drafter=drafter, controller=FixedController(4))
        assert got.tokens == plain.tokens
        drafts, first_accepted = drafts + got.drafts, first_accepted + got.accept_by_position[0]
        tokens, steps = tokens + len(got.tokens), steps + got.steps
    assert first_accepted / drafts >= 0.9, f"first-position acceptance {first_accepted / drafts:.2f}"
    assert tokens / steps >= 3.5, f"tau {tokens / steps:.2f} of at most 5"


@pytest.mark.parametrize("strategy", sorted(n for n, d in definitions().items() if d.trainable is not None))
def test_a_fresh_drafter_lives_where_its_target_does(strategy):
    """Training starts on the target's device and dtype (a float64 target stands in for a GPU one: the same
    `.to(device, dtype)` moves both)."""
    target = tiny_target("llama-mha", seed=1)  # the draft LM is cut from a Llama-shaped target
    target.model.double()
    model = definition(strategy).trainable(target, make_options(strategy, {}))
    floating = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    assert floating and all(t.dtype == torch.float64 and t.device == target.device for t in floating)


def small_dflash():
    """A tiny target, an untrained DFlash drafter for it and its options, and two sequences to train on."""
    target = tiny_target("qwen3-gqa", seed=1)
    options = make_options("dflash", {"block_size": 3})
    model = definition("dflash").trainable(target, options)
    return target, options, model, distill_sequences(target, tuple(model.hidden_layers), 2, prompt_len=4,
                                                     answer_len=8)


def test_training_hands_the_drafter_as_it_stands_to_its_evaluation(tmp_path):
    """Every `evaluate_every` steps and at the end the trainer saves the drafter where it can be loaded and
    decoded (held-out acceptance); the last one is the finished drafter itself."""
    target, options, model, sequences = small_dflash()
    seen = []

    def evaluate(step, drafter_dir):
        drafter = definition("dflash").build(target, options, drafter_dir)
        seen.append((step, drafter_dir, generate(target.model, [1, 2, 3], 4).tokens ==
                     generate(target.model, [1, 2, 3], 4, drafter=drafter, controller=FixedController(2)).tokens))

    train(model, sequences, tmp_path / "drafter", "dflash", fingerprint(target.model), steps=4, batch_size=2,
          evaluate=evaluate, evaluate_every=2)
    assert [(step, same) for step, _, same in seen] == [(2, True), (4, True)]
    assert seen[-1][1] == tmp_path / "drafter" and not (tmp_path / "drafter.partial").exists()


def test_training_ends_at_a_plateau_of_held_out_acceptance(tmp_path):
    """An evaluation that answers False ends the training there: the drafter is saved with the steps it had,
    and is not evaluated again; the plateau rule reads the held-out taus."""
    target, _, model, sequences = small_dflash()
    seen = []

    def evaluate(step, drafter_dir):
        seen.append(step)
        return step < 4

    losses = train(model, sequences, tmp_path / "drafter", "dflash", fingerprint(target.model), steps=10,
                   batch_size=2, evaluate=evaluate, evaluate_every=2)
    assert seen == [2, 4] and len(losses) == 4
    assert read_drafter_config(tmp_path / "drafter")["training"]["steps"] == 4
    assert not plateaued([1.5, 1.6], 2) and not plateaued([1.5, 1.6, 1.7, 1.8], 2)
    assert plateaued([1.5, 1.8, 1.81, 1.79], 2) and not plateaued([1.5, 1.8, 1.79, 1.83], 2)
