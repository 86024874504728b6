"""Logits processing shared by the target and every drafter, so that p and q match exactly, and the
one source of randomness of a decode."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Probabilities after temperature, top-k and top-p, over the last dimension, in float32."""
        logits = logits.float() / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            drop_sorted = cumulative - sorted_logits.softmax(-1) >= self.top_p  # always keeps the top token
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits.softmax(-1)


class Rng:
    """Every random choice of one decode: the drafters' draws and the verifier's coins.

    Drafters and the verifier draw only through this object, so a test can substitute one that
    enumerates every outcome with its probability and compute an output distribution exactly.
    """

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def draw(self, probs: torch.Tensor) -> int:
        """One token from a distribution over the last dimension (1D)."""
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def draw_rows(self, probs: torch.Tensor) -> torch.Tensor:
        """One token from each row of a 2D tensor of distributions, independently."""
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]

    def accept(self, probability: float) -> bool:
        """True with the given probability."""
        return float(torch.rand((), generator=self.generator)) < probability


def seeded(seed: int, device: torch.device) -> Rng:
    return Rng(torch.Generator(device=device).manual_seed(seed))
