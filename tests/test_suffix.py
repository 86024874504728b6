"""Suffix decoding: the tries' counts and matches, the frequency-scored speculation tree, the outputs
of earlier sequences, greedy identity with plain decoding and exact sampling."""

from __future__ import annotations

import pytest
import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.drafting import DraftContext, StepOutcome
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import load_target
from specbench.decoding.tree import DraftTree
from specbench.methods.controllers import FixedController
from specbench.methods.knobs import make_options
from specbench.methods.registry import definition, vllm_method
from specbench.methods.suffix import SuffixDrafter, SuffixOptions, SuffixTrie, speculate
from tests.helpers import TOLERANCE, step_distribution, target_joint


def counts(trie: SuffixTrie) -> dict[tuple[int, ...], int]:
    """Every substring the trie holds, with its count."""
    out, stack = {}, [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            out[path + (token,)] = child.count
            stack.append((path + (token,), child))
    return out


def trie(*sequences: list[int], depth: int = 3) -> SuffixTrie:
    t = SuffixTrie(depth)
    for i, sequence in enumerate(sequences):
        t.extend(i, sequence)
    return t


def committed(tokens: list[int]) -> StepOutcome:
    return StepOutcome(DraftTree(), [], tokens[-1], tokens, ())


def propose(drafter: SuffixDrafter, context: list[int], budget: int = 24) -> DraftTree:
    return drafter.propose(DraftContext(torch.tensor(context), budget, Sampling(), None, FixedController(budget)))


def test_the_trie_counts_every_substring_up_to_its_depth():
    t = trie([1, 2, 1, 2, 3])
    assert counts(t) == {(1,): 2, (2,): 2, (3,): 1, (1, 2): 2, (2, 1): 1, (2, 3): 1,
                         (1, 2, 1): 1, (1, 2, 3): 1, (2, 1, 2): 1}


def test_extending_token_by_token_builds_the_same_trie_and_removal_undoes_it():
    whole = trie([4, 1, 2, 1, 2, 3], [1, 2, 5])
    pieces = SuffixTrie(3)
    for token in [4, 1, 2]:
        pieces.extend(0, [token])
    pieces.extend(1, [1, 2, 5])
    pieces.extend(0, [1, 2, 3])
    assert counts(pieces) == counts(whole)
    whole.remove(0)
    assert counts(whole) == counts(trie([1, 2, 5]))
    whole.remove(1)
    assert counts(whole) == {}


def test_matches_are_the_suffixes_that_occur_shortest_first():
    t = trie([1, 2, 1, 2, 3], depth=4)
    found = [(m, node.count) for m, node in t.matches([9, 2, 1, 2])]
    assert found == [(1, 2), (2, 2), (3, 1)]  # "2", "1 2", "2 1 2"; "9 2 1 2" does not occur


def test_speculation_grows_the_likeliest_continuations_first_down_to_the_probability_floor():
    t = trie([7, 1, 7, 1, 7, 2, 7, 1, 3], depth=4)
    node = dict(t.matches([7]))[1]  # "7": followed by 1 three times, by 2 once
    # 1 (3/4), then "7 1 7" (3/4 x 2/3); 1/4 each: 2, "7 1 3", "7 1 7 1", "7 1 7 2", "7 2 7", "7 2 7 1"
    def shape(limit: int, floor: float) -> tuple[float, list[tuple[int, int]]]:
        score, nodes = speculate(node, limit, floor)
        assert score == pytest.approx(sum(p for _, _, p in nodes))  # each node's probability, summed
        return score, [(token, parent) for token, parent, _ in nodes]

    assert shape(8, 0.3) == (pytest.approx(1.25), [(1, -1), (7, 0)])
    assert shape(9, 0.2) == (pytest.approx(2.75), [(1, -1), (7, 0), (2, -1), (3, 0), (1, 1), (2, 1), (7, 2), (1, 6)])
    assert shape(3, 0.2) == (pytest.approx(1.5), [(1, -1), (7, 0), (2, -1)])
    assert [p for _, _, p in speculate(node, 2, 0.3)[1]] == pytest.approx([0.75, 0.5])  # the tree's scores


def test_the_longest_match_decides_between_continuations():
    drafter = SuffixDrafter(SuffixOptions())
    prompt = [5, 1, 2, 3, 7, 6, 1, 2, 4, 8, 5, 1, 2]
    drafter.start(torch.tensor(prompt), ())
    # "2" and "1 2" were followed by 3 and by 4; "5 1 2" only by 3, 7, 6
    assert propose(drafter, prompt).tokens == [3, 7, 6]
    assert propose(drafter, prompt, budget=2).tokens == [3, 7]


def test_earlier_outputs_of_the_run_are_searched_but_never_a_prompt_s_own():
    drafter = SuffixDrafter(SuffixOptions())
    drafter.start(torch.tensor([9, 9]), ())
    drafter.observe(committed([1, 2, 3, 4, 5]))
    drafter.start(torch.tensor([8, 1, 2]), ())
    assert propose(drafter, [8, 1, 2]).tokens == [3, 4]  # a match of two tokens drafts two
    drafter.start(torch.tensor([9, 9]), ())  # the same prompt again: its earlier output is dropped
    assert propose(drafter, [9, 9, 1, 2]).tokens == []
    alone = SuffixDrafter(SuffixOptions(max_cached_requests=0))
    alone.start(torch.tensor([9, 9]), ())
    alone.observe(committed([1, 2, 3, 4, 5]))
    alone.start(torch.tensor([8, 1, 2]), ())
    assert propose(alone, [8, 1, 2]).tokens == []


def test_only_the_latest_outputs_are_kept():
    drafter = SuffixDrafter(SuffixOptions(max_cached_requests=2))
    for prompt in range(3):
        drafter.start(torch.tensor([prompt]), ())
        drafter.observe(committed([10 + prompt, 20 + prompt]))
    assert list(drafter.history.trie.sequences) == [(1,), (2,)]
    assert (10, 20) not in counts(drafter.history.trie)


def test_a_branching_suffix_tree_samples_exactly():
    drafter = SuffixDrafter(SuffixOptions(max_spec_factor=4.0, min_token_prob=0.2))
    for prompt, output in (([0], [1, 2, 3, 4]), ([4], [1, 2, 4, 0])):
        drafter.start(torch.tensor(prompt), ())
        drafter.observe(committed(output))
    drafter.start(torch.tensor([3, 1, 2]), ())
    tree = propose(drafter, [3, 1, 2], budget=4)
    assert tree.tokens[:2] == [3, 4] and not tree.is_chain()  # after "1 2": 3 once, 4 once
    sampling = Sampling(temperature=1.0)
    assert (step_distribution(lambda rng: tree, sampling) - target_joint(sampling)).abs().max() < TOLERANCE


@torch.no_grad()
def test_greedy_decoding_of_the_embedded_model_is_plain_decoding():
    target = load_target(None, torch.device("cpu"), torch.float32)
    drafter = SuffixDrafter(SuffixOptions())  # one drafter for every prompt, as a run has
    accepted = 0
    for text in ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "List the days of the week.",
                 "Repeat after me: the cat sat on the mat. The cat sat on the mat. The cat"):
        prompt = target.tokenizer(text)["input_ids"]
        expected = generate(target.model, prompt, 40, eos_ids=target.eos_ids)
        got = generate(target.model, prompt, 40, eos_ids=target.eos_ids, drafter=drafter,
                       controller=FixedController(24))
        assert got.tokens == expected.tokens, text
        accepted += got.accepted
    assert accepted > 0


def test_knobs_are_checked_and_translated():
    with pytest.raises(SpecbenchError, match="suffix.min_token_prob must be between 0 and 1, got 1.5"):
        make_options("suffix", {"min_token_prob": "1.5"})
    with pytest.raises(SpecbenchError, match="suffix.max_tree_depth must be between 2 and 256"):
        make_options("suffix", {"max_tree_depth": 1})
    with pytest.raises(SpecbenchError, match="unknown knob suffix.depth"):
        make_options("suffix", {"depth": 3})
    with pytest.raises(SpecbenchError, match="suffix needs no --drafter"):
        definition("suffix").build(None, SuffixOptions(), "somewhere")
    serving = definition("suffix").serving(SuffixOptions(num_speculative_tokens=8), "heuristic", None)
    assert serving.vllm == {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24,
                            "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0,
                            "suffix_decoding_min_token_prob": 0.1}
    assert serving.sglang is None and serving.untranslated() == ["controller in vLLM"]
    assert vllm_method("suffix") == "suffix"
