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
  model member's acceptance on earlier steps, at prices scaled by the wall time earlier steps took (so
  two runs may route differently, each exactly); the entropy router reads the target's distribution of
  the step before.
"""

from __future__ import annotations

import time
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
# weight of a step in a member's running accepted tokens: lately (whether it pays against a model-free proposal,
# which is the step's own), and typically (which of the model members drafts: what one draft brings is mostly noise)
RECENT_RATE, TYPICAL_RATE = 0.2, 0.05
FREE_BINS = (0.5, 2.0)  # the model-free proposal's expected tokens, binned: what a model member brings beside it
MAX_WAIT = 256  # idle steps at most before a member left out by the router explores again
EXPLORE_SHARE = 0.01  # of the run's time, at most, a left-out member's explorations take (at MAX_WAIT at most)
PAIRED = 4  # steps two model members both drafted before one left out is judged on them
# the cost router verifies fewer nodes than the budget only where that is this much better a step (a share): a
# cut that merely ties in prices loses in the run (DFlash's chain on the embedded model, cut from 7 nodes to 5
# at prices that read the same, kept 92% of its accepted tokens for 98% of the step's time)
CUT_MARGIN = 0.05


def merge_trees(trees: list[DraftTree]) -> tuple[DraftTree, list[list[int]]]:
    """One trie from several trees, and for each tree the merged index of each of its nodes.

    Each merged row tries the first tree's trials there (in that tree's order), then the second's,
    and so on: an order fixed by the members, never by the tokens they drew. Where one tree alone has nodes
    (a routed step, mostly), it is the trie as it is.
    """
    drafted = [tree for tree in trees if len(tree)]
    if len(drafted) == 1:
        return drafted[0], [list(range(len(tree))) for tree in trees]
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
    if all(keep):
        return tree, list(range(len(tree)))
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
        # an unscored node is first taken as its parent's depth is accepted, times UNSCORED_PRIOR: a prior that
        # fell with depth alone (0.6^d) cut DFlash's chain below what it is accepted to, so those depths were
        # never verified again and never learned
        if score is None:
            prior = UNSCORED_PRIOR * (self.estimate(member, depth - 1, None) if depth > 1 else 1.0)
        else:
            prior = score
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


def ranked(tree: DraftTree, estimates: list[float]) -> tuple[list[int], list[float]]:
    """The nodes of `tree`, likeliest to be accepted first, with their ranks: a node ranks by the least estimate
    on its path (never above its parent), ties to the earlier node, so every prefix of the order is a trie."""
    rank: list[float] = []
    for est, parent in zip(estimates, tree.parents):
        rank.append(min(est, rank[parent]) if parent >= 0 else est)
    order = sorted(range(len(tree)), key=lambda n: (-rank[n], n))
    return order, [rank[n] for n in order]


def first_kept(order: list[int], size: int, nodes: int) -> list[bool]:
    """Per node of a tree of `nodes`, whether it is among the first `size` of `order` (`ranked`'s: a trie)."""
    keep = [False] * nodes
    for node in order[:size]:
        keep[node] = True
    return keep


def paying_size(ranks: list[float], cost: Callable[[int], float], margin: float = 0.0) -> int:
    """How many of the ranked nodes to verify: the count k whose expected tokens (1 + the first k ranks) per
    step time (`cost(k)`, in target forwards) is best, the fewest where several tie; all of them unless the
    best is better by more than `margin` (a share). Sequoia (arXiv 2402.12374) sizes its tree by the
    hardware's verify time in the same way."""
    best, best_k, expected = 1 / cost(0), 0, 1.0
    for k, rank in enumerate(ranks, start=1):
        expected += rank
        value = expected / cost(k)
        if value > best:
            best, best_k = value, k
    return best_k if best > (1 + margin) * expected / cost(len(ranks)) else len(ranks)


def free_bin(expected: float) -> int:
    return sum(expected >= edge for edge in FREE_BINS)


class CombinedDrafter(Drafter):
    options = None  # each member has its own; the combination's are `combine`
    clock: Callable[[], float] = staticmethod(time.perf_counter)  # a step's wall time (tests set their own)

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
        # a verify forward of n positions in target forwards of one: the run's measured curve where it has one
        # (price), else the linear `node_cost` per position
        self.verify_curve: Callable[[int], float] | None = None
        # per member: its proposal at a draft budget after absorbing a number of committed tokens, in target
        # forwards, measured (price), else `draft_cost`
        self.proposal_costs: list[Callable[[int, int], float] | None] | None = None
        self.backlog = [0] * len(members)  # per member: tokens committed since it last drafted
        # per member: accepted tokens a step it drafted, lately and typically (RECENT_RATE, TYPICAL_RATE)
        self.gains: list[float | None] = [None] * len(members)
        self.typical: list[float | None] = [None] * len(members)
        self.counted = [0] * len(members)  # per member: the steps it drafted
        # per member and FREE_BINS bin: its accepted tokens beside a model-free proposal expected to bring that
        # many (RECENT_RATE a draft): the member's gains are mostly where the model-free one's are too
        self.beside: dict[tuple[int, int], float] = {}
        self._free_bin: int | None = None  # the step's, where the cost router weighed a model-free proposal
        # per pair of model members (i, j): the mean of i's accepted tokens less j's on the steps both drafted
        # (an exploration beside the chosen one), and how many: what i would bring instead, judged on the same
        # text, where i's own estimate is stale and noisy from its few drafts
        self.paired: dict[tuple[int, int], list[float]] = {}
        # per kind of step (the model member that drafted, -1: none): seconds, priced target forwards and steps,
        # summed with TYPICAL_RATE forgetting; seconds over forwards scale the prices to what such steps take here
        self.step_time: dict[int, list[float]] = {}
        self._began, self._priced = 0.0, 0.0
        self.sizes: list[int | None] = [None] * len(members)  # per member: the nodes of its last tree
        self.uncertain = False  # the entropy router's state
        self.held: int | None = None  # the cost router's: the model member it chose last
        # per member: idle steps before it explores, and steps since it last drafted (the run's, as the
        # calibration: the first step of the run asks every member)
        self.wait = [self.combine.explore] * len(members)
        self.idle = list(self.wait)
        self.gap = [1] * len(members)  # per member: steps since it drafted before, at its latest draft
        self._last: tuple[list[DraftTree], list[list[int]], list[bool]] = ([], [], [])

    @property
    def members(self) -> list[Drafter]:
        return self._members

    def _hidden_for(self, i: int, hidden: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(hidden[j] for j in self._layer_picks[i])

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        self.controllers = [new() for new in self.new_controllers]
        self.uncertain = False
        self.backlog = [0] * len(self.members)  # the prompt: every member absorbs it, whichever drafts
        for i, member in enumerate(self.members):
            member.start(prompt, self._hidden_for(i, hidden))

    def _draft(self, i: int, ctx: DraftContext) -> DraftTree:
        ctrl = self.controllers[i]
        return self.members[i].propose(DraftContext(ctx.tokens, min(ctrl.budget(), ctx.budget), ctx.sampling,
                                                    ctx.rng, ctrl))

    def verify_cost(self, nodes: int) -> float:
        """A verify forward over `nodes` drafted nodes (and the bonus position), in target forwards of one."""
        if self.verify_curve is not None:
            return self.verify_curve(nodes + 1)
        return 1 + self.combine.node_cost * nodes

    def price(self, verify_curve: Callable[[int], float] | None,
              proposal_costs: list[Callable[[int, int], float] | None] | None) -> None:
        """Weigh verifying and drafting by this machine's measured costs (bench/pipeline.py price_combinations):
        `verify_curve(n)` a verify forward of n positions, `proposal_costs[i](budget, tokens)` member i's
        proposal after it absorbs `tokens` committed tokens (None for a model-free member), both in target
        forwards of one; None keeps the `node_cost` or `draft_cost` knob."""
        self.verify_curve, self.proposal_costs = verify_curve, proposal_costs

    def draft_cost(self, i: int, ctx: DraftContext) -> float:
        """What member i's proposal this step costs, in target forwards (0 for a model-free member): with
        measured prices, its catching up on the tokens committed while it sat out counts too."""
        member = self.members[i]
        if member.model is None:
            return 0.0
        budget = min(self.controllers[i].budget(), ctx.budget)
        if self.proposal_costs is not None and self.proposal_costs[i] is not None:
            return self.proposal_costs[i](budget, self.backlog[i])
        return self.combine.draft_cost * (1 if member.parallel_draft else budget)

    def _draft_cost(self, drafted: list[bool], ctx: DraftContext) -> float:
        """What the step's drafting cost, in target forwards."""
        return sum(self.draft_cost(i, ctx) for i, done in enumerate(drafted) if done)

    def _pays(self, ctx: DraftContext, trees: list[DraftTree | None], free: float, free_nodes: int) -> set[int]:
        """The cost router: the model members worth drafting, given the model-free members' proposals
        (already in `trees`; the best of them is expected to bring `free` tokens with `free_nodes` nodes): the
        one whose (1 + expected accepted tokens) / (draft cost + verify cost) is best, where it beats
        (1 + free) / (the verify of free_nodes); without a model-free member, the best always (each would
        draft every step alone).
        A position's verify cost counts: on a CPU a large tree (EAGLE's) costs more to verify than its extra
        accepted tokens bring. Costs are the cost model's prices scaled by what steps of each kind took in
        this run (`seconds_per_forward`): a member that drafts now and then finds its weights out of the
        CPU's caches, and its steps take longer than the same step timed alone."""
        model = [i for i, t in enumerate(trees) if t is None]
        if any(self.gains[i] is None for i in model):  # one never measured: all draft, to learn it
            return set(model)

        held = self.held
        values = {}
        for i in model:
            nodes = max(self.sizes[i] or 0, free_nodes)  # its tree and the model-free one, merged, at the least
            cost = (self.draft_cost(i, ctx) + self.verify_cost(nodes)) * self.seconds_per_forward(i)
            typical = self.typical[i]
            mean, both = self.paired.get((i, held), (0.0, 0))
            if held in model and i != held and both >= PAIRED:
                typical = self.typical[held] + mean
            lately = self.beside.get((i, self._free_bin), self.gains[i])
            values[i] = (1 + max(typical, free)) / cost, (1 + max(lately, free)) / cost
        best = max(values, key=lambda i: values[i][0], default=None)
        margin = 1 + self.combine.switch_margin
        if best is not None and held in values and values[best][0] <= values[held][0] * margin:
            best = held  # hysteresis: noise in the running estimates must not flip the choice step to step
        alone = (1 + free) / (self.verify_cost(free_nodes) * self.seconds_per_forward(-1))
        if best is None or (len(model) < len(trees) and values[best][1] <= alone):
            return set()
        self.held = best
        return {best}  # among model members alone the best always drafts, as it would alone

    def _free(self, trees: list[DraftTree | None]) -> tuple[float, int]:
        """The best model-free proposal's expected accepted tokens and its nodes (0, 0 without one)."""
        return max(((sum(self.calibration.tree_estimates(i, t)), len(t))
                    for i, t in enumerate(trees) if t is not None), default=(0.0, 0))

    def seconds_per_forward(self, kind: int) -> float:
        """What a priced target forward took in this run's steps of a kind (the model member that drafted,
        -1: none): their seconds over their priced forwards; another kind's where this one has no step yet."""
        measured = {k: seconds / forwards for k, (seconds, forwards, _) in self.step_time.items() if forwards > 0}
        if kind in measured:
            return measured[kind]
        return sum(measured.values()) / len(measured) if measured else 1.0

    def _explore_floor(self, i: int, ctx: DraftContext) -> float:
        """The idle steps between member i's explorations that keep them to EXPLORE_SHARE of the run's time:
        what its drafting adds to a step (its proposal, its nodes' verify), in the run's mean steps."""
        seconds, _, steps = map(sum, zip(*self.step_time.values())) if self.step_time else (0.0, 0.0, 0.0)
        if not steps:
            return 0.0
        added = self.draft_cost(i, ctx) + self.verify_cost(self.sizes[i] or 0) - self.verify_cost(0)
        return added * self.seconds_per_forward(i) / (EXPLORE_SHARE * seconds / steps)

    def _route(self, ctx: DraftContext) -> list[DraftTree | None]:
        """Route mode: each member's tree, None for one that does not draft this step. A member left out
        explores (drafts anyway, to keep its estimates current) after `wait` idle steps: `explore`, or as
        many as keep its explorations to EXPLORE_SHARE of the run's time where that is more (EAGLE's tree
        costs the embedded model two steps of suffix decoding, DSpark's chain a third of a step of DFlash's),
        up to MAX_WAIT."""
        n = len(self.members)
        trees: list[DraftTree | None] = [None] * n
        if self.combine.router == "entropy":
            chosen = set(range(1, n)) if self.uncertain else {0}
        else:
            trees = [self._draft(i, ctx) if m.model is None else None for i, m in enumerate(self.members)]
            free, free_nodes = self._free(trees)
            if len(trees) > trees.count(None):
                self._free_bin = free_bin(free)
            chosen = {i for i, t in enumerate(trees) if t is not None} | self._pays(ctx, trees, free, free_nodes)
        for i in range(n):
            exploring = i not in chosen and self.idle[i] + 1 >= self.wait[i]
            if exploring:
                self.wait[i] = min(max(self.combine.explore, round(self._explore_floor(i, ctx))), MAX_WAIT)
            self.gap[i] = self.idle[i] + 1  # steps since it last drafted, where it drafts now
            self.idle[i] = 0 if i in chosen or exploring else self.idle[i] + 1
            if trees[i] is None and self.idle[i] == 0:
                trees[i] = self._draft(i, ctx)
        return trees

    def _cut(self, trees: list[DraftTree], draft_cost: float = 0.0) -> list[tuple[DraftTree, list[int]]]:
        """The deterministic trees cut together to the budget, a tree drawn from the rng whole: each tree as
        verified, and its nodes' indices there (-1: cut). The cost router also cuts below the budget, to the
        nodes that pay for their verify (`paying_size`, by CUT_MARGIN), the step's `draft_cost` already spent."""
        out = [(tree, list(range(len(tree)))) for tree in trees]
        fixed = [i for i, t in enumerate(trees) if not sampled(t)]
        merged, maps = merge_trees([trees[i] for i in fixed])
        budget = self.combine.budget or max((len(trees[i]) for i in fixed), default=0)
        priced = self.combine.routes and self.combine.router == "cost"
        if not self.combine.cuts or (len(merged) <= budget and not priced):
            return out
        estimates = [0.0] * len(merged)
        for i, where in zip(fixed, maps):
            for node, est in zip(where, self.calibration.tree_estimates(i, trees[i])):
                estimates[node] = max(estimates[node], est)
        order, ranks = ranked(merged, estimates)
        size = min(budget, len(order))
        if priced:
            drawn = sum(len(t) for i, t in enumerate(trees) if i not in fixed)  # verified whatever the cut
            size = paying_size(ranks[:size], lambda k: draft_cost + self.verify_cost(drawn + k), CUT_MARGIN)
        keep = first_kept(order, size, len(merged))
        for i, where in zip(fixed, maps):
            out[i] = subtree(trees[i], [keep[node] for node in where])
        return out

    def propose(self, ctx: DraftContext) -> DraftTree:
        self._began, self._free_bin = self.clock(), None
        drafted = (self._route(ctx) if self.combine.routes
                   else [self._draft(i, ctx) for i in range(len(self.members))])
        trees = [t if t is not None else DraftTree() for t in drafted]
        draft_cost = self._draft_cost([t is not None for t in drafted], ctx)
        verified = self._cut(trees, draft_cost)
        merged, maps = merge_trees([tree for tree, _ in verified])
        self._priced = draft_cost + self.verify_cost(len(merged))
        # each member's own nodes -> merged node, through the cut (-1: cut)
        wheres = [[where[n] if n >= 0 else -1 for n in new] for (_, new), where in zip(verified, maps)]
        self._last = (trees, wheres, [t is not None for t in drafted])
        return merged

    def observe(self, outcome: StepOutcome) -> None:
        paths = [member_path(outcome.path, where) for where in self._last[1]]  # each member's share of it
        for i, (member, ctrl, tree, path, drafted) in enumerate(zip(self.members, self.controllers, self._last[0],
                                                                    paths, self._last[2])):
            member.observe(StepOutcome(tree, path, outcome.bonus, outcome.committed,
                                       self._hidden_for(i, outcome.hidden), outcome.logits))
            if drafted:
                ctrl.update(max(tree.depths(), default=0), len(path))
            self.backlog[i] = (0 if drafted else self.backlog[i]) + len(outcome.committed)
        self._learn(outcome, [len(path) for path in paths])
        self._time_step()

    def _drafted_models(self) -> list[int]:
        """The members with a network that drafted the last step."""
        return [i for i, drafted in enumerate(self._last[2]) if drafted and self.members[i].model is not None]

    def _time_step(self) -> None:
        """The step's wall time and priced forwards, by its kind (`seconds_per_forward`): the model member that
        drafted, or the one that explored beside the one chosen (what its steps cost is what its explorations
        show, cold weights and catching up included); none, -1. The first step, where every member drafts,
        is no kind's."""
        drafted = self._drafted_models()
        model = drafted if len(drafted) == 1 else [i for i in drafted if i != self.held]
        if len(model) > 1:
            return
        sums = self.step_time.setdefault(model[0] if model else -1, [0.0, 0.0, 0.0])
        for k, value in enumerate((self.clock() - self._began, self._priced, 1.0)):
            sums[k] = (1 - TYPICAL_RATE) * sums[k] + value

    def _learn(self, outcome: StepOutcome, own: list[int]) -> None:
        """What the combination decides by, from the step's outcome (`own`: each member's accepted tokens, the
        part of the accepted path it proposed): the calibration, each drafting member's running accepted
        tokens (alone, beside the model-free proposal, against another model member), the entropy router's
        state."""
        accepted = set(outcome.path)
        model = self._drafted_models()
        for i, j in ((i, j) for i in model for j in model if i != j):
            mean, n = self.paired.get((i, j), (0.0, 0))
            rate = max(1 / (n + 1), TYPICAL_RATE)
            self.paired[(i, j)] = [(1 - rate) * mean + rate * (own[i] - own[j]), n + 1]
        for i, (tree, where, drafted) in enumerate(zip(*self._last)):
            if not drafted:
                continue
            self.calibration.record(i, tree, [w >= 0 for w in where], {n for n, w in enumerate(where) if w in accepted})
            self.sizes[i] = len(tree)
            # the mean of its first drafts, then running means over the run's steps, so that a draft after a
            # long idle stretch (an exploration) outweighs what the member brought long ago
            self.counted[i] += 1
            for means, per_step in ((self.gains, RECENT_RATE), (self.typical, TYPICAL_RATE)):
                rate = max(1 / self.counted[i], 1 - (1 - per_step) ** self.gap[i])
                means[i] = (1 - rate) * (means[i] or 0.0) + rate * own[i]
            if i in model and self._free_bin is not None:
                key = (i, self._free_bin)
                self.beside[key] = (1 - RECENT_RATE) * self.beside.get(key, own[i]) + RECENT_RATE * own[i]
        if outcome.logits is not None and self.combine.router == "entropy":
            h = float(entropy(outcome.logits))
            self.uncertain = h > self.combine.entropy_high or (self.uncertain and h >= self.combine.entropy_low)

    def state_bytes(self) -> int:
        return sum(member.state_bytes() for member in self.members)
