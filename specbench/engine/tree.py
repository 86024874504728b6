"""Draft token trees: a chain is a tree of width 1.

Nodes are stored in topological order (a parent comes before its children, children in the order
they are tried). Node i's parent is `parents[i]`, -1 meaning the root: the last committed token,
whose KV is not in the cache yet. Each node keeps one entry per drafter that proposed it:
(drafter name, q), where q is the distribution the token was drawn from, or None when the
drafter picked it deterministically (argmax / top-k).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

Proposal = tuple[str, "torch.Tensor | None"]


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    proposals: list[list[Proposal]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, drafter: str, q: torch.Tensor | None = None) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.proposals.append([(drafter, q)])
        return len(self.tokens) - 1

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
        """Children of each node, index 0 standing for the root and i + 1 for node i."""
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


def tree_attention_mask(tree: DraftTree, cached: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive 4D mask (1, 1, N+1, cached+N+1): 0 where visible, the dtype's minimum where not."""
    seen = ancestor_matrix(tree).to(device)
    visible = torch.cat([torch.ones(seen.shape[0], cached, dtype=torch.bool, device=device), seen], dim=1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]
