"""Logits processing shared by the target and every drafter, so that p and q match exactly."""

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


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator))
