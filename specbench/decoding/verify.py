"""Acceptance rules: which path of a verified draft tree the target keeps, and its bonus token.

`logits` has one row per tree position: row 0 is the root (the last committed token) and row i + 1
is node i; row r holds the target's logits for the token that follows position r.
"""

from __future__ import annotations

import torch

from specbench.decoding.sampling import Rng, Sampling
from specbench.decoding.tree import DraftTree, Draw, Trial


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


def proposal(trial: Trial, token: int, drawn_before: list[int], vocab: int) -> torch.Tensor:
    """The distribution the trial's token was drawn from, given the tokens its drafter drew before it
    without replacement under the same parent."""
    if trial.q is None:
        return torch.nn.functional.one_hot(torch.tensor(token), vocab).float()
    if trial.draw is Draw.WITHOUT_REPLACEMENT and drawn_before:
        q = trial.q.float().clone()
        q[drawn_before] = 0.0
        return q / q.sum()
    return trial.q.float()


def accept_sampling(tree: DraftTree, logits: torch.Tensor, sampling: Sampling, rng: Rng) -> tuple[list[int], int]:
    """Lossless multi-candidate speculative sampling (Leviathan et al.; SpecInfer and Sequoia for trees).

    At a row with target distribution p, the trials are taken in their fixed order. A token x
    drawn from q is accepted with probability min(1, p(x) / q(x)); on rejection
    p <- norm(max(0, p - q)) and the next trial is taken. A deterministic token has q = a point
    mass (so a rejection zeroes p(x)); a token drawn without replacement has q renormalised
    without its drafter's earlier draws there. When no trial is accepted the bonus token is drawn
    from p. Each step keeps the output distributed as the target's, provided every trial's token
    is, given the trials before it, distributed as its q: which the fixed order guarantees.
    """
    path: list[int] = []
    row = 0
    while True:
        p = sampling.probs(logits[row])
        drawn: dict[str, list[int]] = {}  # per drafter: tokens drawn without replacement at this row so far
        accepted = None
        for trial in tree.trials[row]:
            x = tree.tokens[trial.node]
            earlier = drawn.setdefault(trial.drafter, []) if trial.draw is Draw.WITHOUT_REPLACEMENT else []
            q = proposal(trial, x, earlier, p.shape[-1])
            if q[x] <= 0:
                raise ValueError(f"{trial.drafter} proposed token {x}, which its own q gives probability 0")
            earlier.append(x)
            if rng.accept(min(1.0, float(p[x] / q[x]))):
                accepted = trial.node
                break
            residual = (p - q).clamp_min(0.0)
            total = residual.sum()
            p = residual / total if total > 0 else p  # total 0 means p == q: a rejection of probability 0
        if accepted is None:
            return path, rng.draw(p)
        path.append(accepted)
        row = accepted + 1
