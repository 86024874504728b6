"""Combinations `a+b[+c]`: the members' proposals merge into one trie verified in one target forward.

The trie is keyed by the full path from the root (SpecInfer's merged token tree): a token several
members proposed is verified once, in one target forward. For sampling, every member's trials are
kept, each with its proposer's q and draw, in an order fixed before anything is drawn (members in
their canonical order, each member's candidates in its own order), so the verification stays
exact (decoding/verify.py). Each member keeps its own controller and learns from its own view of
the outcome: its own tree and the part of the accepted path that it proposed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from specbench.decoding.drafting import Controller, DraftContext, Drafter, StepOutcome
from specbench.decoding.tree import DraftTree


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


def member_path(path: list[int], where: list[int]) -> list[int]:
    """The accepted path in a member's own node indices: the prefix of it that the member proposed."""
    own = {merged: i for i, merged in enumerate(where)}
    out = []
    for node in path:
        if node not in own:
            break
        out.append(own[node])
    return out


class CombinedDrafter(Drafter):
    options = None  # each member has its own

    def __init__(self, members: list[Drafter], new_controllers: list[Callable[[], Controller]]):
        self._members = members
        self.new_controllers = new_controllers
        self.controllers: list[Controller] = []
        self.name = "+".join(m.name for m in members)
        self.hidden_layers = tuple(sorted({layer for m in members for layer in m.hidden_layers}))
        self._layer_picks = [[self.hidden_layers.index(layer) for layer in m.hidden_layers] for m in members]
        self._last: tuple[list[DraftTree], list[list[int]]] = ([], [])

    @property
    def members(self) -> list[Drafter]:
        return self._members

    def _hidden_for(self, i: int, hidden: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(hidden[j] for j in self._layer_picks[i])

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        self.controllers = [new() for new in self.new_controllers]
        for i, member in enumerate(self.members):
            member.start(prompt, self._hidden_for(i, hidden))

    def propose(self, ctx: DraftContext) -> DraftTree:
        trees = [member.propose(DraftContext(ctx.tokens, min(ctrl.budget(), ctx.budget), ctx.sampling,
                                             ctx.rng, ctrl))
                 for member, ctrl in zip(self.members, self.controllers)]
        merged, maps = merge_trees(trees)
        self._last = (trees, maps)
        return merged

    def observe(self, outcome: StepOutcome) -> None:
        for i, (member, ctrl, tree, where) in enumerate(zip(self.members, self.controllers, *self._last)):
            path = member_path(outcome.path, where)
            member.observe(StepOutcome(tree, path, outcome.bonus, outcome.committed,
                                       self._hidden_for(i, outcome.hidden)))
            ctrl.update(max(tree.depths(), default=0), len(path))

    def state_bytes(self) -> int:
        return sum(member.state_bytes() for member in self.members)
