"""Combinations `a+b[+c]`: the members' proposals merge into one trie verified in one target forward.

The trie is keyed by the full path from the root (SpecInfer's merged token tree): a token several
members proposed is verified once, in one target forward. For sampling, every member's trials are
kept, each with its proposer's q and draw, in an order fixed before anything is drawn (members in
their canonical order, each member's candidates in its own order), so the verification stays
exact (decoding/verify.py). Each member keeps its own controller and learns from its own view of
the outcome: its own tree and the part of the accepted path that it proposed.

How the members combine is the `combine.*` knobs (methods/combine_options.py): every member's whole
tree (union); the trie cut to a node budget, the likeliest nodes first (budget); or that, after each
member was asked before drafting whether it pays this step (route). What decides is known before
anything of the step is drawn, so the output stays the target's:

- a member's score per node (DraftTree.scores) is calibrated against what the target accepted of
  that member's nodes of that depth and score earlier in the run (`Calibration`);
- the budget cuts only trees drafted deterministically (q a point mass: n-gram, suffix, EAGLE's and
  MTP's top-k trees, every drafter at temperature 0), ranked among themselves: a tree drawn from the
  rng (a chain sampled at temperature > 0) is kept whole, since dropping a token for its drawn value
  would bias what is verified, and ranking a deterministic token against drawn ones would make the
  trials tried depend on the draws;
- the cost router weighs model-free members' proposals (deterministic, drafted first) against each
  model member's recent acceptance; the entropy router reads the target's distribution of the step
  before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from specbench.decoding.drafting import Controller, DraftContext, Drafter, StepOutcome
from specbench.decoding.tree import DraftTree
from specbench.methods.combine_options import CombineOptions
from specbench.methods.controllers import entropy

DEPTH_BINS = 8  # calibration bins: depths 1..7 apart, 8 and deeper together
SCORE_BINS = 10  # and scores in tenths
PRIOR_WEIGHT = 4.0  # a bin's observations count against this many pseudo-observations of the raw score
UNSCORED_PRIOR = 0.6  # a node without a score is first taken as accepted with this probability per depth
GAIN_RATE = 0.2  # weight of the latest step in a member's running accepted tokens


def merge_trees(trees: list[DraftTree]) -> tuple[DraftTree, list[list[int]]]:
    """One trie from several trees, and for each tree the merged index of each of its nodes.

    Each merged row tries the first tree's trials there (in that tree's order), then the second's,
    and so on: an order fixed by the members, never by the tokens they drew.
    """
    merged = DraftTree()
    by_path: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    maps = []
    for tree in trees:
        where: list[int] = []
        for token, parent in zip(tree.tokens, tree.parents):
            key = (where[parent] if parent >= 0 else -1, token)
            if key not in by_path:
                by_path[key] = merged.add_node(token, key[0])
            where.append(by_path[key])
        for row, trials in enumerate(tree.trials):
            merged.trials[where[row - 1] + 1 if row else 0] += [replace(t, node=where[t.node]) for t in trials]
        maps.append(where)
    return merged, maps


def subtree(tree: DraftTree, keep: list[bool]) -> tuple[DraftTree, list[int]]:
    """The nodes of `tree` marked kept (a node's parent is kept with it), and each node's new index (-1: cut)."""
    out = DraftTree()
    new: list[int] = []
    for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents)):
        new.append(out.add_node(token, new[parent] if parent >= 0 else -1) if keep[i] else -1)
    for row, trials in enumerate(tree.trials):
        if row == 0 or keep[row - 1]:
            out.trials[new[row - 1] + 1 if row else 0] = [replace(t, node=new[t.node]) for t in trials if keep[t.node]]
    out.scores = [s for s, k in zip(tree.scores, keep) if k]
    return out, new


def member_path(path: list[int], where: list[int]) -> list[int]:
    """The accepted path in a member's own node indices: the prefix of it that the member proposed."""
    own = {merged: i for i, merged in enumerate(where) if merged >= 0}
    out = []
    for node in path:
        if node not in own:
            break
        out.append(own[node])
    return out


def sampled(tree: DraftTree) -> bool:
    """Whether any of the tree's tokens was drawn from the rng (a trial with its q)."""
    return any(t.q is not None for trials in tree.trials for t in trials)


class Calibration:
    """What the target accepted of each member's nodes, by depth and the member's own score: the
    estimate that a node is accepted, comparable across members whatever their scores mean.

    It is the run's (a new sequence keeps it), as the calibrated scores are the drafters' on this
    target and workload."""

    def __init__(self) -> None:
        # (member, depth bin, score bin) -> [verified, accepted]
        self.counts: dict[tuple[int, int, int], list[int]] = {}

    @staticmethod
    def key(member: int, depth: int, score: float | None) -> tuple[int, int, int]:
        return member, min(depth, DEPTH_BINS), -1 if score is None else min(int(score * SCORE_BINS), SCORE_BINS - 1)

    def estimate(self, member: int, depth: int, score: float | None) -> float:
        prior = UNSCORED_PRIOR ** depth if score is None else score
        verified, accepted = self.counts.get(self.key(member, depth, score), (0, 0))
        return (accepted + PRIOR_WEIGHT * prior) / (verified + PRIOR_WEIGHT)

    def tree_estimates(self, member: int, tree: DraftTree) -> list[float]:
        scores = tree.scores or [None] * len(tree)
        return [self.estimate(member, d, s) for d, s in zip(tree.depths(), scores)]

    def record(self, member: int, tree: DraftTree, verified: list[bool], accepted: set[int]) -> None:
        scores = tree.scores or [None] * len(tree)
        for node, (depth, score) in enumerate(zip(tree.depths(), scores)):
            if verified[node]:
                counts = self.counts.setdefault(self.key(member, depth, score), [0, 0])
                counts[0] += 1
                counts[1] += node in accepted


def budget_keep(tree: DraftTree, estimates: list[float], budget: int) -> list[bool]:
    """The `budget` nodes of `tree` likeliest to be accepted, as a trie: a node ranks by the least estimate
    on its path (never above its parent), ties to the earlier node, so its parent is taken before it."""
    rank: list[float] = []
    for est, parent in zip(estimates, tree.parents):
        rank.append(min(est, rank[parent]) if parent >= 0 else est)
    keep = [False] * len(tree)
    for node in sorted(range(len(tree)), key=lambda n: (-rank[n], n))[:budget]:
        keep[node] = True
    return keep


class CombinedDrafter(Drafter):
    options = None  # each member has its own; the combination's are `combine`

    def __init__(self, members: list[Drafter], new_controllers: list[Callable[[], Controller]],
                 combine: CombineOptions | None = None):
        self._members = members
        self.new_controllers = new_controllers
        self.combine = combine or CombineOptions()
        self.controllers: list[Controller] = []
        self.name = "+".join(m.name for m in members)
        self.hidden_layers = tuple(sorted({layer for m in members for layer in m.hidden_layers}))
        self._layer_picks = [[self.hidden_layers.index(layer) for layer in m.hidden_layers] for m in members]
        self.calibration = Calibration()
        self.gains: list[float | None] = [None] * len(members)  # per member: running accepted tokens a step
        self.sizes: list[int | None] = [None] * len(members)  # per member: the nodes of its last tree
        self.uncertain = False  # the entropy router's state
        self.steps = 0
        self._last: tuple[list[DraftTree], list[list[int]], list[bool]] = ([], [], [])

    @property
    def members(self) -> list[Drafter]:
        return self._members

    def _hidden_for(self, i: int, hidden: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(hidden[j] for j in self._layer_picks[i])

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        self.controllers = [new() for new in self.new_controllers]
        self.uncertain, self.steps = False, 0
        for i, member in enumerate(self.members):
            member.start(prompt, self._hidden_for(i, hidden))

    def _draft(self, i: int, ctx: DraftContext) -> DraftTree:
        ctrl = self.controllers[i]
        return self.members[i].propose(DraftContext(ctx.tokens, min(ctrl.budget(), ctx.budget), ctx.sampling,
                                                    ctx.rng, ctrl))

    def _forwards(self, i: int, ctx: DraftContext) -> int:
        """Drafter forwards member i runs this step: one for a block drafter, one a position otherwise."""
        member = self.members[i]
        return 1 if member.parallel_draft else min(self.controllers[i].budget(), ctx.budget)

    def _pays(self, ctx: DraftContext, trees: list[DraftTree | None]) -> set[int]:
        """The cost router: the model members worth drafting, given the model-free members' proposals
        (already in `trees`): the one whose (1 + expected accepted tokens) / (1 + draft cost + verify cost) is
        best, where it beats (1 + what the model-free proposals are expected to bring) / (1 + their verify cost).
        A position's verify cost counts: on a CPU a large tree (EAGLE's) costs more to verify than its extra
        accepted tokens bring."""
        node_cost = self.combine.node_cost
        free, free_nodes = max(((sum(self.calibration.tree_estimates(i, t)), len(t))
                                for i, t in enumerate(trees) if t is not None), default=(0.0, 0))
        value = {}
        for i in (i for i, t in enumerate(trees) if t is None):
            gain = self.gains[i]
            if gain is None:  # never measured: draft, to learn it
                return {i for i, t in enumerate(trees) if t is None}
            nodes = max(self.sizes[i] or 0, free_nodes)  # its tree and the model-free one, merged, at the least
            value[i] = (1 + max(gain, free)) / (1 + self.combine.draft_cost * self._forwards(i, ctx)
                                                + node_cost * nodes)
        best = max(value, key=value.get, default=None)
        return {best} if best is not None and value[best] > (1 + free) / (1 + node_cost * free_nodes) else set()

    def _route(self, ctx: DraftContext) -> list[DraftTree | None]:
        """Route mode: each member's tree, None for one that does not draft this step."""
        n = len(self.members)
        if self.steps % self.combine.explore == 0:  # every member, now and then, to keep its estimates current
            return [self._draft(i, ctx) for i in range(n)]
        if self.combine.router == "entropy":
            drafting = set(range(1, n)) if self.uncertain else {0}
            return [self._draft(i, ctx) if i in drafting else None for i in range(n)]
        trees: list[DraftTree | None] = [self._draft(i, ctx) if m.model is None else None
                                         for i, m in enumerate(self.members)]
        for i in self._pays(ctx, trees):
            trees[i] = self._draft(i, ctx)
        return trees

    def _cut(self, trees: list[DraftTree]) -> list[tuple[DraftTree, list[int]]]:
        """The deterministic trees cut together to the budget, a tree drawn from the rng whole: each tree as
        verified, and its nodes' indices there (-1: cut)."""
        out = [(tree, list(range(len(tree)))) for tree in trees]
        fixed = [i for i, t in enumerate(trees) if not sampled(t)]
        merged, maps = merge_trees([trees[i] for i in fixed])
        budget = self.combine.budget or max((len(trees[i]) for i in fixed), default=0)
        if not self.combine.cuts or len(merged) <= budget:
            return out
        estimates = [0.0] * len(merged)
        for i, where in zip(fixed, maps):
            for node, est in zip(where, self.calibration.tree_estimates(i, trees[i])):
                estimates[node] = max(estimates[node], est)
        keep = budget_keep(merged, estimates, budget)
        for i, where in zip(fixed, maps):
            out[i] = subtree(trees[i], [keep[node] for node in where])
        return out

    def propose(self, ctx: DraftContext) -> DraftTree:
        drafted = (self._route(ctx) if self.combine.routes
                   else [self._draft(i, ctx) for i in range(len(self.members))])
        trees = [t if t is not None else DraftTree() for t in drafted]
        verified = self._cut(trees)
        merged, maps = merge_trees([tree for tree, _ in verified])
        # each member's own nodes -> merged node, through the cut (-1: cut)
        wheres = [[where[n] if n >= 0 else -1 for n in new] for (_, new), where in zip(verified, maps)]
        self._last = (trees, wheres, [t is not None for t in drafted])
        self.steps += 1
        return merged

    def observe(self, outcome: StepOutcome) -> None:
        for i, (member, ctrl, tree, where, drafted) in enumerate(zip(self.members, self.controllers, *self._last)):
            path = member_path(outcome.path, where)
            member.observe(StepOutcome(tree, path, outcome.bonus, outcome.committed,
                                       self._hidden_for(i, outcome.hidden), outcome.logits))
            if drafted:
                ctrl.update(max(tree.depths(), default=0), len(path))
        self._learn(outcome)

    def _learn(self, outcome: StepOutcome) -> None:
        """What the combination decides by, from the step's outcome: the calibration, each drafting member's
        running accepted tokens, the entropy router's state."""
        accepted = set(outcome.path)
        for i, (tree, where, drafted) in enumerate(zip(*self._last)):
            if not drafted:
                continue
            path = member_path(outcome.path, where)
            self.calibration.record(i, tree, [w >= 0 for w in where], {n for n, w in enumerate(where) if w in accepted})
            self.sizes[i] = len(tree)
            gain = self.gains[i]
            self.gains[i] = len(path) if gain is None else (1 - GAIN_RATE) * gain + GAIN_RATE * len(path)
        if outcome.logits is not None and self.combine.router == "entropy":
            h = float(entropy(outcome.logits))
            self.uncertain = h > self.combine.entropy_high or (self.uncertain and h >= self.combine.entropy_low)

    def state_bytes(self) -> int:
        return sum(member.state_bytes() for member in self.members)
