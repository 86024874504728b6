"""EAGLE drafter: lossless through the engine, the EAGLE-2 tree, drafting = training, training and loading."""

from __future__ import annotations

import random

import pytest
import torch
from scipy.stats import chisquare
from transformers import Qwen3Config, Qwen3ForCausalLM

import specbench.strategies.eagle as eagle
from specbench.engine.decode import generate
from specbench.engine.sampling import Sampling
from specbench.errors import SpecbenchError
from specbench.models import Target, fingerprint
from specbench.strategies.controllers import FixedController, HeuristicController
from specbench.strategies.eagle import EagleDrafter, EagleModel, EagleOptions, eagle_tree, feature_layers
from specbench.strategies.trainable import DistillBatch
from specbench.training.distill import DistillSequence
from specbench.training.trainer import train
from tests.conftest import TINY_SHAPES, tiny_target
from tests.test_engine import random_prompt


@pytest.fixture(autouse=True)
def one_thread():
    # these tensors are tiny: on a shared 2-core machine a second thread costs more than it gains
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Spy:
    """Wraps a drafter and records every tree it proposes and every outcome it observes."""

    def __init__(self, drafter):
        self.drafter, self.name, self.hidden_layers = drafter, drafter.name, drafter.hidden_layers
        self.contexts, self.trees, self.outcomes = [], [], []

    def start(self, prompt, hidden):
        self.drafter.start(prompt, hidden)

    def propose(self, ctx):
        self.contexts.append(ctx.tokens.tolist())
        self.trees.append(self.drafter.propose(ctx))
        return self.trees[-1]

    def observe(self, outcome):
        self.outcomes.append(outcome)
        self.drafter.observe(outcome)

    def state_bytes(self) -> int:
        return self.drafter.state_bytes()

    def cut_steps(self) -> int:
        """Steps whose accepted path went past what was committed (EOS or length inside the draft)."""
        return sum(len(o.committed) < len(o.path) + 1 for o in self.outcomes)


def always(depth, logits) -> bool:
    return True


def record_drafting(monkeypatch, module, tree_function: str, drafter, target: Target, prompt: list[int],
                    new_tokens: int, controller) -> list[tuple[list[int], tuple[int, ...], torch.Tensor]]:
    """Generate through `drafter`, recording (committed tokens, token path, draft logits after the path)
    for every node the drafter ran: each step's root, then every node it expanded."""
    spy = Spy(drafter)
    records = []
    tree = getattr(module, tree_function)

    def recording_tree(root_logits, expand, *args):
        tokens = spy.contexts[-1]
        records.append((tokens, (), root_logits))
        paths = [()]

        def recording_expand(level, nodes, parents):
            nonlocal paths
            paths = [paths[p] + (t,) for t, p in zip(nodes.tolist(), parents.tolist())]
            logits = expand(level, nodes, parents)
            records.extend((tokens, path, row) for path, row in zip(paths, logits))
            return logits

        return tree(root_logits, recording_expand, *args)

    monkeypatch.setattr(module, tree_function, recording_tree)
    generate(target.model, prompt, new_tokens, drafter=spy, controller=controller)
    return records


def hidden_states(model, ids: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """(len(layers) + 1, T, H) float32: the requested layers, then the final normed state."""
    with torch.inference_mode():
        states = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.stack([states[i][0] for i in layers] + [states[-1][0]]).clone()


def distill_sequences(target: Target, layers: tuple[int, ...], count: int, answer: int,
                      seed: int = 0) -> list[DistillSequence]:
    """What training.distill.collect makes, without a tokenizer: random prompts, the target's greedy answers."""
    rng = random.Random(seed)
    vocab = target.model.config.vocab_size
    sequences = []
    for _ in range(count):
        prompt = [rng.randrange(vocab) for _ in range(6)]
        ids = prompt + generate(target.model, prompt, answer).tokens
        sequences.append(DistillSequence(torch.tensor(ids), len(prompt),
                                         hidden_states(target.model, ids, layers).to(torch.bfloat16)))
    return sequences


def one_batch(model, ids: list[int], layers: tuple[int, ...]) -> DistillBatch:
    """A float32 batch of one sequence (no bfloat16 rounding, unlike make_batch)."""
    ones = torch.ones(1, len(ids), dtype=torch.bool)
    return DistillBatch(torch.tensor([ids]), hidden_states(model, ids, layers)[None], ones, ones)


def small_vocab_target(vocab: int = 12, seed: int = 0) -> Target:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, initializer_range=0.15,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    return Target(Qwen3ForCausalLM(config).eval(), None, f"small-vocab-{seed}", frozenset())


def first_two_token_distributions(target: Target, prompt: list[int], sampling: Sampling) -> torch.Tensor:
    """(2, V) float64: the exact distributions of the first and the second generated token."""
    vocab = target.model.config.vocab_size
    with torch.inference_mode():
        first = sampling.probs(target.model(input_ids=torch.tensor([prompt])).logits[0, -1])
        ids = torch.cat([torch.tensor(prompt).repeat(vocab, 1), torch.arange(vocab)[:, None]], 1)
        second = sampling.probs(target.model(input_ids=ids).logits[:, -1])
    exact = torch.stack([first, (first[:, None] * second).sum(0)]).double()
    return exact / exact.sum(-1, keepdim=True)


def check_distribution(target: Target, prompt: list[int], drafter, controller, runs: int) -> None:
    """Chi-square tests of the first and second sampled tokens against the exact distributions."""
    sampling = Sampling(temperature=0.9)
    exact = first_two_token_distributions(target, prompt, sampling)
    counts = torch.zeros_like(exact)
    accepted = 0
    for seed in range(runs):
        got = generate(target.model, prompt, 2, sampling=sampling, drafter=drafter, controller=controller(), seed=seed)
        counts[0, got.tokens[0]] += 1
        counts[1, got.tokens[1]] += 1
        accepted += got.accepted
    assert accepted > runs // 4  # drafts were accepted often: acceptance is tested, not plain sampling
    for observed, expected in zip(counts, exact * runs):
        big = expected >= 5  # chi-square needs expected counts of at least 5: pool the rest
        if not big.all():
            observed = torch.cat([observed[big], observed[~big].sum()[None]])
            expected = torch.cat([expected[big], expected[~big].sum()[None]])
        assert chisquare(observed.numpy(), expected.numpy()).pvalue > 0.001


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


def train_to_memorisation(tmp_path_factory, strategy: str, new_model, steps: int):
    """A drafter trained (to memorisation) on four greedy answers of a tiny target, and saved:
    (target, model, sequences, drafter directory, losses)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module scope: set up before the autouse one_thread
    target = tiny_target("qwen3-gqa", seed=1)
    torch.manual_seed(0)
    model = new_model(target)
    sequences = distill_sequences(target, model.hidden_layers, count=4, answer=24)
    out = tmp_path_factory.mktemp(strategy) / "drafter"
    losses = train(model, sequences, out, strategy, fingerprint(target.model), steps=steps, batch_size=4, lr=1e-2)
    torch.set_num_threads(threads)
    return target, model, sequences, out, losses


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


def cut_steps_with_eos_and_length_inside_drafts(target: Target, drafter, sequences, k: int) -> int:
    """EOS and max_new_tokens falling inside accepted drafts of a trained drafter: outputs equal plain
    decoding; returns how many steps were actually cut inside a draft (tests assert it happened)."""
    cut = 0
    for sequence in sequences:
        prompt = sequence.input_ids[:sequence.answer_start].tolist()
        answer = sequence.input_ids[sequence.answer_start:].tolist()
        for eos in (answer[3], answer[8]):
            eos_ids = frozenset({eos})
            expected = generate(target.model, prompt, 24, eos_ids=eos_ids)
            spy = Spy(drafter)
            got = generate(target.model, prompt, 24, eos_ids=eos_ids, drafter=spy, controller=FixedController(k))
            assert (got.tokens, got.stop_reason) == (expected.tokens, "eos")
            cut += spy.cut_steps()
        for n in (2, 5, 11):
            spy = Spy(drafter)
            assert generate(target.model, prompt, n, drafter=spy, controller=FixedController(k)).tokens == answer[:n]
            cut += spy.cut_steps()
    return cut


def test_eos_and_length_inside_an_accepted_draft(trained):
    target, model, sequences, *_ = trained
    drafter = EagleDrafter(model, EagleOptions(depth=5, top_k=2, total_tokens=10))
    assert cut_steps_with_eos_and_length_inside_drafts(target, drafter, sequences, k=5) >= 8


def test_sampling_distribution_is_exact():
    """Temperature sampling through EAGLE drafts has the target's own distribution (chi-square)."""
    target = small_vocab_target()
    options = EagleOptions(depth=2, top_k=3, total_tokens=6)
    drafter = random_drafter(target, options)
    check_distribution(target, [3, 1, 4], drafter, lambda: FixedController(2), runs=1200)
