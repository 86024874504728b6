"""Draft token trees: a chain is a tree of width 1.

Nodes are stored in topological order (a parent comes before its children). Node i's parent is
`parents[i]`, -1 meaning the root: the last committed token, whose KV is not in the cache yet.

Each row (0 the root, i + 1 node i) keeps the *trials* of its children in the order the sampling
verifier tries them, fixed when the tree is built, before any draw is looked at: recursive
rejection sampling is exact only if that order does not depend on the values drawn. A trial names
the child node, the drafter that proposed it, the distribution q its token was drawn from and how
it was drawn among its siblings (`Draw`). A node several drafters proposed (a merged trie) has one
trial per proposer; greedy verification only looks at the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch


class Draw(str, Enum):
    """How a drafter picked a set of sibling tokens under one parent."""

    DETERMINISTIC = "deterministic"  # argmax / top-k: q is a point mass on the token
    INDEPENDENT = "independent"  # each drawn from its q independently of its siblings (with replacement)
    WITHOUT_REPLACEMENT = "without_replacement"  # drawn one after another from q renormalised without the earlier ones


@dataclass(frozen=True)
class Trial:
    node: int  # the child node tried
    drafter: str
    q: torch.Tensor | None  # the distribution the token was drawn from; None when deterministic
    draw: Draw


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    trials: list[list[Trial]] = field(default_factory=lambda: [[]])  # per row: its children's trials, in order
    # per node, its drafter's own estimate that the target accepts it (a path probability, a confidence, a
    # match's statistics), which a combination calibrates and ranks by; empty where the drafter states none
    scores: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add_node(self, token: int, parent: int) -> int:
        """A node with no trial yet (a merged trie adds its trials separately)."""
        self.tokens.append(token)
        self.parents.append(parent)
        self.trials.append([])
        return len(self.tokens) - 1

    def add(self, token: int, parent: int, drafter: str, q: torch.Tensor | None = None,
            draw: Draw | None = None) -> int:
        """A node and its one trial, tried after the siblings added before it.

        `draw` defaults to DETERMINISTIC without q and INDEPENDENT with one. WITHOUT_REPLACEMENT
        siblings of one drafter share one q, in the order they were drawn, and are distinct.
        """
        draw = draw or (Draw.DETERMINISTIC if q is None else Draw.INDEPENDENT)
        if (q is None) != (draw is Draw.DETERMINISTIC):
            raise ValueError(f"a {draw.value} draft needs {'no q' if q is None else 'its q'}")
        node = self.add_node(token, parent)
        self.trials[parent + 1].append(Trial(node, drafter, q, draw))
        return node

    @classmethod
    def chain(cls, tokens: list[int], drafter: str, qs: list[torch.Tensor | None] | None = None) -> DraftTree:
        tree = cls()
        for i, token in enumerate(tokens):
            tree.add(token, i - 1, drafter, qs[i] if qs else None)
        return tree

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of each node; the root's children are at depth 1."""
        depth: list[int] = []
        for p in self.parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth

    def children(self) -> list[list[int]]:
        """Children of each row (0 the root, i + 1 node i), in the order they were added."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return kids


def ancestor_matrix(tree: DraftTree) -> torch.Tensor:
    """(N+1, N+1) bool: row r sees column c when c is r itself or one of its ancestors (row 0 = root)."""
    n = len(tree) + 1
    seen = torch.zeros(n, n, dtype=torch.bool)
    seen[0, 0] = True
    for i, p in enumerate(tree.parents):
        seen[i + 1] = seen[p + 1]
        seen[i + 1, i + 1] = True
    return seen


def tree_attention_mask(tree: DraftTree, cached: int, dtype: torch.dtype, device: torch.device,
                        window: int | None = None) -> torch.Tensor:
    """Additive 4D mask (1, 1, N+1, cached+N+1): 0 where visible, the dtype's minimum where not.

    Row r (the root, then each node) sees the cached context and its own ancestors; with a sliding
    `window`, only keys at positions p > position(r) - window, as transformers' sliding masks do.
    """
    seen = ancestor_matrix(tree).to(device)
    visible = torch.cat([torch.ones(seen.shape[0], cached, dtype=torch.bool, device=device), seen], dim=1)
    if window:
        depth = torch.tensor([0] + tree.depths(), device=device)
        query = cached + depth
        key = torch.cat([torch.arange(cached, device=device), query])
        visible &= key[None, :] > query[:, None] - window
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]
