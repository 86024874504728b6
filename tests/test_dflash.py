"""DFlash: lossless decoding with untrained and trained block drafters, the context window, sampling
exactness, training and the drafter directory."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import Qwen3Config, Qwen3ForCausalLM

from specbench.engine.decode import generate
from specbench.engine.protocol import DraftContext, StepOutcome
from specbench.engine.sampling import Sampling
from specbench.engine.tree import DraftTree
from specbench.errors import SpecbenchError
from specbench.models import Target, fingerprint
from specbench.strategies.controllers import EntropyController, FixedController, HeuristicController
from specbench.strategies.dflash import STRATEGY, DFlashDrafter, DFlashOptions, context_layers
from specbench.strategies.drafter_dir import read_drafter_config
from specbench.training.distill import DistillSequence, make_batch
from specbench.training.trainer import train
from tests.conftest import TINY_SHAPES, tiny_target


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: OpenMP threads cost more than they give, and far more on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_prompt(rng: random.Random, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(rng.choice([1, 2, 3, rng.randint(4, 30)]))]


@torch.inference_mode()
def distill_sequences(target: Target, layers: tuple[int, ...], count: int, seed: int = 0,
                      prompt_len: int = 8, answer_len: int = 40) -> list[DistillSequence]:
    """What distill.collect makes, without a tokenizer: random prompts and the target's greedy answers."""
    rng = random.Random(seed)
    vocab = target.model.config.vocab_size
    sequences = []
    for _ in range(count):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        ids = torch.tensor(prompt + generate(target.model, prompt, answer_len).tokens)
        states = target.model(input_ids=ids[None], output_hidden_states=True).hidden_states
        hidden = torch.stack([states[i][0] for i in layers] + [states[-1][0]]).to(torch.bfloat16)
        sequences.append(DistillSequence(ids, prompt_len, hidden))
    return sequences


class Recorder(FixedController):
    """A fixed controller that remembers how many drafts each verification accepted."""

    def __init__(self, k: int):
        super().__init__(k)
        self.accepted: list[int] = []

    def update(self, drafted: int, accepted: int) -> None:
        self.accepted.append(accepted)


def inside_accepted_drafts(accepted: list[int]) -> list[int]:
    """Output indices committed as accepted drafts, each followed in its step by at least the bonus token."""
    inside, done = [], 0
    for a in accepted:
        inside.extend(range(done, done + a))
        done += a + 1
    return inside


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
                prompt, n = random_prompt(rng, vocab), rng.randint(1, 24)
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


def check_blocks_match_inference(drafter_cls, options) -> None:
    """The training forward (all blocks at once, masked) equals the decode-time forward (cached window)."""
    target = tiny_target("llama-mha", seed=4)
    model = drafter_cls.model_cls.for_target(target, options).eval()
    sequence = distill_sequences(target, model.hidden_layers, 1, seed=4)[0]
    batch = make_batch([sequence], 64, torch.device("cpu"))
    anchors = torch.tensor([[9, 14, 20]])
    with torch.inference_mode():
        training = model.blocks(batch, anchors, torch.ones_like(anchors, dtype=torch.bool)).hidden[0]
    ids = sequence.input_ids
    features = batch.hidden[0, :-1].permute(1, 0, 2).flatten(1)  # (T, L*H), as the target would deliver them
    drafter = drafter_cls(model, options)
    per_layer = model.config.arch.hidden_size
    size, window = options.block_size, options.context_window
    for i, a in enumerate(anchors[0].tolist()):
        # the context arrives in two pieces, as the prefill and one verification deliver it
        drafter.start(ids[:a - 2], features[:a - 3].split(per_layer, -1))
        drafter.observe(StepOutcome(DraftTree(), [], 0, [], features[a - 3:a].split(per_layer, -1)))
        with torch.inference_mode():
            drafter._absorb()
            assert drafter.context[0][0].shape[-2] == (min(a, window) if window else a)
            x = model.block_inputs(ids[None, a:a + 1], size)
            decoded = model(x, torch.arange(a, a + size)[None], drafter.context)[0, model.first_draft_slot:]
        torch.testing.assert_close(decoded, training[i], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [0, 5])
def test_training_blocks_match_inference(window):
    check_blocks_match_inference(DFlashDrafter, DFlashOptions(block_size=4, context_window=window))


def small_vocab_target(vocab: int = 10, seed: int = 0) -> Target:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                         initializer_range=0.1, tie_word_embeddings=False, attn_implementation="sdpa")
    return Target(Qwen3ForCausalLM(config).eval(), None, f"small-vocab-{seed}", frozenset())


@torch.inference_mode()
def exact_first_two(model, prompt: list[int], sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's exact distributions of the first and the second generated token."""
    ids = torch.tensor(prompt)
    p1 = sampling.probs(model(input_ids=ids[None]).logits[0, -1])
    vocab = len(p1)
    both = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
    p2 = p1 @ sampling.probs(model(input_ids=both).logits[:, -1])
    return p1, p2


def assert_matches(counts: np.ndarray, probs: torch.Tensor) -> None:
    """Chi-square goodness of fit, cells with an expected count under 5 pooled."""
    expected = probs.double().numpy()
    expected *= counts.sum() / expected.sum()
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    assert chisquare(observed, expected).pvalue > 0.001, (observed, expected)


def sampled_first_two(target: Target, drafter, sampling: Sampling, prompt: list[int], runs: int, budget: int):
    vocab = target.model.config.vocab_size
    counts = np.zeros((2, vocab))
    accepted = []
    for seed in range(runs):
        got = generate(target.model, prompt, 2, sampling=sampling, drafter=drafter,
                       controller=FixedController(budget), seed=seed)
        counts[0, got.tokens[0]] += 1
        counts[1, got.tokens[1]] += 1
        accepted.append(got.accepted)
    return counts, accepted


def test_sampling_is_exact():
    """At temperature > 0 the first two tokens follow the target's exact distributions."""
    target = small_vocab_target()
    sampling = Sampling(temperature=1.0)
    prompt = [1, 2, 3]
    drafter = DFlashDrafter.untrained(target, DFlashOptions(block_size=4, layers=1), seed=1)
    counts, accepted = sampled_first_two(target, drafter, sampling, prompt, runs=2000, budget=3)
    p1, p2 = exact_first_two(target.model, prompt, sampling)
    assert 0 < sum(a > 0 for a in accepted) < len(accepted)  # drafts were accepted, and rejected
    assert_matches(counts[0], p1)
    assert_matches(counts[1], p2)


@dataclass
class Trained:
    target: Target
    sequences: list[DistillSequence]
    directory: object
    losses: list[float]
    options: object
    model: torch.nn.Module  # as trained, before the bfloat16 save


def train_tiny(strategy, options, tmp_path_factory) -> Trained:
    """A drafter trained briefly on a tiny target's own answers, saved as a drafter directory."""
    target = tiny_target("qwen3-gqa", seed=1)
    torch.manual_seed(0)
    model = strategy.trainable(target, options)
    sequences = distill_sequences(target, model.hidden_layers, 8)
    directory = tmp_path_factory.mktemp(strategy.name) / "drafter"
    losses = train(model, sequences, directory, strategy.name, fingerprint(target.model), steps=40,
                   batch_size=8, lr=3e-3, max_len=64)
    return Trained(target, sequences, directory, losses, options, model)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Trained:
    return train_tiny(STRATEGY, DFlashOptions(block_size=6, context_window=24), tmp_path_factory)


def test_training_loss_falls(trained):
    first, last = np.mean(trained.losses[:5]), np.mean(trained.losses[-5:])
    assert last < 0.6 * first, trained.losses


def check_round_trip(strategy, trained: Trained) -> None:
    """Save (done by training) and load give the same weights; another target or no directory is refused."""
    drafter = strategy.build(trained.target, trained.options, trained.directory)
    state = drafter.model.state_dict()
    saved_state = {k: v.to(torch.bfloat16).float() for k, v in trained.model.state_dict().items()}
    assert state.keys() == saved_state.keys()  # the drafter's own weights only, not the target's
    assert all(torch.equal(state[k], saved_state[k]) for k in state)
    saved = read_drafter_config(trained.directory)
    assert saved["architecture"]["target_layers"] == list(drafter.hidden_layers)
    assert saved["knobs"]["block_size"] == trained.options.block_size
    with pytest.raises(SpecbenchError, match="another target"):
        strategy.build(tiny_target("qwen3-gqa", seed=2), trained.options, trained.directory)
    with pytest.raises(SpecbenchError, match="--drafter"):
        strategy.build(trained.target, trained.options, None)


def test_drafter_directory_round_trip(trained):
    check_round_trip(STRATEGY, trained)
    head = trained.target.model.get_output_embeddings().weight
    state = STRATEGY.build(trained.target, trained.options, trained.directory).model.state_dict()
    assert not any(v.shape == head.shape for v in state.values())  # the target's weights are not saved


def check_lossless_inside_accepted_drafts(strategy, trained: Trained) -> None:
    """EOS and max_new_tokens falling inside an accepted draft stop exactly where plain decoding does."""
    target = trained.target
    drafter = strategy.build(target, trained.options, trained.directory)
    budget = strategy.budget(trained.options)
    checked_eos = checked_length = 0
    for sequence in trained.sequences[:4]:
        prompt = sequence.input_ids[:sequence.answer_start].tolist()
        free = generate(target.model, prompt, 30).tokens
        recorder = Recorder(budget)
        assert generate(target.model, prompt, 30, drafter=drafter, controller=recorder).tokens == free
        for i in [i for i in inside_accepted_drafts(recorder.accepted) if i < len(free)]:
            if free.index(free[i]) == i and checked_eos < 6:  # its first occurrence: EOS stops right there
                eos = frozenset({free[i]})
                expected = generate(target.model, prompt, 30, eos_ids=eos)
                got = generate(target.model, prompt, 30, eos_ids=eos, drafter=drafter,
                               controller=FixedController(budget))
                assert got.tokens == expected.tokens == free[:i + 1] and got.stop_reason == "eos"
                checked_eos += 1
            if checked_length < 6:
                got = generate(target.model, prompt, i + 1, drafter=drafter, controller=FixedController(budget))
                assert got.tokens == free[:i + 1] and got.stop_reason == "length"
                checked_length += 1
    assert checked_eos and checked_length  # the trained drafter did get drafts accepted


def test_trained_drafter_is_lossless_inside_accepted_drafts(trained):
    check_lossless_inside_accepted_drafts(STRATEGY, trained)
