"""Combinations `a+b[+c]`: the members' proposals merge into one trie verified in one target forward.

The trie is keyed by the full path from the root (SpecInfer's merged token tree); a node that
several members proposed keeps every member's (name, q), so sampling verification tries it once
per proposer and stays exact. Each member keeps its own controller and learns from its own view
of the outcome: its own tree and the part of the accepted path that it proposed.
"""

from __future__ import annotations

from typing import Callable

import torch

from specbench.engine.protocol import Controller, DraftContext, Drafter, StepOutcome
from specbench.engine.tree import DraftTree


def merge_trees(trees: list[DraftTree]) -> tuple[DraftTree, list[list[int]]]:
    """One trie from several trees, and for each tree the merged index of each of its nodes."""
    merged = DraftTree()
    by_path: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    maps = []
    for tree in trees:
        where: list[int] = []
        for token, parent, proposals in zip(tree.tokens, tree.parents, tree.proposals):
            key = (where[parent] if parent >= 0 else -1, token)
            if key in by_path:
                merged.proposals[by_path[key]].extend(proposals)
            else:
                by_path[key] = len(merged)
                merged.tokens.append(token)
                merged.parents.append(key[0])
                merged.proposals.append(list(proposals))
            where.append(by_path[key])
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


class CombinedDrafter:
    def __init__(self, members: list[Drafter], new_controllers: list[Callable[[], Controller]]):
        self.members = members
        self.new_controllers = new_controllers
        self.controllers: list[Controller] = []
        self.name = "+".join(m.name for m in members)
        self.hidden_layers = tuple(sorted({layer for m in members for layer in m.hidden_layers}))
        self._layer_picks = [[self.hidden_layers.index(layer) for layer in m.hidden_layers] for m in members]
        self._last: tuple[list[DraftTree], list[list[int]]] = ([], [])

    def _hidden_for(self, i: int, hidden: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(hidden[j] for j in self._layer_picks[i])

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        self.controllers = [new() for new in self.new_controllers]
        for i, member in enumerate(self.members):
            member.start(prompt, self._hidden_for(i, hidden))

    def propose(self, ctx: DraftContext) -> DraftTree:
        trees = [member.propose(DraftContext(ctx.tokens, min(ctrl.budget(), ctx.budget), ctx.sampling,
                                             ctx.generator, ctrl))
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
