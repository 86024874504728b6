"""Acceptance rules: which path of a verified draft tree the target keeps, and its bonus token.

`logits` has one row per tree position: row 0 is the root (the last committed token) and row i + 1
is node i; row r holds the target's logits for the token that follows position r.
"""

from __future__ import annotations

import torch

from specbench.engine.sampling import Sampling, sample, uniform
from specbench.engine.tree import DraftTree


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Follow the child whose token is the target's argmax at its parent."""
    best = logits.argmax(-1).tolist()
    children = tree.children()
    path: list[int] = []
    row = 0
    while True:
        nxt = next((c for c in children[row] if tree.tokens[c] == best[row]), None)
        if nxt is None:
            return path, best[row]
        path.append(nxt)
        row = nxt + 1


def accept_sampling(tree: DraftTree, logits: torch.Tensor, sampling: Sampling,
                    generator: torch.Generator | None) -> tuple[list[int], int]:
    """Lossless multi-candidate speculative sampling (Leviathan et al.; SpecInfer for trees).

    At a node with target distribution p, each child is tried once per drafter that proposed it:
    a token x drawn from q is accepted with probability min(1, p(x) / q(x)), and on rejection
    p <- norm(max(0, p - q)); a deterministic proposal (q = delta) is accepted with probability
    p(x), and on rejection p(x) <- 0. If no child is accepted, the bonus is sampled from p.
    """
    children = tree.children()
    path: list[int] = []
    row = 0
    while True:
        p = sampling.probs(logits[row])
        accepted = None
        for child in children[row]:
            x = tree.tokens[child]
            for _, q in tree.proposals[child]:
                if q is None:
                    if uniform(generator) < p[x]:
                        accepted = child
                        break
                    p = p.clone()
                    p[x] = 0.0
                else:
                    if uniform(generator) * q[x] < p[x]:
                        accepted = child
                        break
                    p = (p - q).clamp_min(0.0)
                p = p / p.sum()
            if accepted is not None:
                break
        if accepted is None:
            return path, sample(p, generator)
        path.append(accepted)
        row = accepted + 1
