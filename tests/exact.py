"""Exact output distributions of one speculative step, by enumerating every random outcome.

`EnumeratingRng` stands in for the engine's `Rng`: it follows a script of choices and records the
probability of the path it took. `enumerate_outcomes` runs a step once per leaf of the tree of
random choices (drafters' draws and the verifier's coins), so the distribution it returns is exact
up to float rounding, unlike a chi-square test, which misses errors below a few percent.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch


class EnumeratingRng:
    def __init__(self, script: list[int]):
        self.script = script
        self.choices: list[int] = []  # the choice taken at each random call
        self.widths: list[int] = []  # how many options each call had
        self.probability = 1.0

    def _choose(self, options: list[tuple[object, float]]):
        i = self.script[len(self.choices)] if len(self.choices) < len(self.script) else 0
        self.choices.append(i)
        self.widths.append(len(options))
        value, weight = options[i]
        self.probability *= weight
        return value

    def draw(self, probs: torch.Tensor) -> int:
        p = probs.double() / probs.double().sum()
        return self._choose([(int(t), float(p[t])) for t in torch.nonzero(p > 0).flatten()])

    def draw_rows(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.tensor([self.draw(row) for row in probs], device=probs.device)

    def accept(self, probability: float) -> bool:
        if probability >= 1.0:
            return True
        if probability <= 0.0:
            return False
        return self._choose([(True, probability), (False, 1.0 - probability)])


def enumerate_outcomes(run: Callable[[EnumeratingRng], object]) -> dict[object, float]:
    """{outcome: probability} over every leaf of the random choices `run(rng)` makes (outcomes hashable)."""
    dist: dict[object, float] = defaultdict(float)
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        rng = EnumeratingRng(script)
        dist[run(rng)] += rng.probability
        for position in range(len(script), len(rng.choices)):
            stack += [rng.choices[:position] + [alt] for alt in range(1, rng.widths[position])]
    return dict(dist)


def first_two(committed: dict[tuple[int, ...], float], next_probs: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """Joint distribution (V, V) of the first two tokens: a step that commits one token is completed by
    the target's own distribution of the next (`next_probs(token)`), as the next exact step would."""
    vocab = len(next_probs(0))
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    for tokens, probability in committed.items():
        if len(tokens) >= 2:
            joint[tokens[0], tokens[1]] += probability
        else:
            joint[tokens[0]] += probability * next_probs(tokens[0]).double()
    return joint
