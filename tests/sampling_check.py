"""Exactness of speculative sampling: the empirical distribution of generated tokens against the
target's exact distribution, with a chi-square test at a fixed seed."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy.stats import chisquare

from specbench.engine.decode import generate
from specbench.engine.sampling import Sampling


def exact_pair_distribution(model, prompt: list[int], sampling: Sampling) -> dict[tuple[int, int], float]:
    """P(first two generated tokens) under plain sampling from the target, computed exactly."""
    vocab = model.config.vocab_size
    with torch.no_grad():
        first = sampling.probs(model(input_ids=torch.tensor([prompt])).logits[0, -1])
        batch = torch.tensor([prompt + [t] for t in range(vocab)])
        second = sampling.probs(model(input_ids=batch).logits[:, -1])
    joint = first[:, None] * second
    return {(a, b): float(joint[a, b]) for a, b in itertools.product(range(vocab), repeat=2)}


def chi_square_pvalue(model, prompt: list[int], sampling: Sampling, runs: int, make_strategy) -> float:
    """Sample `runs` two-token continuations with `make_strategy()` -> (drafter, controller)."""
    exact = exact_pair_distribution(model, prompt, sampling)
    counts = dict.fromkeys(exact, 0)
    for seed in range(runs):
        drafter, controller = make_strategy()
        tokens = generate(model, prompt, 2, sampling, drafter=drafter, controller=controller, seed=seed).tokens
        counts[tuple(tokens)] += 1
    # pool rare cells so every expected count is >= 5, as the test requires
    keys = sorted(exact, key=exact.get, reverse=True)
    observed, expected, pool_o, pool_e = [], [], 0, 0.0
    for k in keys:
        if exact[k] * runs >= 5:
            observed.append(counts[k])
            expected.append(exact[k] * runs)
        else:
            pool_o += counts[k]
            pool_e += exact[k] * runs
    if pool_e > 0:
        observed.append(pool_o)
        expected.append(pool_e)
    elif pool_o:  # a continuation the target gives probability 0 (top-k / top-p) was generated
        return 0.0
    expected = np.array(expected) * runs / sum(expected)
    return float(chisquare(observed, expected).pvalue)
