"""Suffix decoding: continue the context's matching suffix as the prompt and the run's earlier outputs did.

SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975), with the knobs of vLLM's `suffix` method (which
runs Arctic Inference's implementation). Two suffix tries of bounded depth count every substring of
up to max_tree_depth tokens: one over this sequence's prompt and output, one over the outputs of
the run's earlier sequences (the latest max_cached_requests of them). Each step, every suffix of the
context that occurs in a trie is a match; from its node a speculation tree grows best-first by the
estimated probability of a continuation, count(child) / count(node) multiplied down the path,
keeping nodes of probability >= min_token_prob, at most max_spec_factor x the match length of them
(and the controller's budget). The tree of highest score (the sum of its nodes' probabilities) over
both tries and every match length is proposed: deterministic drafts, so verification stays exact
(q a point mass, decoding/verify.py).

The outputs' trie is keyed by prompt: a sequence whose prompt an earlier one had replaces that one's
output, as vLLM evicts a restarted request's cached response, so the warm-up or a repeat of a prompt
never finds its own answer. It is the drafter's own object, shared by any copy of it; the sequence's
trie is reset in start(). A resumed run starts that trie empty, so its later figures can differ.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.drafting import DraftContext, Drafter, StepOutcome
from specbench.decoding.tree import DraftTree
from specbench.methods.base import Method
from specbench.methods.search_space import Choice, FloatRange, IntRange, Param, SearchSpace, check_ranges, knob
from specbench.methods.serving import Serving, fixed_only


@dataclass
class SuffixOptions:
    num_speculative_tokens: int = knob(24, "most draft tokens a step (nodes of the speculation tree)", "tokens",
                                       low=1, high=256)
    max_tree_depth: int = knob(24, "depth of the suffix tries: the longest suffix matched plus its continuation",
                               "tokens", low=2, high=256)
    max_spec_factor: float = knob(1.0, "draft tokens per matched token (a match of m tokens drafts at most "
                                       "factor x m)", "", low=0.0)
    min_token_prob: float = knob(0.1, "least estimated probability of a drafted token (count ratios multiplied "
                                      "down its path)", "", low=0.0, high=1.0)
    max_cached_requests: int = knob(10000, "earlier outputs of the run searched as well (0: the sequence's own "
                                           "prompt and output only)", "sequences", low=0)

    def __post_init__(self) -> None:
        check_ranges(self, "suffix.")


# around vLLM's defaults: the factor and the probability floor trade draft length for acceptance
SPACE = SearchSpace((
    Param("controller", Choice(("fixed", "heuristic"))),
    Param("num_speculative_tokens", IntRange(4, 32, log=True)),
    Param("max_tree_depth", IntRange(8, 48, log=True)),
    Param("max_spec_factor", FloatRange(0.5, 4.0, log=True)),
    Param("min_token_prob", FloatRange(0.02, 0.5, log=True)),
))


class Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0  # occurrences of the substring the path from the root spells
        self.children: dict[int, Node] = {}


class SuffixTrie:
    """Every substring of up to `depth` tokens of the sequences added, with how often it occurs."""

    def __init__(self, depth: int):
        self.depth = depth
        self.root = Node()
        self.sequences: dict[Hashable, list[int]] = {}  # in the order they were added
        self._ends: dict[Hashable, list[Node]] = {}  # per sequence: its suffixes of 1..depth-1 tokens, shortest first

    def extend(self, key: Hashable, tokens: list[int]) -> None:
        """Append `tokens` to sequence `key` (a new one if it is not here)."""
        sequence, ends = self.sequences.setdefault(key, []), self._ends.setdefault(key, [])
        for token in tokens:
            grown = []
            for node in [self.root, *ends]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                child.count += 1
                grown.append(child)
            ends[:] = grown[:self.depth - 1]  # a suffix of `depth` tokens grows no further
        sequence.extend(tokens)

    def remove(self, key: Hashable) -> None:
        """Take sequence `key`'s substrings back out."""
        sequence = self.sequences.pop(key)
        del self._ends[key]
        for start in range(len(sequence)):
            node = self.root
            for token in sequence[start:start + self.depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:  # nothing else passes through it, nor through anything below it
                    del node.children[token]
                    break
                node = child

    def matches(self, pattern: list[int]) -> Iterator[tuple[int, Node]]:
        """(m, node) for each suffix of `pattern` of m tokens that occurs, shortest first (a longer one
        occurs only where a shorter one does)."""
        for m in range(1, min(len(pattern), self.depth) + 1):
            node = self.root
            for token in pattern[-m:]:
                node = node.children.get(token)
                if node is None:
                    return
            yield m, node


def speculate(node: Node, limit: int, min_prob: float) -> tuple[float, list[tuple[int, int, float]]]:
    """The `limit` likeliest continuations from `node` (each at least `min_prob`), best first: their
    summed probability and (token, parent index, probability) of each, a parent before its children."""
    nodes: list[tuple[int, int, float]] = []
    score, tick = 0.0, 0
    heap: list[tuple[float, int, int, int, Node]] = []  # (-probability, tie-break, token, parent, trie node)

    def push(parent: int, at: Node, probability: float) -> None:
        nonlocal tick
        for token, child in at.children.items():
            p = probability * child.count / at.count
            if p >= min_prob:
                heapq.heappush(heap, (-p, tick, token, parent, child))
                tick += 1

    push(-1, node, 1.0)
    while heap and len(nodes) < limit:
        negative, _, token, parent, child = heapq.heappop(heap)
        nodes.append((token, parent, -negative))
        score -= negative
        push(len(nodes) - 1, child, -negative)
    return score, nodes


class History:
    """The outputs of the run's sequences, the latest `limit` of them, keyed by their prompts."""

    def __init__(self, depth: int, limit: int):
        self.trie = SuffixTrie(depth)
        self.limit = limit

    def begin(self, key: Hashable) -> None:
        if key in self.trie.sequences:
            self.trie.remove(key)
        if self.limit:
            self.trie.extend(key, [])
        while len(self.trie.sequences) > self.limit:
            self.trie.remove(next(iter(self.trie.sequences)))

    def extend(self, key: Hashable, tokens: list[int]) -> None:
        if key in self.trie.sequences:  # not when it was evicted already
            self.trie.extend(key, tokens)


class SuffixDrafter(Drafter):
    name = "suffix"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, options: SuffixOptions):
        self.options = options
        self.history = History(options.max_tree_depth, options.max_cached_requests)
        self.own = SuffixTrie(options.max_tree_depth)
        self.key: Hashable = ()

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        tokens = prompt.tolist()
        self.key = tuple(tokens)
        self.own = SuffixTrie(self.options.max_tree_depth)
        self.own.extend(self.key, tokens)
        self.history.begin(self.key)

    def propose(self, ctx: DraftContext) -> DraftTree:
        o = self.options
        pattern = ctx.tokens[-o.max_tree_depth:].tolist()
        best: tuple[float, list[tuple[int, int, float]]] = (0.0, [])
        for trie in (self.own, self.history.trie):
            for m, node in trie.matches(pattern):
                limit = min(ctx.budget, o.num_speculative_tokens, int(m * o.max_spec_factor + 1e-6))
                candidate = speculate(node, limit, o.min_token_prob)
                if candidate[0] > best[0]:
                    best = candidate
        tree = DraftTree()
        for token, parent, probability in best[1]:
            tree.add(token, parent, self.name)
            tree.scores.append(probability)
        return tree

    def observe(self, outcome: StepOutcome) -> None:
        self.own.extend(self.key, outcome.committed)
        self.history.extend(self.key, outcome.committed)

    def state_bytes(self) -> int:
        return 0  # its tries live in host memory, not beside the target's cache


def _build(target, options: SuffixOptions, drafter_dir) -> SuffixDrafter:
    if drafter_dir is not None:
        raise SpecbenchError("suffix needs no --drafter directory")
    return SuffixDrafter(options)


def _serving(o: SuffixOptions, controller: str, drafter: str | None) -> Serving:
    # vLLM drafts the best path of the tree (Arctic Inference's tree mode is not exposed); SGLang has
    # no suffix decoding
    vllm = {"method": "suffix", "num_speculative_tokens": o.num_speculative_tokens,
            "suffix_decoding_max_tree_depth": o.max_tree_depth,
            "suffix_decoding_max_cached_requests": o.max_cached_requests,
            "suffix_decoding_max_spec_factor": o.max_spec_factor, "suffix_decoding_min_token_prob": o.min_token_prob}
    return Serving(vllm, None, fixed_only(controller))


STRATEGY = Method("suffix", SuffixOptions, _build, budget=lambda o: o.num_speculative_tokens,
                  short_draft=lambda n: {"num_speculative_tokens": n}, space=SPACE, tree=True,
                  serving=_serving, model_free=True)
