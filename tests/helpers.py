"""What the tests share: tiny models built locally (no download), prompts, scripted and spying drafters,
distillation for tiny drafters, the checks every drafter's tests run, exact and chi-square checks of sampling,
a fake NVML, the CLI runner and run directories with planted speedups. Test modules import from here, never
from each other; tests/conftest.py turns the models into fixtures."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import random
import sys
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pandas as pd
import psutil
import pynvml as real_pynvml
import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from typer.testing import CliRunner

from specbench.analysis.stats import paired_speedups, summarise_strategies
from specbench.cli import app
from specbench.core.errors import SpecbenchError
from specbench.core.records.serve_records import LevelKey, RequestRecord, ServeLevel
from specbench.decoding.decode import generate
from specbench.decoding.drafting import DraftContext, StepOutcome
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import Target, fingerprint
from specbench.decoding.tree import DraftTree
from specbench.decoding.verify import accept_sampling
from specbench.methods.controllers import FixedController
from specbench.methods.drafter_config import read_drafter_config
from specbench.methods.trainable import DistillBatch
from specbench.plan.run_config import RunConfig
from specbench.serving.level_stats import level_summary
from specbench.training.distill import DistillSequence, make_batch
from specbench.training.trainer import train

# -- tiny models -----------------------------------------------------------------------------------------------------


# a `vllm serve` for tests: eager (no compilation, minutes on a CPU) and a small KV cache
SMALL_SERVER = json.dumps({"kv_cache_memory_bytes": 64 << 20, "enforce_eager": True})


def vllm_servers_left() -> list[psutil.Process]:
    """This process's descendants that are `vllm serve` servers still running (an exited child not yet
    reaped, a zombie, has no command line left: it is not running)."""
    left = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            if "vllm.entrypoints" in " ".join(process.cmdline()):
                left.append(process)
    return left


TINY_SHAPES = {
    # name: (config class, model class, vocab, kv heads)
    "qwen3-gqa": (Qwen3Config, Qwen3ForCausalLM, 97, 2),
    "llama-mha": (LlamaConfig, LlamaForCausalLM, 211, 4),
    "qwen3-mqa": (Qwen3Config, Qwen3ForCausalLM, 512, 1),
}


def tiny_lm(shape: str = "qwen3-gqa", seed: int = 0, layers: int = 2, hidden: int = 64) -> torch.nn.Module:
    config_cls, model_cls, vocab, kv_heads = TINY_SHAPES[shape]
    torch.manual_seed(seed)
    config = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=kv_heads,
                        head_dim=hidden // 4, max_position_embeddings=512, initializer_range=0.3,
                        tie_word_embeddings=False, attn_implementation="sdpa")
    return model_cls(config).eval()


def tiny_target(shape: str = "qwen3-gqa", seed: int = 0, eos: int | None = None) -> Target:
    model = tiny_lm(shape, seed)
    eos_ids = frozenset({eos} if eos is not None else ())
    return Target(model, tokenizer=None, name=f"tiny-{shape}-{seed}", eos_ids=eos_ids)


def small_vocab_lm(seed: int, hidden: int = 32):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=6, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=hidden // 2, initializer_range=0.5)
    return Qwen3ForCausalLM(config).eval()


def small_vocab_target(vocab: int = 12, seed: int = 0, initializer_range: float = 0.15) -> Target:
    """A one-layer target over a vocabulary small enough to count every continuation."""
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, initializer_range=initializer_range,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    return Target(Qwen3ForCausalLM(config).eval(), None, f"small-vocab-{seed}", frozenset())

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def write_tiny_model_dir(path, vocab_text: str, hidden: int = 64, layers: int = 2, seed: int = 0, tokenizer_from=None,
                         classes=(Qwen3Config, Qwen3ForCausalLM), tie: bool = False):
    """A real on-disk HF model directory (config, safetensors, tokenizer with a chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if tokenizer_from is None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|end|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([vocab_text], trainer)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|endoftext|>")
        tokenizer.chat_template = CHAT_TEMPLATE
    else:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_from)
    torch.manual_seed(seed)
    config_cls, model_cls = classes
    config = config_cls(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=hidden // 4, max_position_embeddings=1024, initializer_range=0.3,
                        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=tie)
    model_cls(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# -- prompts and drafters for the engine's tests ---------------------------------------------------------------------


def random_prompt(rng: random.Random, vocab: int, length: int | None = None) -> list[int]:
    length = length or rng.randint(1, 24)
    motif = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
    # repeated motifs give the n-gram drafter something to find
    return [rng.choice(motif) if rng.random() < 0.5 else rng.randrange(vocab) for _ in range(length)]


def uniform_prompt(rng: random.Random, vocab: int) -> list[int]:
    """Uniformly random tokens, mostly short prompts (1 to 3 tokens) and some up to 30."""
    return [rng.randrange(vocab) for _ in range(rng.choice([1, 2, 3, rng.randint(4, 30)]))]


class ScriptedDrafter:
    """Proposes a fixed tree every step: exercises tree verification without a real drafter."""

    name = "scripted"
    hidden_layers = ()

    def __init__(self, make_tree):
        self.make_tree = make_tree

    def start(self, prompt, hidden):
        pass

    def propose(self, ctx: DraftContext) -> DraftTree:
        return self.make_tree(ctx)

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def state_bytes(self) -> int:
        return 0


def oracle_tree(target_model, branching: int, depth: int, vocab: int, rng: random.Random):
    """A tree whose first child is sometimes the target's true next token, mixed with wrong siblings."""

    def make(ctx: DraftContext) -> DraftTree:
        truth = generate(target_model, ctx.tokens.tolist(), depth).tokens
        tree = DraftTree()
        parent = -1
        for d in range(depth):
            siblings = [rng.randrange(vocab) for _ in range(branching - 1)]
            good = truth[d] if rng.random() < 0.8 else rng.randrange(vocab)
            order = siblings + [good] if rng.random() < 0.5 else [good] + siblings
            ids = [tree.add(t, parent, "scripted") for t in order]
            parent = ids[order.index(good)]
            # a deeper decoy branch under a wrong sibling
            if branching > 1 and d + 1 < depth:
                wrong = next(i for i, t in zip(ids, order) if i != parent)
                tree.add(rng.randrange(vocab), wrong, "scripted")
        return tree

    return make


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


# -- tiny trained drafters -------------------------------------------------------------------------------------------


def hidden_states(model, ids: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """(len(layers) + 1, T, H) float32: the requested layers, then the final normed state."""
    with torch.inference_mode():
        states = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.stack([states[i][0] for i in layers] + [states[-1][0]]).clone()


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


def one_batch(model, ids: list[int], layers: tuple[int, ...]) -> DistillBatch:
    """A float32 batch of one sequence (no bfloat16 rounding, unlike make_batch)."""
    ones = torch.ones(1, len(ids), dtype=torch.bool)
    return DistillBatch(torch.tensor([ids]), hidden_states(model, ids, layers)[None], ones, ones)


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


def train_to_memorisation(tmp_path_factory, strategy: str, new_model, steps: int):
    """A drafter trained (to memorisation) on four greedy answers of a tiny target, and saved:
    (target, model, sequences, drafter directory, losses)."""
    target = tiny_target("qwen3-gqa", seed=1)
    torch.manual_seed(0)
    model = new_model(target)
    sequences = distill_sequences(target, model.hidden_layers, 4, prompt_len=6, answer_len=24)
    out = tmp_path_factory.mktemp(strategy) / "drafter"
    losses = train(model, sequences, out, strategy, fingerprint(target.model), steps=steps, batch_size=4, lr=1e-2)
    return target, model, sequences, out, losses


# -- checks every drafter's tests run --------------------------------------------------------------------------------


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


# -- sampling: exact distributions, enumerated or tested by chi-square -----------------------------------------------
# `EnumeratingRng` stands in for the engine's `Rng`: it follows a script of choices and records the probability of
# the path it took. `enumerate_outcomes` runs a step once per leaf of the tree of random choices (drafters' draws
# and the verifier's coins), so the distribution it returns is exact up to float rounding, unlike a chi-square
# test, which misses errors below a few percent. `chi_square_pvalue` below tests whole generations against the
# target's exact distribution at a fixed seed.


class EnumeratingRng:
    def __init__(self, script: list[int]):
        self.script = script
        self.choices: list[int] = []  # the choice taken at each random call
        self.widths: list[int] = []  # how many options each call had
        self.probability = 1.0

    def _choose(self, options: list[tuple[object, float]]):
        i = self.script[len(self.choices)] if len(self.choices) < len(self.script) else 0
        self.choices.append(i)
        self.widths.append(len(options))
        value, weight = options[i]
        self.probability *= weight
        return value

    def draw(self, probs: torch.Tensor) -> int:
        p = probs.double() / probs.double().sum()
        return self._choose([(int(t), float(p[t])) for t in torch.nonzero(p > 0).flatten()])

    def draw_rows(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.tensor([self.draw(row) for row in probs], device=probs.device)

    def accept(self, probability: float) -> bool:
        if probability >= 1.0:
            return True
        if probability <= 0.0:
            return False
        return self._choose([(True, probability), (False, 1.0 - probability)])


def enumerate_outcomes(run: Callable[[EnumeratingRng], object]) -> dict[object, float]:
    """{outcome: probability} over every leaf of the random choices `run(rng)` makes (outcomes hashable)."""
    dist: dict[object, float] = defaultdict(float)
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        rng = EnumeratingRng(script)
        dist[run(rng)] += rng.probability
        for position in range(len(script), len(rng.choices)):
            stack += [rng.choices[:position] + [alt] for alt in range(1, rng.widths[position])]
    return dict(dist)


def first_two(committed: dict[tuple[int, ...], float], next_probs: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """Joint distribution (V, V) of the first two tokens: a step that commits one token is completed by
    the target's own distribution of the next (`next_probs(token)`), as the next exact step would."""
    vocab = len(next_probs(0))
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    for tokens, probability in committed.items():
        if len(tokens) >= 2:
            joint[tokens[0], tokens[1]] += probability
        else:
            joint[tokens[0]] += probability * next_probs(tokens[0]).double()
    return joint


VOCAB = 5  # the synthetic model's vocabulary (logits_at)
TOLERANCE = 1e-6  # exact distributions agree up to float rounding


def logits_at(path: tuple[int, ...], salt: str = "p") -> torch.Tensor:
    """A synthetic model: fixed random logits for every token path, some tokens impossible."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{salt}{path}".encode()))
    logits = torch.randn(VOCAB, generator=g) * 1.5
    logits[int(torch.randint(VOCAB, (), generator=g))] = float("-inf") if salt != "p" else logits.min()
    return logits


def tree_logits(tree: DraftTree, logits_for=logits_at) -> torch.Tensor:
    """The target's logits at the root and at every node (indexed by the node's token path)."""
    paths: list[tuple[int, ...]] = [()]
    for token, parent in zip(tree.tokens, tree.parents):
        paths.append(paths[parent + 1] + (token,))
    return torch.stack([logits_for(p) for p in paths])


def target_joint(sampling: Sampling, logits_for=logits_at) -> torch.Tensor:
    first = sampling.probs(logits_for(())).double()
    return torch.stack([first[a] * sampling.probs(logits_for((a,))).double() for a in range(VOCAB)])


def step_distribution(make_tree, sampling: Sampling, verify=accept_sampling, logits_for=logits_at) -> torch.Tensor:
    """Exact joint distribution of the first two tokens after one step over the tree `make_tree(rng)` builds."""

    def run(rng) -> tuple[int, ...]:
        tree = make_tree(rng)
        path, bonus = verify(tree, tree_logits(tree, logits_for), sampling, rng)
        return tuple(tree.tokens[n] for n in path) + (bonus,)

    return first_two(enumerate_outcomes(run), lambda a: sampling.probs(logits_for((a,))))


CHI_SQUARE_PROMPT = [1, 2, 1, 2, 1]  # the prompt and sample count of the chi-square tests
CHI_SQUARE_RUNS = 1500


@torch.inference_mode()
def exact_first_two(model, prompt: list[int], sampling: Sampling) -> torch.Tensor:
    """(V, V) float64: the target's exact joint distribution of the first two generated tokens."""
    ids = torch.tensor(prompt)
    first = sampling.probs(model(input_ids=ids[None]).logits[0, -1]).double()
    vocab = len(first)
    both = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
    return first[:, None] * sampling.probs(model(input_ids=both).logits[:, -1]).double()


def chi_square_pvalue(model, prompt: list[int], sampling: Sampling, runs: int,
                      make_strategy) -> tuple[float, list[int]]:
    """The chi-square p-value of the first two tokens of `runs` generations, one seed each, with
    `make_strategy()` -> (drafter, controller), against `exact_first_two`; and the drafts each accepted."""
    vocab = model.config.vocab_size
    counts = np.zeros((vocab, vocab))
    accepted = []
    for seed in range(runs):
        drafter, controller = make_strategy()
        got = generate(model, prompt, 2, sampling, drafter=drafter, controller=controller, seed=seed)
        counts[got.tokens[0], got.tokens[1]] += 1
        accepted.append(got.accepted)
    expected = exact_first_two(model, prompt, sampling).numpy().ravel()
    expected *= runs / expected.sum()
    observed = counts.ravel()
    if observed[expected == 0].any():  # a continuation the target gives probability 0 (top-k, top-p)
        return 0.0, accepted
    small = expected < 5  # chi-square needs expected counts of at least 5: pool the rest
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    if expected[-1] == 0:  # nothing to pool
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, expected).pvalue), accepted


# -- a fake NVML and the CLI -----------------------------------------------------------------------------------------


class NVMLError(Exception):
    MESSAGES = {3: "Not Supported", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found"}

    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self.MESSAGES.get(self.value, f"NVML error {self.value}")


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3)


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(9)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(12)


class FakeNvml:
    """The pynvml functions and constants the sampler uses, with an H200-like device."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_SUCCESS = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_GPM_METRIC_DRAM_BW_UTIL = real_pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    NVML_GPM_METRICS_GET_VERSION = real_pynvml.NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = real_pynvml.c_nvmlGpmMetricsGet_t

    def __init__(self, gpm: bool | str = True, init_error: type[Exception] | None = None,
                 unsupported: tuple[str, ...] = (), name: str = "NVIDIA H200") -> None:
        self.gpm = gpm  # True, False (isSupportedDevice 0) or "raise" (NVMLError_NotSupported)
        self.init_error = init_error
        self.unsupported = set(unsupported)
        self.name = name
        self.inits = self.shutdowns = self.gpm_gets = self.gpm_frees = 0
        self.energy_mj = 1_000_000

    def _check(self, fn: str) -> None:
        if fn in self.unsupported:
            raise NVMLError_NotSupported()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle-{index}"

    def nvmlDeviceGetName(self, handle: str) -> str:
        return self.name

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        self._check("utilization")
        return SimpleNamespace(gpu=90, memory=70)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=150_000_000_000, used=40_000_000_000, free=110_000_000_000)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self._check("power")
        return 450_000  # mW

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetPcieThroughput(self, handle: str, counter: int) -> int:
        self._check("pcie")
        return 2000 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 500  # KB/s

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        self._check("energy")
        self.energy_mj += 1500
        return self.energy_mj

    def nvmlDeviceGetMemoryBusWidth(self, handle: str) -> int:
        self._check("bus_width")
        return 6144

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:
        assert clock == self.NVML_CLOCK_MEM
        return 3201

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: str) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: str) -> int:
        return 16

    def nvmlGpmQueryDeviceSupport(self, handle: str) -> SimpleNamespace:
        if self.gpm == "raise":
            raise NVMLError_NotSupported()
        return SimpleNamespace(isSupportedDevice=int(bool(self.gpm)))

    def nvmlGpmSampleAlloc(self):
        return real_pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, handle: str, sample):
        self.gpm_gets += 1
        return sample

    def nvmlGpmSampleFree(self, sample) -> None:
        self.gpm_frees += 1

    def nvmlGpmMetricsGet(self, request):
        assert request.numMetrics == 1
        assert request.metrics[0].metricId == self.NVML_GPM_METRIC_DRAM_BW_UTIL
        request.metrics[0].value = 42.0
        request.metrics[0].nvmlReturn = 0
        return request


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# -- run directories with planted speedups ---------------------------------------------------------------------------
# For recommend's tests. Rows follow what `measuring.make_rows` writes; summary.json comes from
# `analysis.stats.summarise_strategies` over them, as `summarise.finish` writes it, so the readers meet the real schema.


BASE_BYTES = 80_000_000  # the target's weights
KV_BYTES_PER_TOKEN = 50_000
DRAFTER_BYTES = 10_000_000


def write_run(root: Path, name: str, speedups: dict[str, Any], *, categories: tuple[str, ...] = ("code", "chat"),
              prompts: int = 6, model: str = "default", cuda: str | None = None, temperature: float = 0.0,
              batch_size: int | None = None, knobs: dict | None = None, drafter_bytes: dict[str, int] | None = None,
              projections: dict[str, dict] | None = None, mismatched: tuple[str, ...] = (), noise: float = 0.02,
              seed: int = 0, modelled: dict[int, dict[str, float]] | None = None) -> Path:
    """A complete run under root/runs/name. `speedups`: strategy -> speedup, or -> {category: speedup};
    `modelled`: batch size -> strategy -> the speedup its load axis models there."""
    rng = np.random.default_rng(seed)
    path = root / "runs" / name
    path.mkdir(parents=True)
    strategies = ["ar", *speedups]
    rows = []
    for category in categories:
        for i in range(prompts):
            prompt_tokens = 40 + 7 * i
            ar_wall = 1.0 + 0.1 * i
            for strategy in strategies:
                if strategy == "ar":
                    speedup = 1.0
                else:
                    value = speedups[strategy]
                    speedup = value[category] if isinstance(value, dict) else value
                wall = ar_wall / speedup * (1 + noise * rng.standard_normal()) if strategy != "ar" else ar_wall
                rows.append(_row(strategy, category, i, prompt_tokens, wall, drafter_bytes or {},
                                 strategy in mismatched))
    frame = pd.DataFrame(rows)
    frame["speedup"] = paired_speedups(frame)
    summary = [s.as_dict() for s in summarise_strategies(frame)]
    for result in summary:
        if projections and result["strategy"] in projections:
            result["projection"] = projections[result["strategy"]]
    config = asdict(RunConfig(strategies=list(speedups), temperature=temperature, knobs=knobs or {}))
    if batch_size is not None:
        config["batch_size"] = batch_size
    files = {
        "run.json": {"status": "complete", "model": model, "suite": "specbench", "strategies": strategies,
                     "started": "2026-12-01T00:00:00+00:00", "finished": "2026-12-01T00:01:00+00:00"},
        "config.json": config,
        "environment.json": {"cuda": cuda, "torch": "2.13.0"},
        "summary.json": {"results": summary, "load": {"points": [
            {"strategy": s, "batch_size": b, "modelled_speedup": v} for b, at in (modelled or {}).items()
            for s, v in at.items()]}},
    }
    for file, data in files.items():
        (path / file).write_text(json.dumps(data, default=float))
    (path / "rows.jsonl").write_text("".join(json.dumps(r, default=float) + "\n" for r in frame.to_dict("records")))
    return path


def _row(strategy: str, category: str, i: int, prompt_tokens: int, wall: float, drafter_bytes: dict[str, int],
         mismatch: bool) -> dict[str, Any]:
    new_tokens = 32
    steps = 32 if strategy == "ar" else 16
    extra = 0 if strategy == "ar" else drafter_bytes.get(strategy, DRAFTER_BYTES)
    return {
        "strategy": strategy, "prompt_id": f"specbench-{category}-{i}", "category": category, "turn": 0, "repeat": 0,
        "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "wall_s": wall, "ttft_s": 0.05 * wall,
        "tpot_s": wall / new_tokens, "steps": steps, "tau": new_tokens / steps,
        "drafted": 0 if strategy == "ar" else 48, "accepted": 0 if strategy == "ar" else 16,
        "verified": steps if strategy == "ar" else 64, "draft_depth": 0 if strategy == "ar" else 48,
        "accept_by_position": [] if strategy == "ar" else [10, 6], "prefill_s": 0.05 * wall,
        "draft_s": 0.0 if strategy == "ar" else 0.2 * wall, "verify_s": 0.7 * wall, "other_s": 0.05 * wall,
        "memory_bytes": BASE_BYTES + KV_BYTES_PER_TOKEN * (prompt_tokens + new_tokens + 1) + extra,
        "peak_mem_bytes": 600_000_000, "stop_reason": "length", "mismatch": mismatch,
        "first_divergence": 3 if mismatch else None, "divergence_margin": 0.0 if mismatch else None,
        "output_ids": list(range(new_tokens)),
    }


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_script(name: str, *args, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python scripts/NAME.py ARGS`, in this process (the scripts' imports are the tests' own)."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    with monkeypatch.context() as patch:
        patch.setattr(sys, "path", list(sys.path))  # build_default_drafters puts scripts/ on it
        patch.setattr(sys, "argv", [f"{name}.py", *map(str, args)])
        spec.loader.exec_module(script)
        script.main()


# -- serve levels and tuned studies, as their records are written ------------------------------------------------------


def record(index: int, ttft: float, e2e: float, tokens: int, itl: list[float] | None = None, ids=None,
           error: str | None = None) -> RequestRecord:
    return RequestRecord(index, f"p{index}", sent=0.0, ttft=ttft, e2e=e2e, output_tokens=tokens, itl=itl or [],
                         token_ids=ids, error=error)


def served(strategy: str, key: str, concurrency: int | None, records: list[RequestRecord], duration_s: float = 1.0,
           slo: dict[str, float] | None = None, **figures) -> ServeLevel:
    """A summary's level entry of `records`, with `figures` in place of what they give."""
    level = LevelKey(strategy=strategy, level=key, concurrency=concurrency, request_rate=None, complete=True,
                     stopped_by_time=False)
    entry = ServeLevel(**vars(level), **vars(level_summary(records, duration_s, slo or {})), speculation=None)
    return replace(entry, **figures)


def write_study(root, name, strategy, speedup, **meta):
    """A tuned study's record under root/tuned (and its run config), as `specbench tune` writes them."""
    tuned = root / "tuned"
    tuned.mkdir(exist_ok=True)
    (tuned / f"{name}.toml").write_text(f'strategy = ["{strategy}"]\nmax_new_tokens = 64\n'
                                        f'[knobs.{strategy}]\nblock_size = 5\n')
    data = {"study": name, "storage": "sqlite:///studies.db", "strategy": strategy, "model": "default", "gpu": None,
            "projected": False, "label": "measured here", "objectives": ["speedup"], "suite": "mini",
            "prompts": {"tuning": 6, "holdout": 2}, "trials": {"counted": 3}, "target_trials": 3,
            "created": "2025-01-01T00:00:00+00:00", "plots": [],
            "best_params": {f"{strategy}.block_size": 5}, "best_value": speedup + 0.3,
            "toml": f"results/tuned/{name}.toml",
            "tuning": {"speedup": speedup + 0.3, "speedup_ci": [speedup, speedup + 0.6], "prompts": 6},
            "holdout": {"tuned": {"speedup": speedup, "speedup_ci": [speedup - 0.1, speedup + 0.1], "prompts": 2},
                        "defaults": {"speedup": 1.5, "speedup_ci": [1.4, 1.6], "prompts": 2}, "failures": []},
            "categories": [], "temperature": 0.0, "max_new_tokens": 64, "batch_size": 1, "memory_bytes": 1e8, **meta}
    (tuned / f"{name}.json").write_text(json.dumps(data))
    return tuned / f"{name}.toml"
